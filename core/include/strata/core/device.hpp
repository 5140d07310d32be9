// The device interface: one small set of concepts (Device, Stream, Event) that the cpu,
// cuda and sim backends implement. Callers never branch on which backend they have, so
// the engine, the tiered store and their tests run the same code on all three.
//
//  - Device memory is raw bytes from the backend; budgets and sub-allocation live in
//    memory/ (DeviceArena), which asks for one region up front.
//  - A Stream is an in-order queue. Work enqueued on it runs after everything enqueued
//    before it, and after every event it was told to wait for.
//  - record() returns an Event that completes when the stream reaches that point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/event.hpp"
#include "strata/core/math/adam.hpp"
#include "strata/core/sim.hpp"

namespace strata {

enum class Backend { Cpu, Cuda, Sim };
const char* to_string(Backend b);
Backend parse_backend(const std::string& name);  // throws ConfigError naming the choices

// One Adam/AdamW step over n elements in this device's memory, for Stream::adam_step:
// the fp32 master weights and moments are read from the *_in arrays and the new ones
// written to the *_out arrays (each out array is its in array, or overlaps none of the
// arrays); the gradient, `grad_t` (F32, BF16 or F16), is widened and multiplied by
// grad_scale as it is read; when half_t is BF16 or F16, half_out receives the new weights
// rounded to it (F32: no such copy). The math is math::adam_update, which CpuAdam runs
// too: the bits agree with CpuAdam::step_into's on the same inputs.
struct AdamStepArgs {
  math::AdamStepScalars s{};
  const float* p_in = nullptr;
  const float* m_in = nullptr;
  const float* v_in = nullptr;
  const void* grad = nullptr;
  DType grad_t = DType::F32;
  float grad_scale = 1.0f;
  float* p_out = nullptr;
  float* m_out = nullptr;
  float* v_out = nullptr;
  void* half_out = nullptr;
  DType half_t = DType::F32;
  size_t n = 0;
};

// The host form (the cpu backend's stream runs it; tests compare it with CpuAdam).
void adam_step_host(const AdamStepArgs& a);

class Stream {
 public:
  virtual ~Stream() = default;
  // Copies bytes; both pointers may be device or host memory of this device's backend.
  virtual void copy_async(void* dst, const void* src, size_t bytes) = 0;
  // Runs fn on a host thread in stream order (cpu: the stream's worker; cuda: a host
  // callback). An exception thrown by fn (or by a failed event waited on) fails the
  // next event recorded on the stream, and only that one; the cpu backend skips the
  // work queued between the failure and that record point.
  virtual void host_task(std::function<void()> fn) = 0;
  // Element-wise operations on device memory, in stream order, over float arrays of type
  // F32, BF16 or F16 (conversions round to nearest even, core/convert.hpp). The engine's
  // gradient accumulation, norms and working copies use these; the model's kernels live
  // in model/.
  virtual void fill_as(void* dst, DType t, float value, size_t n) = 0;
  virtual void accumulate(float* dst, const void* src, DType src_t, size_t n) = 0;  // dst[i] += src[i]
  virtual void convert(void* dst, DType dst_t, const void* src, DType src_t, size_t n) = 0;
  // *out += sum of src[i]^2, accumulated in double; out is host memory, written when
  // the stream reaches this point. (sim: costs the read, leaves *out as it is.)
  virtual void sum_squares_as(const void* src, DType t, size_t n, double* out) = 0;
  // The optimizer on the device (the engine's GPU optimizer): AdamStepArgs, in stream order.
  // (sim: costs the bytes read and written.)
  virtual void adam_step(const AdamStepArgs& a) = 0;
  // The fp32 forms.
  void fill(float* dst, float value, size_t n) { fill_as(dst, DType::F32, value, n); }
  void add(float* dst, const float* src, size_t n) { accumulate(dst, src, DType::F32, n); }
  void sum_squares(const float* src, size_t n, double* out) { sum_squares_as(src, DType::F32, n, out); }
  // The model's kernels: work of `flops` floating-point operations, in stream order.
  // cpu: runs fn on the stream's worker; cuda: calls fn now, on the calling thread, to
  // enqueue its kernels; sim: takes flops over the device's peak, and fn does not run.
  virtual void compute(double flops, std::function<void()> fn) = 0;
  // Later work on this stream starts only after e completes.
  virtual void wait(const Event& e) = 0;
  virtual Event record() = 0;
  virtual void synchronize() = 0;
  virtual const std::string& name() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Backend backend() const = 0;
  virtual std::string description() const = 0;
  // True when host code may read and write this device's memory through its pointers
  // (cpu: it is host memory; sim: it has no bytes, and host work over it is only timed);
  // false on cuda, whose device memory only a stream's copies reach. The CPU optimizer
  // working on states in device memory needs it.
  virtual bool host_addressable() const = 0;
  // Raw device memory; throws OutOfBudget if the backend refuses.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  // Makes host memory [p, p+bytes) page-locked for fast copies, if the backend can.
  // Returns false (and the memory stays usable, just slower) when it cannot.
  virtual bool register_host(void* p, size_t bytes) = 0;
  virtual void unregister_host(void* p) = 0;
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  // A stream for host work only (host_task, wait, record, synchronize): its own worker
  // thread on cpu and cuda, so that long host work (the speculative CPU optimizer) runs
  // beside the calling thread and never in a CUDA callback, where it would hold up every
  // other stream's host callbacks; on sim, a stream of its own on the virtual clock.
  virtual std::unique_ptr<Stream> create_host_stream(const std::string& name);
  // NUMA node nearest this device, or -1 when unknown.
  virtual int numa_node() const = 0;

