#include "strata/runtime/train/rank.hpp"

#include "strata/collectives/nccl.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/core/log.hpp"

namespace strata {

void RankContext::reset() {
  replicas.reset();
  shard.reset();
  nccl.reset();
  device.reset();
  host_comm.reset();
}

namespace {

// MiCS: groups of mics_shard_size consecutive ranks shard the model states; each group
// lies within a node or spans whole nodes, so that its gathers stay inside a node where
// they can. Collective over the host communicator.
void split_mics(const Config& config, RankContext& r) {
  const int n = config.zero.mics_groups_of();
  coll::Communicator& host = *r.host_comm;
  if (n <= 0 || n == host.size()) {
    // No groups (or one of every rank: flat). The node layout is still checked when asked for.
    if (config.strata.ranks_per_node > 0) coll::resolve_topology(host, config.strata.ranks_per_node);
    return;
  }
  if (config.strata.backend == Backend::Cuda)
    throw ConfigError("zero_optimization.mics_shard_size " + std::to_string(n) +
                      " runs on the cpu backend only for now (the nccl backend cannot split its communicator "
                      "yet): remove mics_shard_size, or set strata.backend to \"cpu\"");
  const coll::Topology t = coll::resolve_topology(host, config.strata.ranks_per_node);
  if (t.ranks_per_node % n != 0 && n % t.ranks_per_node != 0)
    throw ConfigError("zero_optimization.mics_shard_size " + std::to_string(n) + " puts groups across node "
                      "boundaries (" + t.describe() + "): give a divisor or a multiple of " +
                      std::to_string(t.ranks_per_node) + " ranks, or set strata.ranks_per_node");
  const int rank = host.rank();
  r.shard = coll::split(host, rank / n, rank % n);
  r.replicas = coll::split(host, rank % n, rank / n);
  if (rank == 0)
    log::info("zero_optimization.mics_shard_size " + std::to_string(n) + ": model states sharded within " +
              std::to_string(host.size() / n) + " groups of " + std::to_string(n) + " ranks (" +
              (n <= t.ranks_per_node ? "within a node" : "over whole nodes") + "; " + t.describe() +
              "), replicated across them");
}

}  // namespace

RankContext open_rank(const Config& config) {
  RankContext r;
  coll::set_collective_timeout(config.strata.collective_timeout);
  r.host_comm = coll::make_host_communicator(coll::HostBackend::Auto);
  validate_for_world(config, r.host_comm->size());
  DeviceOptions d;
  d.backend = config.strata.backend;
  d.ordinal = d.backend == Backend::Cuda ? r.host_comm->local_rank() : 0;
  r.device_ordinal = d.ordinal;
  r.device = make_device(d);
  // Device buffers need a communicator that reads device memory: NCCL, even for one rank.
  if (d.backend == Backend::Cuda) r.nccl = coll::make_nccl_communicator(*r.host_comm, d.ordinal);
  split_mics(config, r);
  return r;
}

}  // namespace strata
