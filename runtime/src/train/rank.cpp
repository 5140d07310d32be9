#include "strata/runtime/train/rank.hpp"

#include <string>

#include "strata/collectives/nccl.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/collectives/staged.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"

namespace strata {

void RankContext::reset() {
  hpz.reset();
  replicas.reset();
  shard.reset();
  dev_comm.reset();
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
  if (config.strata.device_communicator == DeviceCommunicator::Staged)
    throw ConfigError("zero_optimization.mics_shard_size " + std::to_string(n) +
                      " splits the host communicator, and the staged device communicator cannot be split yet: "
                      "remove one of mics_shard_size and strata.device_communicator = \"staged\"");
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

// ZeRO++ hpZ: groups of zero_hpz_partition_size consecutive ranks share secondary
// partitions; each group lies within a node. Collective over the host communicator.
void split_hpz(const Config& config, RankContext& r) {
  const int n = static_cast<int>(config.zero.zero_hpz_partition_size);
  if (n <= 1) return;
  const std::string key = "zero_optimization.zero_hpz_partition_size " + std::to_string(n);
  if (config.strata.backend == Backend::Cuda)
    throw ConfigError(key + " runs on the cpu backend only for now (the nccl backend cannot split its communicator "
                            "yet): remove zero_hpz_partition_size, or set strata.backend to \"cpu\"");
  if (config.strata.device_communicator == DeviceCommunicator::Staged)
    throw ConfigError(key + " splits the host communicator, and the staged device communicator cannot be split "
                            "yet: remove one of zero_hpz_partition_size and strata.device_communicator = \"staged\"");
  coll::Communicator& host = *r.host_comm;
  const coll::Topology t = coll::resolve_topology(host, config.strata.ranks_per_node);
  if (t.ranks_per_node % n != 0)
    throw ConfigError(key + " puts a secondary partition across node boundaries (" + t.describe() +
                      "): give a divisor of " + std::to_string(t.ranks_per_node) +
                      " (hpZ keeps backward's gathers inside a node), or set strata.ranks_per_node");
  const int rank = host.rank();
  r.hpz = coll::split(host, rank / n, rank % n);
  if (rank == 0)
    log::info(key + ": parameters gathered over all " + std::to_string(host.size()) +
              " ranks once after each change, then from secondary partitions within " +
              (host.size() == n ? std::string("one group") : std::to_string(host.size() / n) + " groups") + " of " +
              std::to_string(n) + " ranks (" + t.describe() + ")");
}

// ZeRO++ qgZ: the engine splits its communicator by node and quantizes on the host
// (ZeroEngine refuses the rest too; here before anything is written).
void check_qgz(const Config& config, bool staged) {
  if (!config.zero.zero_quantized_gradients) return;
  const std::string key = "zero_optimization.zero_quantized_gradients";
  if (config.strata.backend != Backend::Cpu)
    throw ConfigError(key + " runs on the cpu backend only for now (its quantization runs on the host): remove "
                            "zero_quantized_gradients, or set strata.backend to \"cpu\"");
  if (staged)
    throw ConfigError(key + " splits the engine's communicator by node, and a staged one cannot be split: use the "
                            "host communicator (drop strata.device_communicator = \"staged\"), or remove "
                            "zero_quantized_gradients");
}

// The device communicator strata.device_communicator resolves to on this rank.
enum class DeviceCommChoice { Host, Nccl, Staged };

struct DeviceCommPlan {
  DeviceCommChoice choice = DeviceCommChoice::Host;
  int ordinal = 0;
  bool first_on_gpu = true;  // first_rank_on_its_gpu
  std::string why;  // for the log line
};

DeviceCommPlan plan_device_comm(const Config& config, const coll::Communicator& host) {
  const DeviceCommunicator asked = config.strata.device_communicator;
  const std::string ranks = std::to_string(host.local_size()) + " rank(s) on this host";
  DeviceCommPlan p;
  if (config.strata.backend != Backend::Cuda) {
    // parse_config refused "nccl" on cpu and "staged" on sim.
    if (asked == DeviceCommunicator::Staged) {
      p.choice = DeviceCommChoice::Staged;
      p.why = "strata.device_communicator = \"staged\": the cpu device's buffers go through pinned staging";
    } else {
      p.why = std::string("the ") + to_string(config.strata.backend) + " device's buffers are host memory";
    }
    return p;
  }
  const int gpus = cuda_device_count();
  // No GPU: make_device says so, with the fix.
  p.ordinal = gpus > 0 ? host.local_rank() % gpus : host.local_rank();
  p.first_on_gpu = first_rank_on_its_gpu(host.local_rank(), gpus);
  const std::string shape = ranks + ", " + std::to_string(gpus) + " visible GPU(s)";
  const bool shared = gpus > 0 && host.local_size() > gpus;
  switch (asked) {
    case DeviceCommunicator::Nccl:
      if (shared)
        throw ConfigError("strata.device_communicator = \"nccl\", but " + shape +
                          ": NCCL refuses two ranks on one GPU. Use \"staged\" (or \"auto\", which picks it here), "
                          "or start at most " + std::to_string(gpus) + " rank(s) per host");
      p.choice = DeviceCommChoice::Nccl;
      p.why = "strata.device_communicator = \"nccl\" (" + shape + ")";
      break;
    case DeviceCommunicator::Staged:
      p.choice = DeviceCommChoice::Staged;
      p.why = "strata.device_communicator = \"staged\" (" + shape + ")";
      break;
    case DeviceCommunicator::Auto:
      p.choice = shared ? DeviceCommChoice::Staged : DeviceCommChoice::Nccl;
      p.why = "strata.device_communicator = \"auto\": " + shape +
              (shared ? ", so ranks share GPUs, which NCCL refuses" : ", one GPU per rank");
      break;
  }
  return p;
}

const char* describe(DeviceCommChoice c, const coll::Communicator& host) {
  switch (c) {
    case DeviceCommChoice::Nccl: return "nccl";
    case DeviceCommChoice::Staged: return "staged (pinned host memory over the host communicator)";
    case DeviceCommChoice::Host: return to_string(host.backend());
  }
  return "?";
}

}  // namespace

bool first_rank_on_its_gpu(int local_rank, int gpus) { return gpus <= 0 || local_rank < gpus; }

RankContext open_rank(const Config& config) {
  RankContext r;
  coll::set_collective_timeout(config.strata.collective_timeout);
  r.host_comm = coll::make_host_communicator(coll::HostBackend::Auto);
  validate_for_world(config, r.host_comm->size());
  const DeviceCommPlan plan = plan_device_comm(config, *r.host_comm);
  check_qgz(config, plan.choice == DeviceCommChoice::Staged);
  DeviceOptions d;
  d.backend = config.strata.backend;
  d.ordinal = plan.ordinal;
  r.device_ordinal = d.ordinal;
  r.measures_device_peak = plan.first_on_gpu;
  r.device = make_device(d);
  switch (plan.choice) {
    case DeviceCommChoice::Nccl:
      // Device buffers need a communicator that reads device memory: NCCL, even for one rank.
      r.dev_comm = coll::make_nccl_communicator(*r.host_comm, d.ordinal);
      break;
    case DeviceCommChoice::Staged:
      // A host communicator of its own: the staged one issues its collectives from its
      // worker thread, which must not interleave with the engine's on host_comm.
      r.dev_comm = coll::make_staged_communicator(coll::make_host_communicator(coll::HostBackend::Auto), *r.device);
      break;
    case DeviceCommChoice::Host: break;
  }
  if (r.host_comm->local_rank() == 0) {
    const std::string line = std::string("device collectives: ") + describe(plan.choice, *r.host_comm) + "; " + plan.why;
    // cpu without a choice made: today's path, not worth a line at the default level.
    if (plan.choice == DeviceCommChoice::Host)
      log::debug(line);
    else
      log::info(line);
  }
  split_mics(config, r);
  split_hpz(config, r);
  return r;
}

}  // namespace strata
