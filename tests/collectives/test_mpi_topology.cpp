// Sub-communicators and the node layout (topology.hpp) under mpirun with 2 and 4 ranks
// (and as a singleton). As in test_mpi_collectives.cpp, every rank posts and waits for
// every operation before checking values, so a failed check leaves no rank waiting.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/core/error.hpp"

using namespace strata;
using namespace strata::coll;

namespace {

std::unique_ptr<Communicator> make_mpi() { return make_host_communicator(HostBackend::Mpi); }

// The world ranks of `sub`'s members, in `sub`'s rank order.
std::vector<int> members(Communicator& sub, int world_rank) {
  std::vector<int> mine{world_rank}, all(static_cast<size_t>(sub.size()));
  sub.all_gather(mine, all).wait();
  return all;
}

}  // namespace

TEST(MpiTopology, SplitGroupsByColorAndRanksByKey) {
  auto world = make_mpi();
  const int n = world->size(), r = world->rank();
  // Even and odd ranks apart, each group in reverse rank order (key -rank).
  auto sub = split(*world, r % 2, -r);
  EXPECT_EQ(sub->backend(), CommBackend::Mpi);
  std::vector<int> expect;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) expect.push_back(q);
  // The parent keeps working beside its split, in both orders of use.
  std::vector<int64_t> sum{r};
  Event parent = world->all_reduce(sum);
  const std::vector<int> got = members(*sub, r);
  parent.wait();
  EXPECT_EQ(got, expect);
  EXPECT_EQ(sub->size(), static_cast<int>(expect.size()));
  EXPECT_EQ(sub->rank(), static_cast<int>(std::find(expect.begin(), expect.end(), r) - expect.begin()));
  EXPECT_EQ(sum[0], int64_t{n} * (n - 1) / 2);
  // One host: every member is local.
  EXPECT_EQ(sub->local_size(), sub->size());
  EXPECT_EQ(sub->local_rank(), sub->rank());
}

TEST(MpiTopology, OneHostFromTheLauncherIsOneNode) {
  auto world = make_mpi();
  const Topology t = resolve_topology(*world);
  EXPECT_TRUE(t.from_launcher);
  EXPECT_EQ(t.world, world->size());
  EXPECT_EQ(t.ranks_per_node, world->size());
  EXPECT_EQ(t.nodes, 1);
  EXPECT_EQ(t.node, 0);
  EXPECT_EQ(t.local, world->rank());
}

TEST(MpiTopology, NodesOfTwoSplitIntoNodeAndCrossCommunicators) {
  auto world = make_mpi();
  const int n = world->size(), r = world->rank();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even world size, not " << n;
  const Topology t = resolve_topology(*world, 2);
  EXPECT_FALSE(t.from_launcher);
  EXPECT_EQ(t.nodes, n / 2);
  EXPECT_EQ(t.node, r / 2);
  EXPECT_EQ(t.local, r % 2);
  EXPECT_EQ(t.describe(), std::to_string(n) + " ranks: " + std::to_string(n / 2) +
                              (n / 2 == 1 ? " node" : " nodes") + " of 2 (strata.ranks_per_node)");
  NodeCommunicators c = split_by_node(*world, t);
  // Both used at once, as a hierarchical collective would: a sum within the node and one
  // across nodes, of values that tell the members apart.
  std::vector<int64_t> in_node{int64_t{1} << r}, across{int64_t{1} << r};
  Event a = c.node->all_reduce(in_node), b = c.cross->all_reduce(across);
  a.wait();
  b.wait();
  EXPECT_EQ(members(*c.node, r), (std::vector<int>{2 * t.node, 2 * t.node + 1}));
  std::vector<int> cross_members;
  for (int node = 0; node < t.nodes; ++node) cross_members.push_back(2 * node + t.local);
  EXPECT_EQ(members(*c.cross, r), cross_members);
  EXPECT_EQ(in_node[0], (int64_t{3} << (2 * t.node)));
  int64_t expect_across = 0;
  for (int q : cross_members) expect_across += int64_t{1} << q;
  EXPECT_EQ(across[0], expect_across);
  EXPECT_EQ(c.node->rank(), t.local);
  EXPECT_EQ(c.cross->rank(), t.node);
}

TEST(MpiTopology, ACountThatDoesNotDivideTheWorldIsRefusedOnEveryRank) {
  auto world = make_mpi();
  const int bad = world->size() + 1;
  try {
    resolve_topology(*world, bad);
    ADD_FAILURE() << "ranks per node " << bad << " at world " << world->size() << " was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the world size " + std::to_string(world->size())),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(resolve_topology(*world, -1), ConfigError);
  EXPECT_THROW(split(*world, -1, 0), CollectiveUsageError);
  // The world still works after the refusals.
  std::vector<int64_t> x{1};
  world->all_reduce(x).wait();
  EXPECT_EQ(x[0], world->size());
}
