#include "strata/core/device_wait.hpp"

namespace strata {

#ifdef STRATA_HAVE_CUDA
void cuda_event_synchronize(void* event);  // cuda_device.cu
#endif

namespace {
void wait_part(const Event& e, bool fence) {
  detail::EventImpl* impl = e.impl();
  if (impl == nullptr) return;
#ifdef STRATA_HAVE_CUDA
  if (void* native = impl->cuda_event_handle()) {
    cuda_event_synchronize(native);
    return;
  }
#endif
  if (impl->for_each_part([&](Event& part, bool part_fence) { wait_part(part, fence || part_fence); })) return;
  if (fence)
    (void)e.result();
  else
    e.wait();
}
}  // namespace

void wait_device_work(const Event& e) { wait_part(e, false); }

}  // namespace strata
