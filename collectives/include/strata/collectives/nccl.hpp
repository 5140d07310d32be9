// The nccl backend: collectives on device buffers, one NCCL communicator per process
// and device (Strata runs one process per GPU, so a process drives exactly one).
//
// Compiled and linked in CI; run on GPUs when a machine with one is lent
// (docs/training.md).
//
// Bootstrap: rank 0 makes the ncclUniqueId and broadcasts it over a host communicator
// (mpi under a launcher; self for one process, where no MPI is needed). Operations are
// enqueued on the communicator's own CUDA stream in call order and return events
// backed by a cudaEvent recorded after them; waiting on one also watches
// ncclCommGetAsyncError, so a failed peer becomes a CollectiveError, not a hang.
//
// `after`: taken apart where it joins several (when_all, when_done); each part that is
// a CUDA event (an nccl communicator's, a core cuda stream's, the cuda model's:
// EventImpl::cuda_event_handle) is waited for on the GPU (cudaStreamWaitEvent), and its
// own error, if any, fails the collective's event when that is waited for. Any other
// part (a host event: I/O, MPI) is waited for on the calling thread before enqueuing.
// Core's cuda streams wait for nccl events on the GPU the same way.
#pragma once

#include <memory>
#include <string>

#include "strata/collectives/communicator.hpp"

namespace strata::coll {

// True when the nccl backend was built and a GPU is present; reason explains a false.
bool nccl_available(std::string* reason);

// A communicator over the same ranks as `bootstrap`, for buffers on GPU
// `device_ordinal`. Collective: every rank of bootstrap calls it. Throws Unavailable
// when NCCL was not built in or no GPU is present.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device_ordinal);

}  // namespace strata::coll
