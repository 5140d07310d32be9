// The cuda backend (run on an H100 and an H200; docs/training.md lists the tests that passed).
// Device memory comes from cudaMalloc (memory/DeviceArena takes one region up front
// and sub-allocates it, which is the caching allocator), pinned memory is registered
// with cudaHostRegister, streams and events are CUDA streams and events.
#include <cuda.h>  // the stream memory operations' types, reached through cudaGetDriverEntryPointByVersion
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "host_memory.hpp"
#include "strata/core/clock.hpp"
#include "strata/core/device.hpp"
#include "strata/core/device_wait.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/math/half.hpp"

STRATA_DEFINE_CALL_CHECK(check_cuda_call, "cuda", cudaError_t, code == cudaSuccess,
                         cudaGetErrorString(code))
#define STRATA_CHECK_CUDA(expr) ::strata::detail::check_cuda_call((expr), #expr, __FILE__, __LINE__)

namespace strata {

namespace {

// What the host callback that CudaStream::record() enqueues right after an event hands
// that event: the errors of the stream's host tasks before it. Shared, not the event
// itself, so the callback never holds the last reference to a CudaEvent (its destructor
// would call cudaEventDestroy inside a host callback, where CUDA calls are not allowed).
struct EventSettlement {
  std::mutex mu;
  std::condition_variable cv;
  bool settled = false;  // the callback has run
  std::exception_ptr error;
  void settle(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(e);
      settled = true;
    }
    cv.notify_all();
  }
};

class CudaEvent final : public detail::EventImpl {
 public:
  explicit CudaEvent(cudaStream_t s) : settlement_(std::make_shared<EventSettlement>()) {
    STRATA_CHECK_CUDA(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
    STRATA_CHECK_CUDA(cudaEventRecord(ev_, s));
  }
  ~CudaEvent() override { cudaEventDestroy(ev_); }
  // The callback runs after the cudaEvent completes (the event is recorded before it, so
  // that GPU-side waiters never depend on a host callback), so a host wait must also
  // wait for the callback, or an error it hands over would be missed.
  void wait() override {
    STRATA_CHECK_CUDA(cudaEventSynchronize(ev_));
    std::unique_lock<std::mutex> lock(settlement_->mu);
    settlement_->cv.wait(lock, [&] { return settlement_->settled; });
    if (settlement_->error) std::rethrow_exception(settlement_->error);
  }
  bool ready() override {
    if (cudaEventQuery(ev_) != cudaSuccess) return false;
    std::lock_guard<std::mutex> lock(settlement_->mu);
    return settlement_->settled;
  }
  void* cuda_event_handle() override { return ev_; }
  const std::shared_ptr<EventSettlement>& settlement() const { return settlement_; }

 private:
  cudaEvent_t ev_{};
  std::shared_ptr<EventSettlement> settlement_;
};

// The errors of a stream's host tasks (and of the host events it waited for) since its
// last record(), which that record's event is handed. Shared: a host event's completion
// may report into it from another thread.
struct ErrorSink {
  std::mutex mu;
  std::exception_ptr error;
  void keep(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
  std::exception_ptr take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(error, nullptr);
  }
};

struct HostCall {
  std::function<void()> fn;
  ErrorSink* sink;
};

void CUDART_CB run_host_call(void* arg) {
  auto* call = static_cast<HostCall*>(arg);
  try {
    call->fn();
  } catch (...) {
    call->sink->keep(std::current_exception());
  }
  delete call;
}

// A stream told to wait for a host event (an I/O completion, an MPI or staged
// collective) waits on the GPU: cuStreamWaitValue32 on a 32-bit word of host-mapped
// pinned memory, which the event's completing thread then writes. Not in a host callback
// that blocks until the event completes: CUDA runs every stream's host callbacks on one
// thread, and a stream cannot pass a host callback that has not run, so one blocked
// callback stalls each stream with a callback queued (every record() queues one), and
// the thread that would complete the event may be waiting for one of those streams:
// two ranks on one GPU under the staged communicator hung in their first step on an H200
// (2026-11-27) that way.
//
// A slot is taken per wait and given back when its event has completed and written it.
// Each wait's value is the slot's last one plus 1, and CU_STREAM_WAIT_VALUE_GEQ compares
// (int32_t)(*addr - value) >= 0, so values wrap safely: a slot is written in the order of
// its waits, never reused before its event completed.
//
// CUDA puts the streams of a context on a few hardware work queues, round-robin
// (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), and work on one queue runs in the order it
// was issued, whatever its stream. A stream held on the GPU by such a wait then also holds
// the later work of every stream that shares its queue, and where that work is what
// completes the host event (the staged communicator's copies, whose completion lets the
// collective finish), nothing moves again: cuStreamWaitValue32's documentation warns that
// an order CUDA cannot see may be serialised wrongly. That is the suspected cause (not
// yet confirmed on a GPU: Device.AStreamWaitingForAHostEventHoldsNoOtherStream is the
// check) of two ranks on one H100 hanging in their first step (2026-11-28,
// scripts/gpu-check.sh rankshang: in each rank the main thread and the staged
// communicator's worker waited on CUDA events, nothing on MPI). A training process keeps
// fewer than 32 streams, so 32 queues (CUDA's most) give each its own: set before any
// CUDA context exists, when libstrata is loaded, unless the user set it.
const bool kOwnQueuePerStream = [] {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  return true;
}();

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// STRATA_CUDA_HOST_EVENT_WAIT (device_wait.hpp): "host" makes the thread that orders a
// stream after a host event wait for it itself, so no GPU queue is ever held by a wait;
// it exists to tell, on a GPU, whether a hang is the GPU-side wait's. Read once, when the
// first cuda device is made. An event made with HostEvent::DeviceWait::Host (the staged
// communicator's) is always waited for so: its completion needs this process's own GPU
// copies, issued after the wait, which a held queue could hold too.
HostEventWait host_event_wait_mode() {
  static const HostEventWait mode = parse_host_event_wait(std::getenv("STRATA_CUDA_HOST_EVENT_WAIT"));
  return mode;
}

WaitValue32Fn stream_wait_value_fn() {
  static const WaitValue32Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &f, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<WaitValue32Fn>(f);
  }();
  return fn;
}

class HostFlagPool {
 public:
  ~HostFlagPool() {
    for (void* p : pages_) cudaFreeHost(p);
  }
  // A free slot and its device address; allocates a page of them when none is free.
  // The first take allocates kFirstPages pages at once, while no stream waits yet: a
  // pinned allocation is the one CUDA call here that might wait for the device.
  uint32_t* take(CUdeviceptr* device_address) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      const size_t n = pages_.empty() ? kFirstPages * kPage : kPage;
      void* page = nullptr;
      STRATA_CHECK_CUDA(cudaHostAlloc(&page, n * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
      pages_.push_back(page);
      auto* words = static_cast<uint32_t*>(page);
      for (size_t i = 0; i < n; ++i) {
        words[i] = 0;
        free_.push_back(words + i);
      }
    }
    uint32_t* slot = free_.back();
    free_.pop_back();
    void* d = nullptr;
    STRATA_CHECK_CUDA(cudaHostGetDevicePointer(&d, slot, 0));
    *device_address = reinterpret_cast<CUdeviceptr>(d);
    return slot;
  }
  void give(uint32_t* slot) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
  }

