// Sub-communicators and the layout of ranks on nodes: what hybrid sharding (a model
// sharded within a node and replicated across, MiCS, ZeRO++ hpZ) and hierarchical
// collectives are built on.
//
// A node is a host the launcher placed ranks on (Open MPI and Slurm tell each process
// its local rank and size; Strata reads them through MPI_Comm_split_type(SHARED), which
// is what the launcher set up). `ranks_per_node` may override it: 4 ranks on one host
// can then be treated as 2 nodes of 2, which is how the cpu tests run the hybrid layouts.
// Ranks must sit on nodes in order (ranks 0..R-1 on the first node, R..2R-1 on the next:
// mpirun's --map-by slot, Slurm's block distribution) and every node must hold R ranks.
#pragma once

#include <memory>
#include <string>

#include "strata/collectives/communicator.hpp"

namespace strata::coll {

// A communicator over the ranks of `comm` that pass the same `color` (>= 0), ranked by
// `key`, then by their rank in `comm` (MPI_Comm_split). Collective over `comm`: every
// rank calls it, in the same order as its other operations on `comm`. The new
// communicator's local_rank/local_size count its ranks on this host. The self backend
// gives a one-rank communicator; nccl and sim throw Unavailable, saying so.
std::unique_ptr<Communicator> split(Communicator& comm, int color, int key);

struct Topology {
  int world = 1;
  int ranks_per_node = 1;
  int nodes = 1;
  int node = 0;   // this rank's node: rank / ranks_per_node
  int local = 0;  // this rank's index in its node: rank % ranks_per_node
  bool from_launcher = true;  // false: strata.ranks_per_node set it
  std::string describe() const;  // "4 ranks: 2 nodes of 2 (from the launcher)"
};

// The layout of `world`'s ranks: ranks_per_node as given (> 0), or the launcher's
// (0). Collective over `world` (it compares every rank's view, so every rank throws
// alike). Throws ConfigError naming the fix when the given count does not divide the
// world, or the launcher's nodes hold different numbers of ranks, or ranks are not
// placed on nodes in order.
Topology resolve_topology(Communicator& world, int ranks_per_node = 0);

// `node`: the ranks of this rank's node; `cross`: the ranks of every node with this
// rank's local index (one a node). Collective over `world`.
struct NodeCommunicators {
  std::unique_ptr<Communicator> node;
  std::unique_ptr<Communicator> cross;
};
NodeCommunicators split_by_node(Communicator& world, const Topology& t);

}  // namespace strata::coll
