#include "strata/core/device.hpp"

#include "strata/core/error.hpp"

namespace strata {

std::unique_ptr<Device> make_cpu_device();
std::unique_ptr<Stream> make_host_worker_stream(const std::string& name);
#ifdef STRATA_HAVE_CUDA
std::unique_ptr<Device> make_cuda_device(int ordinal);
bool cuda_device_present(std::string* reason);
int cuda_visible_device_count();
void cuda_profiler_capture(bool on);
Event cuda_stream_event(void* stream);  // cuda_device.cu
#endif

const char* to_string(Backend b) {
  switch (b) {
    case Backend::Cpu: return "cpu";
    case Backend::Cuda: return "cuda";
    case Backend::Sim: return "sim";
  }
  return "?";
}

Backend parse_backend(const std::string& name) {
  if (name == "cpu") return Backend::Cpu;
  if (name == "cuda") return Backend::Cuda;
  if (name == "sim") return Backend::Sim;
  throw ConfigError("unknown device backend '" + name + "': use one of cpu, cuda, sim");
}

std::unique_ptr<Stream> Device::create_host_stream(const std::string& name) { return make_host_worker_stream(name); }

bool cuda_available(std::string* reason) {
#ifdef STRATA_HAVE_CUDA
  return cuda_device_present(reason);
#else
  if (reason) *reason = "Strata was built without the cuda backend (no nvcc at configure time)";
  return false;
#endif
}

int cuda_device_count() {
#ifdef STRATA_HAVE_CUDA
  return cuda_visible_device_count();
#else
  return 0;
#endif
}

Event record_cuda_event(void* cuda_stream) {
#ifdef STRATA_HAVE_CUDA
  return cuda_stream_event(cuda_stream);
#else
  (void)cuda_stream;
  throw Unavailable("cuda events: Strata was built without CUDA; rebuild with nvcc on PATH (-DSTRATA_CUDA=ON)");
#endif
}

void cuda_profiler_range(bool start) {
#ifdef STRATA_HAVE_CUDA
  cuda_profiler_capture(start);
#else
  (void)start;
  throw Unavailable("cuda profiler capture: Strata was built without CUDA; rebuild with nvcc on PATH (-DSTRATA_CUDA=ON)");
#endif
}

std::unique_ptr<Device> make_device(const DeviceOptions& opts) {
  switch (opts.backend) {
    case Backend::Cpu: return make_cpu_device();
    case Backend::Cuda: {
#ifdef STRATA_HAVE_CUDA
      std::string why;
      if (!cuda_device_present(&why))
        throw Unavailable("cuda backend: " + why + "; run on a machine with an NVIDIA GPU and driver, or use the cpu "
                          "backend");
      return make_cuda_device(opts.ordinal);
#else
      throw Unavailable(
          "cuda backend: Strata was built without CUDA; rebuild with nvcc on PATH (-DSTRATA_CUDA=ON), or use the "
          "cpu backend");
#endif
    }
    case Backend::Sim: return make_sim_device(SimCostModel{});
  }
  throw Unavailable("unknown backend");
}

}  // namespace strata
