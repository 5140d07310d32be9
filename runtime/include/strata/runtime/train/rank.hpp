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

// size (validate_for_world), opens the config's backend and the device communicator
// strata.device_communicator asks for, and logs which one and why (once per host); under
// zero_optimization.mics_shard_size, splits the ranks into groups and replicas.
// Throws ConfigError / Unavailable with the fix (no GPU, "nccl" asked for where ranks
// share a GPU, a build without NCCL, MiCS groups that straddle nodes, MiCS on cuda or
// with the staged communicator).
  void reset();  // the same order, now
};

// Joins the job (MPI when launched by mpirun/srun), checks the config against the world
// size (validate_for_world), opens the config's backend and the device communicator
// strata.device_communicator asks for, and logs which one and why (once per host); under
// zero_optimization.mics_shard_size, splits the ranks into groups and replicas.
// Throws ConfigError / Unavailable with the fix (no GPU, "nccl" asked for where ranks
// share a GPU, a build without NCCL, MiCS groups that straddle nodes, MiCS on cuda or
// with the staged communicator).
RankContext open_rank(const Config& config);

}  // namespace strata