  // Seconds on this device's clock: steady time on cpu and cuda, the calling thread's
  // virtual now on sim. Engine timings and trace spans are in it.
  virtual double now() const = 0;
  // Host memory for the pinned tier: page-aligned, bound to numa_node (-1: the default
  // policy), and mlock'ed when `lock` is set. A refused lock falls back to unlocked memory
  // that is touched up front, with one warning; *locked says which it got.
  // Throws OutOfBudget when the memory cannot be had. (sim: address space only.)
  virtual void* allocate_host(size_t bytes, int numa_node, bool lock, bool* locked) = 0;
  virtual void deallocate_host(void* p, size_t bytes) = 0;
  // Host work over memory of this backend (the CPU optimizer, initialising shards),
  // touching about `bytes`: runs fn on the calling thread. The sim backend does not run
  // it (its memory has no bytes) and advances the calling thread's clock by bytes over
  // the host bandwidth instead.
  virtual void host_compute(double bytes, const std::function<void()>& fn) = 0;
  // The cost model that times every operation on the sim backend; null on backends that
  // run for real. Components with a simulated variant (the NVMe store) take it from here.
  virtual const SimCostModel* cost_model() const { return nullptr; }
};

struct DeviceOptions {
  Backend backend = Backend::Cpu;
  int ordinal = 0;  // which GPU, for cuda
};

// Creates a device; throws Unavailable when the backend is not built or no device exists.
// Backend::Sim gets the default cost model.
std::unique_ptr<Device> make_device(const DeviceOptions& opts);
// The sim backend with a given cost model (sim.hpp); throws ConfigError for a cost that
// is not positive. Starts a new simulation: every thread's virtual clock reads 0.
std::unique_ptr<Device> make_sim_device(const SimCostModel& cost);

// True when the cuda backend was compiled in and a GPU is present. reason explains a false.
bool cuda_available(std::string* reason);
// GPUs this process can see (CUDA_VISIBLE_DEVICES applies); 0 when the cuda backend is not
// built or none is present.
int cuda_device_count();
// An event that completes when `cuda_stream` (a cudaStream_t of the current device)
// reaches this point: a CUDA event recorded there. Work of another kind (a model's own
// stream) hands the engine such an event rather than synchronising; the engine's cuda
// streams wait for it on the GPU (cudaStreamWaitEvent), host waits block on it.
// Throws Unavailable when the cuda backend is not built, CudaError when CUDA refuses.
Event record_cuda_event(void* cuda_stream);
// Starts (true) or stops (false) CUDA's profiler capture (cudaProfilerStart / Stop): the
// GPU work in between is what `ncu --profile-from-start off` or `nsys profile
// --capture-range=cudaProfilerApi` records; with no profiler attached it records nothing.
// Stopping waits for all of the current GPU's work first, so what was issued inside ends
// inside.
// Throws Unavailable when the cuda backend is not built, CudaError when CUDA refuses.
void cuda_profiler_range(bool start);

}  // namespace strata
