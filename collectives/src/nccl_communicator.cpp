// The nccl backend (see nccl.hpp). NOTE: compiled and linked in CI; it has not yet run
// on a GPU.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/collectives/nccl.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"

STRATA_DEFINE_CALL_CHECK(check_nccl_call, "NCCL", ncclResult_t, code == ncclSuccess, ncclGetErrorString(code))
#define STRATA_CHECK_NCCL(expr) ::strata::detail::check_nccl_call((expr), #expr, __FILE__, __LINE__)
STRATA_DEFINE_CALL_CHECK(check_cuda_call_in_nccl_backend, "cuda", cudaError_t, code == cudaSuccess,
                         cudaGetErrorString(code))
#define STRATA_CHECK_CUDA_NCCL(expr) \
  ::strata::detail::check_cuda_call_in_nccl_backend((expr), #expr, __FILE__, __LINE__)

namespace strata::coll {

namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::U8: return ncclUint8;
    case DataType::I32: return ncclInt32;
    case DataType::I64: return ncclInt64;
    case DataType::F16: return ncclFloat16;
    case DataType::BF16: return ncclBfloat16;
    case DataType::F32: return ncclFloat32;
    case DataType::F64: return ncclFloat64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

// What events and the communicator share: destroyed when the last of them goes.
struct NcclState {
  int ordinal = 0;
  int rank = 0, size = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* barrier_word = nullptr;  // one int32 on the device, for barrier()
  ~NcclState() {
    if (stream) cudaStreamSynchronize(stream);
    if (comm) ncclCommDestroy(comm);
    if (barrier_word) cudaFree(barrier_word);
    if (stream) cudaStreamDestroy(stream);
  }
};

// Completes when the GPU passes the point recorded after an operation. Waiting polls
// ncclCommGetAsyncError too, so a failed or vanished peer surfaces as an error.
class NcclEvent final : public ::strata::detail::EventImpl {
 public:
  // `gpu_deps`: the events the stream waited for on the GPU before the operation; their
  // errors (a core stream's host tasks) are this event's, seen when it is waited for.
  NcclEvent(std::shared_ptr<NcclState> st, const char* op, std::exception_ptr dep_error, std::vector<Event> gpu_deps)
      : st_(std::move(st)), op_(op), dep_error_(dep_error), gpu_deps_(std::move(gpu_deps)) {
    STRATA_CHECK_CUDA_NCCL(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
    STRATA_CHECK_CUDA_NCCL(cudaEventRecord(ev_, st_->stream));
  }
  ~NcclEvent() override { cudaEventDestroy(ev_); }

  void wait() override {
    auto sleep = std::chrono::microseconds(2);
    while (!poll()) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(200));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_) std::rethrow_exception(error_);
      if (dep_error_) std::rethrow_exception(dep_error_);
    }
    for (const Event& d : gpu_deps_)
      if (std::exception_ptr e = d.result()) std::rethrow_exception(e);
  }
  bool ready() override { return poll(); }
  cudaEvent_t handle() const { return ev_; }
  // Core's CUDA streams wait for it on the GPU: NcclEvent::wait polls NCCL and sleeps,
  // which a host callback must not do.
  void* cuda_event_handle() override { return ev_; }
  const NcclState* state() const { return st_.get(); }

 private:
  bool poll() {
    cudaError_t rc = cudaEventQuery(ev_);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) {
      fail(CollectiveError("cudaEventQuery", op_, st_->rank, st_->size, rc, cudaGetErrorString(rc)));
      return true;
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(st_->comm, &async);
    if (q != ncclSuccess) async = q;
    if (async != ncclSuccess && async != ncclInProgress) {
      fail(CollectiveError("ncclCommGetAsyncError", op_, st_->rank, st_->size, async, ncclGetErrorString(async)));
      return true;
    }
    return false;
  }
  void fail(const CollectiveError& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::make_exception_ptr(e);
  }

  std::shared_ptr<NcclState> st_;
  const char* op_;
  cudaEvent_t ev_{};
  std::mutex mu_;
  std::exception_ptr error_;
  std::exception_ptr dep_error_;
  std::vector<Event> gpu_deps_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const Communicator& bootstrap, std::shared_ptr<NcclState> st)
      : Communicator(Shape{bootstrap.rank(), bootstrap.size(), bootstrap.local_rank(), bootstrap.local_size(),
                           CommBackend::Nccl}),
        st_(std::move(st)) {}
  ~NcclCommunicator() override { cudaStreamSynchronize(st_->stream); }

 protected:
  Event do_all_gather(const void* send, void* recv, size_t count, DataType t, Event after) override {
    return enqueue("all_gather", after, "ncclAllGather",
                   [&] { return ncclAllGather(send, recv, count, nccl_type(t), st_->comm, st_->stream); });
  }
  Event do_reduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                          Event after) override {
    return enqueue("reduce_scatter", after, "ncclReduceScatter", [&] {
      return ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), st_->comm, st_->stream);
    });
  }
  Event do_all_reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                      Event after) override {
    return enqueue("all_reduce", after, "ncclAllReduce", [&] {
      return ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), st_->comm, st_->stream);
    });
  }
  Event do_broadcast(void* buf, size_t count, DataType t, int root, Event after) override {
    return enqueue("broadcast", after, "ncclBroadcast",
                   [&] { return ncclBroadcast(buf, buf, count, nccl_type(t), root, st_->comm, st_->stream); });
  }
  Event do_all_to_all(const void* send, void* recv, size_t count, DataType t, Event after) override {
    // NCCL has no all-to-all: one send and one receive per rank, grouped into one launch.
    const size_t part = count * size_of(t);
    return enqueue("all_to_all", after, "ncclSend/ncclRecv", [&] {
      ncclResult_t rc = ncclGroupStart();
      for (int r = 0; r < size() && rc == ncclSuccess; ++r) {
        rc = ncclSend(static_cast<const char*>(send) + static_cast<size_t>(r) * part, count, nccl_type(t), r,
                      st_->comm, st_->stream);
        if (rc == ncclSuccess)
          rc = ncclRecv(static_cast<char*>(recv) + static_cast<size_t>(r) * part, count, nccl_type(t), r, st_->comm,
                        st_->stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return rc != ncclSuccess ? rc : end;
    });
  }
  Event do_barrier(Event after) override {
    // NCCL has no barrier: an all_reduce of one word completes only once every rank
    // has enqueued it.
    return enqueue("barrier", after, "ncclAllReduce", [&] {
      return ncclAllReduce(st_->barrier_word, st_->barrier_word, 1, ncclInt32, ncclSum, st_->comm, st_->stream);
    });
  }

 private:
  template <class Launch>
  Event enqueue(const char* op, const Event& after, const char* call, Launch launch) {
    STRATA_CHECK_CUDA_NCCL(cudaSetDevice(st_->ordinal));
    std::exception_ptr dep_error;
    std::vector<Event> gpu_deps;
    order_after(after, false, dep_error, gpu_deps);
    ncclResult_t rc = launch();
    auto ev = std::make_shared<NcclEvent>(st_, op, dep_error, std::move(gpu_deps));
    if (rc != ncclSuccess && rc != ncclInProgress) {
      auto [fail, host] = HostEvent::make();
      host->complete(std::make_exception_ptr(CollectiveError(call, op, rank(), size(), rc, ncclGetErrorString(rc))));
      return fail;
    }
    return Event(ev);
  }

  // Orders the communicator's stream after e (nccl.hpp): its CUDA events on the GPU, the
  // rest on this thread. A fence part (when_done) orders only: its error is not ours.
  void order_after(const Event& e, bool fence, std::exception_ptr& dep_error, std::vector<Event>& gpu_deps) {
    ::strata::detail::EventImpl* impl = e.impl();
    if (impl == nullptr) return;
    if (auto* mine = dynamic_cast<NcclEvent*>(impl); mine != nullptr && mine->state() == st_.get())
      return;  // same stream: already ordered after it
    if (void* native = impl->cuda_event_handle()) {
      STRATA_CHECK_CUDA_NCCL(cudaStreamWaitEvent(st_->stream, static_cast<cudaEvent_t>(native), 0));
      if (!fence) gpu_deps.push_back(e);
      return;
    }
    if (impl->for_each_part([&](Event& part, bool part_fence) {
          order_after(part, fence || part_fence, dep_error, gpu_deps);
        }))
      return;
    // A host event (I/O, MPI): wait here.
    std::exception_ptr err = e.result();
    if (err && !fence && !dep_error) dep_error = err;
  }

  std::shared_ptr<NcclState> st_;
};

}  // namespace

