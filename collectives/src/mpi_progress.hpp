// Private: the thread that owns MPI for the whole process (see mpi_backend.hpp for the
// design). Every MPI call Strata makes after initialization runs on it.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/mpi_backend.hpp"
#include "strata/core/event.hpp"
#include "mpi_watchdog.hpp"

namespace strata::coll::detail {
// MPI_Error_string of code.
std::string mpi_error_string(int code);
}  // namespace strata::coll::detail

// Fatal MPI failures (setup, teardown): abort naming the call, where, and the rank.
// Failures of collectives are recoverable and come back through their events instead.
STRATA_DEFINE_CALL_CHECK(check_mpi_call, "MPI", int, code == MPI_SUCCESS,
                         ::strata::coll::detail::mpi_error_string(static_cast<int>(code)))
#define STRATA_CHECK_MPI(expr) ::strata::detail::check_mpi_call((expr), #expr, __FILE__, __LINE__)

namespace strata::coll::detail {

// Describes an operation for error messages, formatted only when one is needed.
struct OpDesc {
  const char* call = "";  // the MPI function: "MPI_Iallgather"
  const char* op = "";    // the collective: "all_gather"
  size_t count = 0;       // elements
  DataType dtype = DataType::U8;
};

class MpiProgress {
 public:
  struct World {
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
  };

  // A unit of work for the MPI thread. `post` runs there, after `after` completes and
  // after every earlier op with the same `order` key has been posted. It starts the
  // operation and returns an MPI error code, leaving in *req a request to drive to
  // completion, or MPI_REQUEST_NULL when the work is already done.
  struct Op {
    uint64_t order = 0;
    OpDesc desc;
    std::function<int(MPI_Request*)> post;
    Event after;
    size_t bytes = 0;  // bytes this rank moves, roughly; sets how long to poll hot
  };

  // Starts MPI on first use; throws Unavailable when it cannot be used.
  static MpiProgress& instance();
  ~MpiProgress();

  Event submit(Op op);
  uint64_t new_order_key();  // one per communicator

  const World& world() const { return world_; }
  const MpiInfo& info() const { return info_; }
  MPI_Datatype datatype(DataType t) const;
  MPI_Op reduce_op(ReduceOp op, DataType t) const;

 private:
  MpiProgress();
  struct Pending {
    Op op;
    std::shared_ptr<HostEvent> done;
  };
  struct Active {
    std::shared_ptr<HostEvent> done;
    OpDesc desc;
    std::exception_ptr dependency_error;
    size_t bytes;
    WatchedOp watched;
  };

  void thread_main();
  void init_mpi();
  void finalize_mpi();
  bool post_ready(std::deque<Pending>& pending, std::vector<MPI_Request>& reqs, std::vector<Active>& active);
  bool test_active(std::vector<MPI_Request>& reqs, std::vector<Active>& active);
  // The watchdog's turn, when the thread is not busy: answers the other ranks' queries
  // and checks the collective waited in longest against the timeout.
  void watch(const std::vector<Active>& active);
  void wake();
  std::exception_ptr error_for(const OpDesc& d, int code) const;

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> incoming_;  // guarded by mu_
  bool kick_ = false;             // guarded by mu_: a dependency completed
  bool stop_ = false;             // guarded by mu_
  bool init_done_ = false;        // guarded by mu_
  std::exception_ptr init_error_;  // guarded by mu_
  uint64_t next_order_ = 1;       // guarded by mu_; 0 is for setup work on MPI_COMM_WORLD

  World world_;
  MpiInfo info_;
  MPI_Datatype bf16_ = MPI_DATATYPE_NULL, fp16_ = MPI_DATATYPE_NULL;
  MPI_Op sum16_ = MPI_OP_NULL, max16_ = MPI_OP_NULL;
  MpiWatchdog watchdog_;  // used on the MPI thread only
};

}  // namespace strata::coll::detail
