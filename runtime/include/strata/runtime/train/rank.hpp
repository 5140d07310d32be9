// What one rank runs on: its host communicator (MPI under mpirun/srun, self when alone),
// its device (on cuda, the GPU numbered by the rank's local rank on its host) and the
// communicator for device buffers (NCCL on cuda, the host communicator on cpu). Shared by
// `strata train` and the C API, so both pick GPUs and communicators the same way.
#pragma once

#include <memory>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/runtime/config/config.hpp"

namespace strata {

// Members are destroyed in reverse order: NCCL, then the device, then the host communicator.
struct RankContext {
  std::unique_ptr<coll::Communicator> host_comm;
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> nccl;  // cuda only
  int device_ordinal = 0;                    // cuda: the GPU this rank uses

  coll::Communicator& device_comm() { return nccl ? *nccl : *host_comm; }
  void reset();  // the same order, now
};

// Joins the job (MPI when launched by mpirun/srun), checks the config against the world
// size (validate_for_world), opens the config's backend and, on cuda, NCCL over the GPUs.
// Throws ConfigError / Unavailable with the fix (no GPU, more ranks on a host than GPUs,
// a build without NCCL).
RankContext open_rank(const Config& config);

}  // namespace strata
