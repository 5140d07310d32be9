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

// Members are destroyed in reverse order: the MiCS communicators, NCCL, then the device,
// then the host communicator.
struct RankContext {
  std::unique_ptr<coll::Communicator> host_comm;
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> nccl;  // cuda only
  int device_ordinal = 0;                    // cuda: the GPU this rank uses
  // zero_optimization.mics_shard_size (cpu backend): `shard` spans this rank's group
  // (consecutive ranks), `replicas` the ranks with its index in every group.
  std::unique_ptr<coll::Communicator> shard;
  std::unique_ptr<coll::Communicator> replicas;

  coll::Communicator& device_comm() { return nccl ? *nccl : *host_comm; }
  // What the engine shards over, for device buffers and for host scalars: the group's
  // ranks under MiCS, every rank otherwise.
  coll::Communicator& engine_comm() { return shard ? *shard : device_comm(); }
  coll::Communicator& engine_host_comm() { return shard ? *shard : *host_comm; }
  // The engine's replicas (ZeroEngine's `replicas`): nullptr without MiCS.
  coll::Communicator* engine_replicas() { return replicas.get(); }
  // Whether this rank writes checkpoints: the first group's ranks under MiCS (the other
  // groups hold the same shards), every rank otherwise.
  bool writes_checkpoints() const { return !replicas || replicas->rank() == 0; }
  void reset();  // the same order, now
};

// Joins the job (MPI when launched by mpirun/srun), checks the config against the world
// size (validate_for_world), opens the config's backend and, on cuda, NCCL over the GPUs;
// under zero_optimization.mics_shard_size, splits the ranks into groups and replicas.
// Throws ConfigError / Unavailable with the fix (no GPU, more ranks on a host than GPUs,
// a build without NCCL, MiCS groups that straddle nodes, MiCS on cuda).
RankContext open_rank(const Config& config);

}  // namespace strata
