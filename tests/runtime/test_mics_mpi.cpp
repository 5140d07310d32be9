// MiCS (zero_optimization.mics_shard_size) under mpirun -np 4: the states sharded within
// groups of 2 consecutive ranks and replicated across the 2 groups, every stage and
// offload setting, against flat sharding over the 4 ranks with the same data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpt_harness.hpp"
#include "strata/collectives/topology.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

// The bound for fp32 over 20 steps. A replica's gradient is summed in another
// order (within the group, then across) than flat's reduce-scatter over 4 ranks.
constexpr double kLossRtol = 1e-5;
// 16 bits: each collective rounds its sums to 16 bits, and MiCS rounds twice (within the
// group, then across), flat once: gpt.mpi's 16-bit bound against one rank.
constexpr double kLossRtol16 = 3e-2;

coll::Communicator& world() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  return *comm;
}

struct Mics {
  std::unique_ptr<coll::Communicator> shard, replicas;
};

Mics split_groups_of(int n) {
  coll::Communicator& w = world();
  return {coll::split(w, w.rank() / n, w.rank() % n), coll::split(w, w.rank() % n, w.rank() / n)};
}

double worst_rel(const RunResult& got, const RunResult& ref) {
  double worst = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    worst = std::max(worst, std::abs(got.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
  return worst;
}

void mics_follows_flat(DType precision, const std::vector<int>& stages, double rtol) {
  coll::Communicator& w = world();
  ASSERT_EQ(w.size() % 2, 0) << "run this under mpirun with an even number of ranks";
  Mics m = split_groups_of(2);
  TempDir dir("mics-" + std::string(precision_name(precision)) + "-r" + std::to_string(w.rank()));
  const int steps = 20;
  for (int stage : stages)
    for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off,
                   .precision = precision};
      const RunResult flat = train_gpt(w, w, spec, steps, dir.path.string());
      const RunResult mics =
          train_gpt(*m.shard, *m.shard, spec, steps, dir.path.string(), false, small_gpt(), m.replicas.get());
      const double worst = worst_rel(mics, flat);
      EXPECT_LE(worst, rtol) << spec.label() << " at world " << w.size();
      // The layout really is MiCS: half the traffic of a group of 4 among 2, and the
      // reduced gradient shards all-reduced across the groups; flat has no replicas.
      EXPECT_EQ(flat.stats.replica_collective_bytes, 0u);
      EXPECT_GT(mics.stats.replica_collective_bytes, 0u) << spec.label();
      EXPECT_LT(mics.stats.shard_collective_bytes, flat.stats.shard_collective_bytes) << spec.label();
      // Every step taken, the loss falling: a wrong average or a lost replica shows here too.
      EXPECT_LT(mics.losses.back(), mics.losses.front()) << spec.label();
      // The weights every rank ends with: the same in both groups (all gathered within a
      // group; compared across them).
      std::vector<double> sum{0};
      for (const auto& g : mics.weights)
        for (float v : g) sum[0] += v;
      std::vector<double> mine = sum;
      m.replicas->all_reduce(std::span<double>(sum), coll::ReduceOp::Max).wait();
      EXPECT_EQ(sum[0], mine[0]) << spec.label() << ": the groups hold different weights";
      if (w.rank() == 0)
        std::printf("mics 2 of %d, %s: loss %.5f -> %.5f, max rel diff to flat %.2e; bytes sent within the "
                    "group %llu (flat %llu), across groups %llu\n",
                    w.size(), spec.label().c_str(), mics.losses.front(), mics.losses.back(), worst,
                    static_cast<unsigned long long>(mics.stats.shard_collective_bytes),
                    static_cast<unsigned long long>(flat.stats.shard_collective_bytes),
                    static_cast<unsigned long long>(mics.stats.replica_collective_bytes));
    }
}

}  // namespace

TEST(MicsMpi, GroupsOfTwoFollowFlatShardingEveryStageAndOffload) {
  mics_follows_flat(DType::F32, {1, 2, 3}, kLossRtol);
}

