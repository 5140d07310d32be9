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

// Members are destroyed in reverse order: the MiCS communicators, the device
// communicator (it holds the device's streams and staging), then the device, then the
// host communicator.
struct RankContext {
  std::unique_ptr<coll::Communicator> host_comm;
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> dev_comm;  // nccl or staged; null: host_comm serves device buffers
  int device_ordinal = 0;                        // cuda: the GPU this rank uses
  // Whether this rank measures its device's matmul peak (MFU's denominator, summed over
  // the ranks): on cuda the first local rank on each GPU alone, since ranks that share a
  // GPU would each time the whole of it between the others' time slices (two ranks on an
  // H200 summed 1.48 PFLOP/s); every rank on cpu, where ranks on one machine measure at
  // once and each gets its share of the cores.
  bool measures_device_peak = true;
  // zero_optimization.mics_shard_size (cpu backend): `shard` spans this rank's group
  // (consecutive ranks), `replicas` the ranks with its index in every group.
  std::unique_ptr<coll::Communicator> shard;
  std::unique_ptr<coll::Communicator> replicas;
  // zero_optimization.zero_hpz_partition_size (cpu backend): this rank's group of
  // consecutive ranks that share secondary partitions (ZeroEngine's `hpz`).
  std::unique_ptr<coll::Communicator> hpz;

  coll::Communicator& device_comm() { return dev_comm ? *dev_comm : *host_comm; }
  // What the engine shards over, for device buffers and for host scalars: the group's
  // ranks under MiCS, every rank otherwise.
  coll::Communicator& engine_comm() { return shard ? *shard : device_comm(); }
  coll::Communicator& engine_host_comm() { return shard ? *shard : *host_comm; }
  // The engine's replicas (ZeroEngine's `replicas`): nullptr without MiCS.
  coll::Communicator* engine_replicas() { return replicas.get(); }
  coll::Communicator* engine_hpz() { return hpz.get(); }
  // Whether this rank writes checkpoints: the first group's ranks under MiCS (the other
  // groups hold the same shards), every rank otherwise.
  bool writes_checkpoints() const { return !replicas || replicas->rank() == 0; }
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

// Whether local rank `local_rank` is the first of the ranks on its GPU when each takes GPU
// local_rank % gpus (open_rank's rule); with no GPU visible, every rank is.
bool first_rank_on_its_gpu(int local_rank, int gpus);

}  // namespace strata
