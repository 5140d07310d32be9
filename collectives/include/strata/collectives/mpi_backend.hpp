// The mpi backend's own extras, for code that needs plain MPI beside Strata's
// collectives (the reference column of `strata bench collectives`, a trainer that
// already uses MPI).
//
// How the backend works: one progress thread per process owns MPI. It initializes MPI
// (MPI_Init_thread asking for MPI_THREAD_MULTIPLE; any level from FUNNELED up works,
// since every MPI call of Strata's is made on that thread), takes operations from a
// queue, posts them as non-blocking collectives (MPI_Iallgather,
// MPI_Ireduce_scatter_block, MPI_Iallreduce, MPI_Ibcast, MPI_Ibarrier) in call order,
// drives them with MPI_Testsome and completes their events. With nothing in flight it
// sleeps on a condition variable (no CPU); with operations in flight it polls, yielding
// the core, for a window after the last progress that grows with the bytes in flight,
// then backs off to waits of up to 100 us, and 1 ms once a wait has lasted 10 ms (woken
// at once by new work): a rank waiting 1 s for a late peer spends about 3% of a core,
// and a busy one sees low latency. Each communicator is an MPI_Comm_dup of
// MPI_COMM_WORLD with MPI_ERRORS_RETURN (set on MPI_COMM_WORLD too, when Strata
// initialized MPI, since Open MPI raises request errors there), so MPI errors come back
// as CollectiveError naming the call and the rank; setup failures abort with the call
// and rank.
// Callbacks registered on these events (HostEvent::then) run on the MPI thread: they
// may call collectives but must not wait on one, nor destroy a communicator.
// 16-bit floats (Bf16, Fp16) are reduced with user-defined MPI operations that widen
// each element to float, add (or max) and round back.
// If the application initialized MPI itself, Strata uses it when the thread level is
// MPI_THREAD_MULTIPLE, never finalizes it, and throws Unavailable otherwise.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

#include "strata/collectives/communicator.hpp"
#include "strata/core/event.hpp"

namespace strata::coll {

struct MpiInfo {
  int thread_level = 0;     // MPI_THREAD_* that MPI provided
  bool initialized_here = false;  // Strata called MPI_Init_thread (and will finalize)
  std::string library;      // MPI_Get_library_version, first line
};
// Initializes MPI if needed (see make_host_communicator).
MpiInfo mpi_info();

// Runs fn with comm's MPI_Comm on the thread that owns MPI, in comm's call order
// (after the operations called before it have been posted; not necessarily finished).
// Nothing else progresses while fn runs. An exception from fn fails the event.
// Throws CollectiveUsageError when comm is not an mpi communicator.
Event run_on_mpi_thread(Communicator& comm, std::function<void(MPI_Comm)> fn, Event after = {});

}  // namespace strata::coll
