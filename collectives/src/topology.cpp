#include "strata/collectives/topology.hpp"

#include <array>
#include <cstdint>
#include <vector>

#include "mpi_communicator.hpp"
#include "self_communicator.hpp"

namespace strata::coll {

std::unique_ptr<Communicator> split(Communicator& comm, int color, int key) {
  if (color < 0)
    throw CollectiveUsageError("split: color " + std::to_string(color) +
                               " is negative; give every rank a color >= 0 (ranks with the same color share a "
                               "communicator)");
  switch (comm.backend()) {
    case CommBackend::Self: return detail::make_self_communicator();
    case CommBackend::Mpi: return detail::split_mpi_communicator(comm, color, key);
    case CommBackend::Nccl:
      throw Unavailable("split: the nccl backend cannot make sub-communicators yet (ncclCommSplit is not wired); "
                        "split the host communicator and make an nccl communicator over each part");
    case CommBackend::Staged:
      throw Unavailable("split: the staged communicator cannot make sub-communicators yet; split the host "
                        "communicator and stage over each part");
    case CommBackend::Sim:
      throw Unavailable("split: a sim communicator plays one rank of a symmetric group and cannot be split; make "
                        "a sim communicator of the sub-group's size instead (make_sim_communicator)");
  }
  throw Unavailable("split: unknown communicator backend");
}

std::string Topology::describe() const {
  return std::to_string(world) + (world == 1 ? " rank: " : " ranks: ") + std::to_string(nodes) +
         (nodes == 1 ? " node of " : " nodes of ") + std::to_string(ranks_per_node) +
         (from_launcher ? " (from the launcher)" : " (strata.ranks_per_node)");
}

Topology resolve_topology(Communicator& world, int ranks_per_node) {
  Topology t;
  t.world = world.size();
  if (ranks_per_node < 0)
    throw ConfigError("ranks per node " + std::to_string(ranks_per_node) +
                      " is negative: give a count that divides the world size, or 0 to take the launcher's");
  t.from_launcher = ranks_per_node == 0;
  // Every rank's view, so that every rank decides alike: the launcher's ranks per node
  // (as max and, negated, min) and whether this rank sits where in-order placement puts it.
  const int launcher = world.local_size();
  const int placed = t.from_launcher ? (world.rank() % launcher == world.local_rank() ? 0 : 1) : 0;
  std::array<int64_t, 3> v{launcher, -launcher, placed};
  world.all_reduce(std::span<int64_t>(v), ReduceOp::Max).wait();
  const int most = static_cast<int>(v[0]), fewest = static_cast<int>(-v[1]);
  if (t.from_launcher) {
    if (most != fewest)
      throw ConfigError("the launcher placed between " + std::to_string(fewest) + " and " + std::to_string(most) +
                        " ranks on a node; hybrid layouts need the same number on every node: launch as many "
                        "ranks on each (e.g. mpirun --map-by ppr:N:node), or set strata.ranks_per_node");
    if (v[2] != 0)
      throw ConfigError("ranks are not placed on nodes in order (rank r must be local rank r % " +
                        std::to_string(most) +
                        "); launch with mpirun --map-by slot (Open MPI's default) or Slurm's block distribution, "
                        "or set strata.ranks_per_node");
    ranks_per_node = most;
  } else if (t.world % ranks_per_node != 0) {
    throw ConfigError("strata.ranks_per_node " + std::to_string(ranks_per_node) + " does not divide the world size " +
                      std::to_string(t.world) + ": give a divisor of " + std::to_string(t.world) +
                      ", or 0 to take the launcher's ranks per node");
  }
  t.ranks_per_node = ranks_per_node;
  t.nodes = t.world / ranks_per_node;
  t.node = world.rank() / ranks_per_node;
  t.local = world.rank() % ranks_per_node;
  return t;
}

NodeCommunicators split_by_node(Communicator& world, const Topology& t) {
  if (t.world != world.size())
    throw CollectiveUsageError("split_by_node: the topology is of " + std::to_string(t.world) +
                               " ranks and the communicator of " + std::to_string(world.size()) +
                               "; resolve it over this communicator");
  NodeCommunicators c;
  c.node = split(world, t.node, t.local);
  c.cross = split(world, t.local, t.node);
  return c;
}

}  // namespace strata::coll
