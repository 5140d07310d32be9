// Private: the collective watchdog of the MPI progress thread (communicator.hpp says what
// it promises). Every call is made on the MPI thread.
//
// How a rank learns where the others are: each rank keeps one receive posted on a
// communicator of the watchdog's own (an MPI_Comm_dup of MPI_COMM_WORLD) and answers a
// query with how many collectives it has started on the communicator asked about and the
// collective it has waited in longest. A rank whose collective times out sends the query
// to every other rank, answers theirs meanwhile, and waits a grace period for the
// answers: a rank that answers has not arrived when it has started fewer collectives on
// that communicator; a rank that does not answer is stopped, hung in a system call or
// gone. Nothing is sent until a collective times out, and serving costs one MPI_Test
// per pass of the thread's loop when it is not busy.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>

#include "strata/collectives/dtype.hpp"

namespace strata::coll::detail {

struct OpDesc;

// A collective this rank has posted and not yet seen complete.
struct WatchedOp {
  uint64_t order = 0;   // its communicator's order key (the same on every rank)
  uint64_t number = 0;  // 1-based: the how-many-th collective on that communicator
  std::chrono::steady_clock::time_point since;  // posted
};

class MpiWatchdog {
 public:
  // After MPI_Init: makes the watchdog's communicator (collective over MPI_COMM_WORLD)
  // and posts the query receive, where the world has more than one rank.
  void start(int rank, int size);
  void stop();  // before MPI_Finalize
  bool active() const { return comm_ != MPI_COMM_NULL; }

  // Numbers a collective as it is posted on communicator `order`.
  WatchedOp posted(uint64_t order, const OpDesc& d);
  // Answers the queries that have arrived. oldest: the collective this rank has waited in
  // longest (null when none), and its description.
  void serve(const WatchedOp* oldest, const OpDesc* oldest_desc);
  // Where the oldest collective has waited past the timeout: asks the others, prints the
  // report and exits the process (kCollectiveTimeoutExitCode). Returns otherwise.
  void check(const WatchedOp* oldest, const OpDesc* oldest_desc);

 private:
  struct Query {
    int64_t order = 0, number = 0;
  };
  // One rank's answer. op: the operation it has waited in longest ("" when none).
  struct Answer {
    int64_t order = 0;
    int64_t started = 0;     // collectives it has started on the communicator asked about
    int64_t waiting_order = -1, waiting_number = 0;
    double waited_s = 0;
    char op[32] = {};
  };
  struct Outgoing {
    Answer answer;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  Answer answer_for(int64_t order, const WatchedOp* oldest, const OpDesc* oldest_desc) const;
  [[noreturn]] void report_and_exit(const WatchedOp& stuck, const OpDesc& desc, double timeout);
  std::string describe_rank(int r, const Answer* a, const WatchedOp& stuck) const;

  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  Query incoming_;
  MPI_Request incoming_req_ = MPI_REQUEST_NULL;
  std::deque<Outgoing> outgoing_;  // answers being sent (their buffers live here)
  std::unordered_map<uint64_t, uint64_t> started_;  // collectives posted per order key
};

}  // namespace strata::coll::detail