 private:
  static constexpr size_t kPage = 1024;
  static constexpr size_t kFirstPages = 4;
  std::mutex mu_;
  std::vector<uint32_t*> free_;
  std::vector<void*> pages_;
};

// 16-bit values travel as their bits; the conversions are core/math/half.hpp's, the
// same as the host's.
struct F32T {
  using Bits = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
struct Bf16T {
  using Bits = uint16_t;
  __device__ static float load(uint16_t v) { return math::bf16_to_float(v); }
  __device__ static uint16_t store(float v) { return math::float_to_bf16(v); }
};
struct Fp16T {
  using Bits = uint16_t;
  __device__ static float load(uint16_t v) { return math::fp16_to_float(v); }
  __device__ static uint16_t store(float v) { return math::float_to_fp16(v); }
};

#define STRATA_GRID_LOOP(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)

template <class T>
__global__ void fill_kernel(typename T::Bits* dst, float v, size_t n) {
  const auto bits = T::store(v);
  STRATA_GRID_LOOP(i, n) dst[i] = bits;
}
template <class S>
__global__ void accumulate_kernel(float* dst, const typename S::Bits* src, size_t n) {
  STRATA_GRID_LOOP(i, n) dst[i] += S::load(src[i]);
}
template <class D, class S>
__global__ void convert_kernel(typename D::Bits* dst, const typename S::Bits* src, size_t n) {
  STRATA_GRID_LOOP(i, n) dst[i] = D::store(S::load(src[i]));
}
// One block-level partial sum per block, added atomically into a device double.
template <class S>
__global__ void sum_squares_kernel(const typename S::Bits* src, size_t n, double* out) {
  __shared__ double partial[256];
  double acc = 0;
  STRATA_GRID_LOOP(i, n) {
    const double v = S::load(src[i]);
    acc += v * v;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

// The engine's GPU optimizer: one thread per element, math::adam_update (the _rn
// intrinsics keep nvcc from contracting), so the bits are CpuAdam's. H is the working
// copy's tag, or void for none.
template <class G, class H>
__global__ void adam_kernel(AdamStepArgs a) {
  const auto* grad = static_cast<const typename G::Bits*>(a.grad);
  STRATA_GRID_LOOP(i, a.n) {
    float p = a.p_in[i], m = a.m_in[i], v = a.v_in[i];
    const float g = math::adam_scaled_grad(G::load(grad[i]), a.grad_scale);
    math::adam_update(a.s, p, g, m, v);
    a.p_out[i] = p;
    a.m_out[i] = m;
    a.v_out[i] = v;
    if constexpr (!std::is_void_v<H>) static_cast<typename H::Bits*>(a.half_out)[i] = H::store(p);
  }
}

// Calls f(T{}) with T the element-type tag of t.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(F32T{}); return;
    case DType::BF16: f(Bf16T{}); return;
    case DType::F16: f(Fp16T{}); return;
    default: throw Error(std::string("cuda stream: element type ") + to_string(t) + " is not f32, bf16 or fp16");
  }
}

unsigned grid_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096)); }

