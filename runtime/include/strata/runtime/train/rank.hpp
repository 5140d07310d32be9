// What one rank runs on: its host communicator (MPI under mpirun/srun, self when alone),
// its device (on cuda, GPU local rank % visible GPUs, so several ranks may share one) and
// the communicator for device buffers (strata.device_communicator: NCCL on cuda, the
// staged one through pinned host memory where ranks share a GPU or it is asked for, the
// host communicator itself on cpu). Shared by `strata train` and the C API, so both pick
// GPUs and communicators the same way.
#pragma once

#include <memory>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/runtime/config/config.hpp"

namespace strata {

// Members are destroyed in reverse order: the device communicator (it holds the
// device's streams and staging), then the device, then the host communicator.
struct RankContext {
  std::unique_ptr<coll::Communicator> host_comm;
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> dev_comm;  // nccl or staged; null: host_comm serves device buffers
  int device_ordinal = 0;                        // cuda: the GPU this rank uses

  coll::Communicator& device_comm() { return dev_comm ? *dev_comm : *host_comm; }
  void reset();  // the same order, now
};

// Joins the job (MPI when launched by mpirun/srun), checks the config against the world
// size (validate_for_world), opens the config's backend and the device communicator
// strata.device_communicator asks for, and logs which one and why (once per host).
// Throws ConfigError / Unavailable with the fix (no GPU, "nccl" asked for where ranks
// share a GPU, a build without NCCL).
RankContext open_rank(const Config& config);

}  // namespace strata
