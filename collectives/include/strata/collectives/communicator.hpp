// Communicator: the one interface for collectives between ranks. Backends: `self` (one
// process, no launcher), `mpi` (host buffers, mpi_backend.hpp), `nccl` (device buffers,
// nccl.hpp), `staged` (device buffers through pinned host memory and a host
// communicator, for ranks that share a GPU; staged.hpp) and `sim` (simulated time, no
// data; sim_communicator.hpp). Callers never
// branch on which one they hold, so the engine runs the same code in one process, under
// mpirun, on GPUs and in simulation.
//
// Every operation is asynchronous: it returns a strata::Event that completes when the
// result is in place, or fails with a CollectiveError (or with the error of the
// `after` event it was told to follow). Until then the buffers belong to the
// communicator: do not free, read (recv) or write them.
//
// Ordering contract, as in MPI and NCCL: every rank calls the collectives of one
// communicator in the same order. Operations are started in call order; an
// operation given `after` starts only once `after` completes, and operations called
// later on the same communicator wait behind it (so that call order stays the order on
// the wire). If `after` fails, the operation still runs on this rank, so that the
// other ranks do not hang, and its event fails with that error.
//
// Buffers are typed views (ConstView, MutView) made from a std::span<T> or a
// contiguous container of a type with a DataType (dtype.hpp); counts are elements of
// that type, never bytes. Calls whose buffers cannot work on this rank (sizes that do
// not match the world size, mixed types, a bad root, overlapping buffers) throw
// CollectiveUsageError before anything is started. If only some ranks make such a
// call, the others will wait for them: treat it as fatal.
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>

#include "strata/collectives/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/event.hpp"

namespace strata::coll {

enum class ReduceOp { Sum, Max };
const char* to_string(ReduceOp op);

enum class CommBackend { Self, Mpi, Nccl, Staged, Sim };
const char* to_string(CommBackend b);

// Buffers that cannot work were passed to a collective. Thrown by the call itself.
class CollectiveUsageError : public Error {
 public:
  using Error::Error;
};

// A collective failed inside its library (an MPI or NCCL error code), delivered
// through the operation's event. The message names the library call, the operation,
// the rank and the code.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& call, const std::string& op, int rank, int world, long code,
                  const std::string& detail);
  long code() const { return code_; }
  int rank() const { return rank_; }

 private:
  long code_;
  int rank_;
};

namespace detail {
template <class R>
concept ElementRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                       std::ranges::borrowed_range<R> && Element<std::ranges::range_value_t<R>>;
template <class R>
concept MutableElementRange =
    ElementRange<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;
}  // namespace detail

// A read-only buffer of `count` elements of `dtype`.
// Made from a span or an lvalue container (a temporary would die before the
// operation completes, so rvalue containers do not convert).
class ConstView {
 public:
  template <detail::ElementRange R>
  ConstView(R&& r)  // NOLINT: implicit on purpose, so spans and vectors pass directly
      : data_(std::ranges::data(r)),
        count_(std::ranges::size(r)),
        dtype_(dtype_v<std::ranges::range_value_t<R>>) {}
  // For callers that know the type only at run time (a tensor record's dtype).
  static ConstView elements(const void* data, size_t count, DataType dtype) {
    return ConstView(data, count, dtype);
  }
  const void* data() const { return data_; }
  size_t count() const { return count_; }
  DataType dtype() const { return dtype_; }
  size_t bytes() const { return count_ * size_of(dtype_); }

 private:
  ConstView(const void* d, size_t n, DataType t) : data_(d), count_(n), dtype_(t) {}
  const void* data_;
  size_t count_;
  DataType dtype_;
};

// A writable buffer of `count` elements of `dtype`.
class MutView {
 public:
  template <detail::MutableElementRange R>
  MutView(R&& r)  // NOLINT: implicit on purpose
      : data_(std::ranges::data(r)),
        count_(std::ranges::size(r)),
        dtype_(dtype_v<std::ranges::range_value_t<R>>) {}
  static MutView elements(void* data, size_t count, DataType dtype) { return MutView(data, count, dtype); }
  void* data() const { return data_; }
  size_t count() const { return count_; }
  DataType dtype() const { return dtype_; }
  size_t bytes() const { return count_ * size_of(dtype_); }
  operator ConstView() const { return ConstView::elements(data_, count_, dtype_); }