bool nccl_available(std::string* reason) { return cuda_available(reason); }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_ordinal) {
  std::string reason;
  if (!cuda_available(&reason)) throw Unavailable("nccl backend: " + reason);
  auto st = std::make_shared<NcclState>();
  st->ordinal = device_ordinal;
  st->rank = bootstrap.rank();
  st->size = bootstrap.size();
  STRATA_CHECK_CUDA_NCCL(cudaSetDevice(device_ordinal));

  ncclUniqueId id{};
  if (bootstrap.rank() == 0) STRATA_CHECK_NCCL(ncclGetUniqueId(&id));
  auto* id_bytes = reinterpret_cast<std::byte*>(&id);
  bootstrap.broadcast(std::span<std::byte>(id_bytes, sizeof id), 0).wait();

  STRATA_CHECK_NCCL(ncclCommInitRank(&st->comm, bootstrap.size(), id, bootstrap.rank()));
  STRATA_CHECK_CUDA_NCCL(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
  STRATA_CHECK_CUDA_NCCL(cudaMalloc(&st->barrier_word, sizeof(int32_t)));
  STRATA_CHECK_CUDA_NCCL(cudaMemsetAsync(st->barrier_word, 0, sizeof(int32_t), st->stream));

  return std::make_unique<NcclCommunicator>(bootstrap, std::move(st));
}

}  // namespace strata::coll
