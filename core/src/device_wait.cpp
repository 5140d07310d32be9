#include "strata/core/device_wait.hpp"

#include <string>

#include "strata/core/error.hpp"

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

HostEventWait parse_host_event_wait(const char* value) {
  const std::string s = value ? value : "";
  if (s.empty() || s == "stream") return HostEventWait::Stream;
  if (s == "host") return HostEventWait::Host;
  throw Error("STRATA_CUDA_HOST_EVENT_WAIT is '" + s +
              "': use \"stream\" (the GPU waits, the default) or \"host\" (the issuing thread waits)");
}

}  // namespace strata