 private:
  MutView(void* d, size_t n, DataType t) : data_(d), count_(n), dtype_(t) {}
  void* data_;
  size_t count_;
  DataType dtype_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;  // waits for this communicator's operations
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }              // world size
  int local_rank() const { return local_rank_; }  // rank among the processes on this host
  int local_size() const { return local_size_; }
  CommBackend backend() const { return backend_; }

  // recv[r*n .. r*n+n) = send of rank r, with n = send.count(); recv.count() must be
  // n * size(). In place when send is exactly recv's slice for this rank.
  Event all_gather(ConstView send, MutView recv, Event after = {});
  // recv = slice rank() of the element-wise reduction of every rank's send;
  // send.count() must be recv.count() * size(). Buffers must not overlap.
  Event reduce_scatter(ConstView send, MutView recv, ReduceOp op = ReduceOp::Sum, Event after = {});
  // recv[r*n .. r*n+n) = send[rank()*n .. rank()*n+n) of rank r, with n = send.count() /
  // size(): each rank's send holds one part for every rank, and its recv one part from
  // every rank. Counts equal, a multiple of size(); buffers must not overlap. The mpi,
  // self, sim, staged and nccl (grouped send/recv) backends implement it.
  Event all_to_all(ConstView send, MutView recv, Event after = {});
  // recv = element-wise reduction of every rank's send; counts equal. In place when
  // send and recv are the same buffer.
  Event all_reduce(ConstView send, MutView recv, ReduceOp op = ReduceOp::Sum, Event after = {});
  Event all_reduce(MutView buf, ReduceOp op = ReduceOp::Sum, Event after = {});
  // buf on every rank = buf of rank `root`.
  Event broadcast(MutView buf, int root, Event after = {});
  // Completes once every rank has called barrier.
  Event barrier(Event after = {});

 protected:
  struct Shape {
    int rank = 0;
    int size = 1;
    int local_rank = 0;
    int local_size = 1;
    CommBackend backend = CommBackend::Self;
  };
  explicit Communicator(const Shape& s)
      : rank_(s.rank), size_(s.size), local_rank_(s.local_rank), local_size_(s.local_size), backend_(s.backend) {}

  // Backends implement these; arguments are already checked. Counts are elements:
  // `count` is per rank for all_gather (send) and reduce_scatter (recv).
  // all_gather is in place when send == recv + rank*count elements; all_reduce and
  // broadcast when send == recv.
  virtual Event do_all_gather(const void* send, void* recv, size_t count, DataType t, Event after) = 0;
  virtual Event do_reduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                                  Event after) = 0;
  virtual Event do_all_reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                              Event after) = 0;
  virtual Event do_broadcast(void* buf, size_t count, DataType t, int root, Event after) = 0;
  virtual Event do_barrier(Event after) = 0;
  // `count`: elements per part (send and recv hold size() parts each).
  virtual Event do_all_to_all(const void* send, void* recv, size_t count, DataType t, Event after) = 0;

  // "all_gather on rank 1 of 4: " — the start of every message about this communicator.
  std::string where(const char* op) const;

 private:
  int rank_, size_, local_rank_, local_size_;
  CommBackend backend_;
};

// The collective watchdog (the mpi backend; the self and sim backends cannot stall, and
// NCCL's device-side collectives are not watched). When one of this process's collectives
// has waited longer than the timeout for the other ranks, the rank asks every other rank
// where it is, prints which collective (operation, size, its number on which
// communicator), how long it waited and which ranks have not arrived (and which did not
// answer at all: stopped, hung or gone), and exits the process with
// kCollectiveTimeoutExitCode. Checkpoints already saved stay complete (they are renamed
// into place whole). Seconds; 0 turns the watchdog off. Process-wide; the default is
// kDefaultCollectiveTimeout (DeepSpeed's default process-group timeout).
inline constexpr double kDefaultCollectiveTimeout = 1800;
inline constexpr int kCollectiveTimeoutExitCode = 6;
void set_collective_timeout(double seconds);
double collective_timeout();

// Which host backend make_host_communicator builds.
enum class HostBackend {
  Auto,  // Mpi when a launcher started this process (or MPI is already initialized), else Self
  Self,  // one process: every collective is a local copy
  Mpi,   // MPI, initialized on first use; without a launcher this is an MPI singleton
};

// A communicator over all processes of the job, for host buffers. The first Mpi one
// initializes MPI (on a progress thread that owns it) and sets strata::process_rank;
// MPI stays up until the process exits. Throws Unavailable when MPI cannot be used.
std::unique_ptr<Communicator> make_host_communicator(HostBackend which = HostBackend::Auto);

// The environment variable by which a launcher (mpirun, srun, hydra) told this process
// it is one of a job ("OMPI_COMM_WORLD_SIZE", ...), or "" when none is set.
std::string detect_launcher();

}  // namespace strata::coll