class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, std::string name, std::shared_ptr<HostFlagPool> flags)
      : ordinal_(ordinal), name_(std::move(name)), flags_(std::move(flags)) {
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    STRATA_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    // sum_squares_as's result: a device double and its pinned host copy (pageable memory
    // would make the copy, and so the call, wait for the stream), one pair per stream,
    // taken here rather than on the first call (no allocation on the hot path).
    void* d = nullptr;
    void* h = nullptr;
    STRATA_CHECK_CUDA(cudaMalloc(&d, sizeof(double)));
    STRATA_CHECK_CUDA(cudaMallocHost(&h, sizeof(double)));
    dev_sum_ = static_cast<double*>(d);
    host_sum_ = static_cast<double*>(h);
  }
  ~CudaStream() override {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
    cudaFree(dev_sum_);
    cudaFreeHost(host_sum_);
  }
  void copy_async(void* dst, const void* src, size_t bytes) override {
    STRATA_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s_));
  }
  void host_task(std::function<void()> fn) override {
    auto* call = new HostCall{std::move(fn), sink_.get()};
    STRATA_CHECK_CUDA(cudaLaunchHostFunc(s_, run_host_call, call));
  }
  // The typed ops launch kernels, which go to the calling thread's current device: a
  // thread other than the one that made this stream (the engine's reduce thread, say)
  // may have another GPU current, so each op selects this stream's first, as the NCCL
  // communicator does (a cheap call when it already is).
  void fill_as(void* dst, DType t, float value, size_t n) override {
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    with_type(t, [&](auto T) {
      using Tag = decltype(T);
      if (n) fill_kernel<Tag><<<grid_for(n), 256, 0, s_>>>(static_cast<typename Tag::Bits*>(dst), value, n);
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
  }
  void accumulate(float* dst, const void* src, DType src_t, size_t n) override {
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    with_type(src_t, [&](auto S) {
      using Tag = decltype(S);
      if (n) accumulate_kernel<Tag><<<grid_for(n), 256, 0, s_>>>(dst, static_cast<const typename Tag::Bits*>(src), n);
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
  }
  void convert(void* dst, DType dst_t, const void* src, DType src_t, size_t n) override {
    if (dst_t == src_t) {
      with_type(dst_t, [](auto) {});  // refuses non-float types
      copy_async(dst, src, n * dtype_size(dst_t));
      return;
    }
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    with_type(dst_t, [&](auto D) {
      with_type(src_t, [&](auto S) {
        using DT = decltype(D);
        using ST = decltype(S);
        if (n)
          convert_kernel<DT, ST><<<grid_for(n), 256, 0, s_>>>(static_cast<typename DT::Bits*>(dst),
                                                              static_cast<const typename ST::Bits*>(src), n);
      });
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
  }
  void sum_squares_as(const void* src, DType t, size_t n, double* out) override {
    // Reduce into the device double, copy it to the pinned host double and add it to the
    // host total in a host callback. One pair per stream serves every call: stream order
    // puts each call's memset after the previous call's callback has read the result.
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    STRATA_CHECK_CUDA(cudaMemsetAsync(dev_sum_, 0, sizeof(double), s_));
    with_type(t, [&](auto S) {
      using Tag = decltype(S);
      if (n) sum_squares_kernel<Tag><<<grid_for(n), 256, 0, s_>>>(static_cast<const typename Tag::Bits*>(src), n, dev_sum_);
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
    STRATA_CHECK_CUDA(cudaMemcpyAsync(host_sum_, dev_sum_, sizeof(double), cudaMemcpyDeviceToHost, s_));
    host_task([host = host_sum_, out] { *out += *host; });
  }
  void adam_step(const AdamStepArgs& a) override {
    if (a.half_t != DType::F32 && a.half_t != DType::BF16 && a.half_t != DType::F16)
      throw Error(std::string("adam_step: working-copy type ") + to_string(a.half_t) + " is not bf16 or fp16");
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    // 1024 blocks of 256 threads: the elements of a sub-group (millions) a few per thread.
    const unsigned grid = static_cast<unsigned>(std::min<size_t>((a.n + 255) / 256, 1024));
    with_type(a.grad_t, [&](auto G) {
      using GT = decltype(G);
      if (!a.n) return;
      if (a.half_t == DType::BF16)
        adam_kernel<GT, Bf16T><<<grid, 256, 0, s_>>>(a);
      else if (a.half_t == DType::F16)
        adam_kernel<GT, Fp16T><<<grid, 256, 0, s_>>>(a);
      else
        adam_kernel<GT, void><<<grid, 256, 0, s_>>>(a);
    });
    STRATA_CHECK_CUDA(cudaGetLastError());
  }
  // The model's kernels enqueue themselves; fn is called here, in stream order of issue.
  void compute(double, std::function<void()> fn) override { fn(); }
  void wait(const Event& e) override { wait_for(e, false); }
  Event record() override {
    auto ev = std::make_shared<CudaEvent>(s_);
    // Errors raised by host tasks before this point are handed to this event.
    host_task([sink = sink_.get(), settlement = ev->settlement()] { settlement->settle(sink->take()); });
    return Event(ev);
  }
  void synchronize() override { record().wait(); }
  const std::string& name() const override { return name_; }

 private:
  int ordinal_;
  std::string name_;
  cudaStream_t s_{};
  std::shared_ptr<HostFlagPool> flags_;
  std::shared_ptr<ErrorSink> sink_ = std::make_shared<ErrorSink>();
  double* dev_sum_ = nullptr;   // sum_squares_as: device accumulator
  double* host_sum_ = nullptr;  // and its pinned host copy

  // CUDA events are waited on by the GPU; host events (I/O completions, MPI and staged
  // collectives) too, on a host-mapped word their completion writes (HostFlagPool).
  // Composite events (when_all, when_done) are taken apart first. A fence part
  // (when_done) orders only: its error is not this stream's.
  void wait_for(const Event& e, bool fence) {
    detail::EventImpl* impl = e.impl();
    if (impl == nullptr) return;
    // A CUDA stream's event or an NCCL collective's (nccl_communicator.cpp): the GPU waits.
    if (void* native = impl->cuda_event_handle()) {
      STRATA_CHECK_CUDA(cudaStreamWaitEvent(s_, static_cast<cudaEvent_t>(native), 0));
      return;
    }
    if (impl->for_each_part([&](Event& part, bool part_fence) { wait_for(part, fence || part_fence); })) return;
    if (auto* host = dynamic_cast<HostEvent*>(impl)) {
      if (host_event_wait_mode() == HostEventWait::Host || host->device_wait() == HostEvent::DeviceWait::Host) {
        // Its error goes to the stream in stream order, so that the next record() (and
        // not one issued before this wait) hands it on.
        std::exception_ptr err = e.result();
        if (err && !fence) host_task([sink = sink_, err] { sink->keep(err); });
        return;
      }
      if (WaitValue32Fn wait_value = stream_wait_value_fn()) {
        CUdeviceptr address = 0;
        uint32_t* slot = flags_->take(&address);
        const uint32_t value = __atomic_load_n(slot, __ATOMIC_RELAXED) + 1;
        STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
        const CUresult rc = wait_value(s_, address, value, CU_STREAM_WAIT_VALUE_GEQ);
        if (rc != CUDA_SUCCESS) {
          flags_->give(slot);
          throw Error("cuda stream " + name_ + ": cuStreamWaitValue32 failed (CUresult " + std::to_string(rc) +
                      ") while ordering the stream after a host event");
        }
        // Runs on the completing thread, or here when it has completed already.
        host->then([flags = flags_, sink = sink_, slot, value, fence](std::exception_ptr err) {
          if (err && !fence) sink->keep(std::move(err));
          __atomic_store_n(slot, value, __ATOMIC_RELEASE);
          flags->give(slot);
        });
        return;
      }
      log::warn_once("cuda-wait-value",
                     "cuda: this driver has no cuStreamWaitValue32; streams wait for host events in a blocking host "
                     "callback, which can stall other streams (ranks sharing a GPU may hang)");
    }
    if (fence)
      host_task([e] { (void)e.result(); });
    else
      host_task([e] { e.wait(); });
  }
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    (void)host_event_wait_mode();  // a bad STRATA_CUDA_HOST_EVENT_WAIT fails here, before any work
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    STRATA_CHECK_CUDA(cudaGetDeviceProperties(&props_, ordinal_));
  }
  Backend backend() const override { return Backend::Cuda; }
  bool host_addressable() const override { return false; }
  std::string description() const override {
    return std::string("cuda:") + std::to_string(ordinal_) + " " + props_.name;
  }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    STRATA_CHECK_CUDA(cudaSetDevice(ordinal_));
    cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw OutOfBudget("cuda device " + std::to_string(ordinal_) + ": cudaMalloc of " +
                        format_bytes(bytes) + " failed: " + cudaGetErrorString(rc) +
                        "; lower strata.device_budget");
    }
    return p;
  }
  void deallocate(void* p, size_t) override {
    if (p) cudaFree(p);
  }
  bool register_host(void* p, size_t bytes) override {
    cudaError_t rc = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return true;
  }
  void unregister_host(void* p) override { cudaHostUnregister(p); }
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CudaStream>(ordinal_, name, flags_);
  }
  int numa_node() const override {
    int node = -1;
#if CUDART_VERSION >= 12000
    if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, ordinal_) != cudaSuccess) {
      cudaGetLastError();
      node = -1;
    }
#endif
    return node;
  }
  double now() const override { return steady_seconds(); }
  // NUMA-placed, locked pages; register_host (cudaHostRegister) then pins them for DMA.
  void* allocate_host(size_t bytes, int node, bool lock, bool* locked) override {
    return detail::map_host_memory(bytes, node, lock, locked);
  }
  void deallocate_host(void* p, size_t bytes) override { detail::unmap_host_memory(p, bytes); }
  void host_compute(double, const std::function<void()>& fn) override { fn(); }

 private:
  std::shared_ptr<HostFlagPool> flags_ = std::make_shared<HostFlagPool>();  // its streams' waits for host events
  int ordinal_;
  cudaDeviceProp props_{};
};

}  // namespace