TEST(MicsMpi, SixteenBitGroupsOfTwoFollowFlatSharding) {
  mics_follows_flat(DType::BF16, {3}, kLossRtol16);
}

// With gradient accumulation the groups' gradients cross once a step, summed over the
// micro-steps (DeepSpeed's MiCS all-reduces at the accumulation boundary): the bytes
// across the groups are those of accumulation 1, and the losses follow flat's.
TEST(MicsMpi, AccumulatedGradientsCrossTheGroupsOnceAStep) {
  coll::Communicator& w = world();
  ASSERT_EQ(w.size() % 2, 0) << "run this under mpirun with an even number of ranks";
  Mics m = split_groups_of(2);
  TempDir dir("mics-accum-r" + std::to_string(w.rank()));
  for (int stage : {2, 3}) {
    RunSpec one{.stage = stage, .precision = DType::F32};
    RunSpec two = one;
    two.accum = 2;
    const RunResult flat = train_gpt(w, w, two, 20, dir.path.string());
    const RunResult mics = train_gpt(*m.shard, *m.shard, two, 20, dir.path.string(), false, small_gpt(), m.replicas.get());
    const RunResult mics1 = train_gpt(*m.shard, *m.shard, one, 20, dir.path.string(), false, small_gpt(), m.replicas.get());
    EXPECT_LE(worst_rel(mics, flat), kLossRtol) << two.label();
    EXPECT_EQ(mics.stats.replica_collective_bytes, mics1.stats.replica_collective_bytes) << two.label();
    EXPECT_GT(mics.stats.shard_collective_bytes, mics1.stats.shard_collective_bytes)
        << "stage " << stage << ": within the group every micro-step reduces";
    if (w.rank() == 0)
      std::printf("mics 2 of %d, %s: max rel diff to flat %.2e; across groups %llu bytes (accumulation 1: %llu)\n",
                  w.size(), two.label().c_str(), worst_rel(mics, flat),
                  static_cast<unsigned long long>(mics.stats.replica_collective_bytes),
                  static_cast<unsigned long long>(mics1.stats.replica_collective_bytes));
  }
}

// The speculative optimizer under MiCS: a sub-group is stepped during the backward pass
// once its gradient is complete, which under MiCS is after the all-reduce across the
// groups (queued behind the accumulation on the engine's stream); the step's commit or
// rollback then agrees on every rank. Stages 2 and 3, fp32, with accumulation 2 and
// clipping (which makes the speculation roll back when the norm clips): the losses follow
// flat's non-speculative run as the plain MiCS run does.
TEST(MicsMpi, SpeculativeOptimizerFollowsFlat) {
  coll::Communicator& w = world();
  ASSERT_EQ(w.size() % 2, 0) << "run this under mpirun with an even number of ranks";
  Mics m = split_groups_of(2);
  TempDir dir("mics-spec-r" + std::to_string(w.rank()));
  for (int stage : {2, 3})
    for (float clip : {0.0f, 0.5f}) {
      RunSpec plain{.stage = stage, .optimizer = OffloadDevice::Cpu, .accum = 2, .clip = clip,
                    .precision = DType::F32};
      RunSpec spec = plain;
      spec.speculative = true;
      const RunResult flat = train_gpt(w, w, plain, 20, dir.path.string());
      const RunResult mics =
          train_gpt(*m.shard, *m.shard, spec, 20, dir.path.string(), false, small_gpt(), m.replicas.get());
      EXPECT_LE(worst_rel(mics, flat), kLossRtol) << spec.label();
      EXPECT_LT(mics.losses.back(), mics.losses.front()) << spec.label();
      EXPECT_GT(mics.stats.replica_collective_bytes, 0u) << spec.label();
      if (w.rank() == 0)
        std::printf("mics 2 of %d, %s: max rel diff to flat %.2e\n", w.size(), spec.label().c_str(),
                    worst_rel(mics, flat));
    }
}
