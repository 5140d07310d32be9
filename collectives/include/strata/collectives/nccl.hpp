// The nccl backend: collectives on device buffers, one NCCL communicator per process
// and device (Strata runs one process per GPU, so a process drives exactly one).
//
// NOTE: compiled and linked in CI; it has not yet run on a GPU.
//
// Bootstrap: rank 0 makes the ncclUniqueId and broadcasts it over a host communicator
// (mpi under a launcher; self for one process, where no MPI is needed). Operations are
// enqueued on the communicator's own CUDA stream in call order and return events
// backed by a cudaEvent recorded after them; waiting on one also watches
// ncclCommGetAsyncError, so a failed peer becomes a CollectiveError, not a hang.
//
// `after`: an event of an nccl communicator is waited for on the GPU
// (cudaStreamWaitEvent). Any other event that is not yet complete is waited for on the
// calling thread before enqueuing: core's cuda streams do not expose their cudaEvent
// or cudaStream_t yet, so neither side can wait for the other on the GPU. For the same
// reason a core cuda Stream::wait() on an nccl event would block in a host callback;
// until core exposes them, wait for nccl events on the host.
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