bool cuda_device_present(std::string* reason) {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess || n == 0) {
    if (reason)
      *reason = rc != cudaSuccess ? std::string("no usable GPU: ") + cudaGetErrorString(rc)
                                  : std::string("no GPU present");
    cudaGetLastError();
    return false;
  }
  return true;
}

// device_wait.cpp: the GPU side of a CUDA event, without its settling host callback.
void cuda_event_synchronize(void* event) {
  STRATA_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

// device.cpp's record_cuda_event: a stream that runs no host tasks of ours has no errors
// to hand its events, so the event is settled when made.
Event cuda_stream_event(void* stream) {
  auto ev = std::make_shared<CudaEvent>(static_cast<cudaStream_t>(stream));
  ev->settlement()->settle(nullptr);
  return Event(ev);
}

void cuda_profiler_capture(bool on) {
  if (on) {
    STRATA_CHECK_CUDA(cudaProfilerStart());
    return;
  }
  STRATA_CHECK_CUDA(cudaDeviceSynchronize());  // what was issued inside the capture ends inside it
  STRATA_CHECK_CUDA(cudaProfilerStop());
}

int cuda_visible_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (ordinal < 0 || ordinal >= n) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw Unavailable("cuda device " + std::to_string(ordinal) + " does not exist: " + std::to_string(n) +
                      " GPU(s) visible" + (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "") +
                      ". Each rank uses the GPU of its local rank on its host: start at most " + std::to_string(n) +
                      " ranks per host");
  }
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace strata
