// The speculative optimizer (strata.speculative_optimizer) on one rank: every stage,
// offload and precision, in every clipping regime and with a NaN gradient, gives the
// plain step's bits after every step; where the budget leaves room for only some Next
// sets, the rest step plainly and the budget holds; NVMe space is the same after 100
// steps with rollbacks. And the GPU optimizer's path (states in device memory, stepped by
// Stream::adam_step) against CpuAdam, bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "speculative_check.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

std::unique_ptr<coll::Communicator> self() { return coll::make_host_communicator(coll::HostBackend::Self); }

struct Case {
  int stage;
  DType precision;
};

class Speculative : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(Speculative, BitIdenticalToThePlainStepInEveryRegime) {
  const Case k = GetParam();
  TempDir dir("spec-" + std::to_string(k.stage) + precision_name(k.precision));
  auto comm = self();
  // The residual MLP is fp32 only; the small GPT runs 16 bits.
  const Runner run = k.precision == DType::F32 ? Runner(run_mlp) : Runner(run_gpt);
  // 30 steps of the MLP in fp32 with every offload; 10 of the GPT (slower: these cases
  // were CI's longest, 60-110 s each at 20) in bf16 with the two host tiers. Every regime
  // holds at 10: the median norm splits them, the NaN lands at step 3.
  const bool mlp = k.precision == DType::F32;
  const int steps = mlp ? 30 : 10;
  const std::vector<OffloadDevice> offloads =
      mlp ? std::vector{OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}
          : std::vector{OffloadDevice::Cpu, OffloadDevice::Nvme};
  for (OffloadDevice off : offloads)
    for (Regime regime : {Regime::NeverClips, Regime::AlwaysClips, Regime::SometimesClips, Regime::NonFinite}) {
      RunSpec spec{.stage = k.stage, .param = k.stage == 3 ? off : OffloadDevice::None, .optimizer = off,
                   .sub_group = 1024, .precision = k.precision};
      expect_speculation_exact(run, *comm, spec, regime, steps, dir.path, /*also_on_the_models_thread=*/true);
    }
  // Gradient accumulation: speculation in the last micro-step only.
  RunSpec acc{.stage = k.stage, .param = k.stage == 3 ? OffloadDevice::Nvme : OffloadDevice::None,
              .optimizer = OffloadDevice::Nvme, .accum = 3, .precision = k.precision};
  expect_speculation_exact(run, *comm, acc, Regime::SometimesClips, mlp ? 20 : 10, dir.path);
  expect_speculation_exact(run, *comm, acc, Regime::NonFinite, mlp ? 20 : 10, dir.path);
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, Speculative,
                         ::testing::Values(Case{1, DType::F32}, Case{2, DType::F32}, Case{3, DType::F32},
                                           Case{1, DType::BF16}, Case{2, DType::BF16}, Case{3, DType::BF16}),
                         [](const auto& info) {
                           return "Stage" + std::to_string(info.param.stage) + precision_name(info.param.precision);
                         });

TEST(SpeculativeOptimizer, SubGroupsWithoutRoomStepPlainlyAndTheBudgetHolds) {
  auto comm = self();
  // Optimizer states in pinned memory, 8 sub-groups; a pinned budget with room for the
  // plain layout and the Next sets of about half of them.
  RunSpec base{.stage = 3, .param = OffloadDevice::Cpu, .optimizer = OffloadDevice::Cpu, .clip = 0.05f,
               .sub_group = 1024, .snapshots = true};
  ResidualMlp model(kLayers, kWidth);
  std::vector<GroupSize> sizes(kLayers, GroupSize{"block", model.group_numel()});
  ShardStrategy st = test_engine_options(base, model.group_numel(), "").shard_strategy(1);
  const ShardLayout plain_layout = make_shard_layout(sizes, st);
  st.speculative_sub_groups = plain_layout.sub_group_count;
  const ShardLayout full = make_shard_layout(sizes, st);
  ASSERT_EQ(plain_layout.sub_group_count, 8u);
  const uint64_t pinned = [](const ShardLayout& L) { return L.need[int(Tier::Pinned)].homes() + L.pinned_staging; }(full);
  const uint64_t next_bytes = full.need[int(Tier::Pinned)].homes() - plain_layout.need[int(Tier::Pinned)].homes();
  base.pinned_budget = pinned - next_bytes / 2;

  RunResult plain = train(*comm, *comm, base, 30, "");
  RunSpec spec = base;
  spec.speculative = true;
  RunResult got = train(*comm, *comm, spec, 30, "");
  const uint64_t fallback = got.stats.speculation_fallback_sub_groups;
  EXPECT_GT(fallback, 0u);
  EXPECT_LT(fallback, 8u);
  EXPECT_EQ(got.stats.speculated_sub_groups + fallback, 8u) << "the last step speculated every sub-group with room";
  for (int s = 0; s < 30; ++s)
    ASSERT_EQ(std::memcmp(got.states[s].data(), plain.states[s].data(), got.states[s].size() * 4), 0) << "step " << s;
  for (int t = 0; t < kTierCount; ++t)
    EXPECT_LE(got.stats.store.tiers[t].peak, got.stats.store.tiers[t].budget) << to_string(static_cast<Tier>(t));
}

// Stage 3, parameters and optimizer states on NVMe, at the smallest pinned budget the
// layout plans for with every sub-group's Next set: everything passes through pinned
// staging, and the tier is full at times.
static RunSpec nvme_at_the_smallest_pinned_budget() {
  RunSpec base{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .sub_group = 1024,
               .snapshots = true};
  ResidualMlp model(kLayers, kWidth);
  std::vector<GroupSize> sizes(kLayers, GroupSize{"block", model.group_numel()});
  ShardStrategy st = test_engine_options(base, model.group_numel(), "").shard_strategy(1);
  st.speculative_sub_groups = make_shard_layout(sizes, st).sub_group_count;
  const ShardLayout full = make_shard_layout(sizes, st);
  base.pinned_budget = full.need[int(Tier::Pinned)].homes() + full.pinned_staging;
  return base;
}

// The optimizer lane holds no pins while the model's thread goes on: a sub-group's tensors
// are released behind its update as it is queued (TieredStore::release with the update's
// event). At the smallest pinned budget the layout plans for (states and parameters on
// NVMe: everything passes through pinned staging) the tier fills with the lane's copies;
// the store then evicts those the lane still reads (their memory's next user waits for
// the update) and waits on its own queue for those it writes, instead of failing or
// asking the lane, and the bits and the budget hold.
TEST(SpeculativeOptimizer, AFullTierTakesRoomFromTheLanesCopiesBehindItsUpdates) {
  TempDir dir("spec-lane-room");
  auto comm = self();
  const RunSpec base = nvme_at_the_smallest_pinned_budget();
  RunResult plain = train(*comm, *comm, base, 20, dir.path);
  RunSpec spec = base;
  spec.speculative = true;
  RunResult got = train(*comm, *comm, spec, 20, dir.path);
  std::printf("[ figures  ] pinned budget %llu bytes: %llu sub-groups on the lane, %llu evictions, %llu behind "
              "the lane's reads\n",
              static_cast<unsigned long long>(base.pinned_budget),
              static_cast<unsigned long long>(got.stats.lane_sub_groups),
              static_cast<unsigned long long>(got.stats.store.evictions),
              static_cast<unsigned long long>(got.stats.store.evictions_behind_readers));
  EXPECT_GT(got.stats.lane_sub_groups, 0u);
  // The tier is full (evictions happen only then) while the lane runs: where the lane
  // kept its pins it failed here a step in. How many of the copies taken the lane was
  // still reading depends on the two threads' timing (5-20 a run on the 2-core VM), so it
  // is printed, not asserted; the mechanism is asserted deterministically in
  // TieredStore.ACopyReleasedBehindItsReaderIsNotOverwrittenUntilTheReadEnds.
  EXPECT_GT(got.stats.store.evictions, 0u) << "the pinned tier never filled: the test no longer tests a full tier";
  EXPECT_EQ(got.stats.speculation_fallback_sub_groups, 0u);
  ASSERT_NO_FATAL_FAILURE(expect_same_states(got, plain, 20, "lane at the smallest pinned budget"));
  for (int t = 0; t < kTierCount; ++t)
    EXPECT_LE(got.stats.store.tiers[t].peak, got.stats.store.tiers[t].budget) << to_string(static_cast<Tier>(t));
}

// A speculative step that commits never needs the gradients it kept for a rollback: at
// step(), once the norm says so, those the lane is done with are let go unwritten
// (ZeroEngine::free_dead_kept_grads), before the lane finishes and the last groups'
// states are fetched; and the early fetch of a group's states is a hint that takes no
// room by writing anything home (TieredStore::prefetch, tested in test_tiered_store).
// Before, with the pinned tier full at the end of backward, the last group's states pushed
// the kept gradients to NVMe and step() threw them away there: 297 MiB a step of the 124M
// GPT in bench step, written with the model's thread waiting. Here, at the smallest pinned
// budget the layout plans, every step commits with them let go, the bits are the plain
// step's and the budgets hold. (What is still written of the gradients here is written
// during backward, where the lane's states need the room while the gradients may yet be
// needed: with the change 45 KB against 61 KB over the 10 steps at 128 KiB more budget.)
TEST(SpeculativeOptimizer, ACommittingStepLetsItsKeptGradientsGoUnwritten) {
  TempDir dir("spec-kept-grads");
  auto comm = self();
  const RunSpec base = nvme_at_the_smallest_pinned_budget();
  RunResult plain = train(*comm, *comm, base, 10, dir.path);
  RunSpec spec = base;
  spec.speculative = true;
  RunResult got = train(*comm, *comm, spec, 10, dir.path);
  const auto& moved = got.stats.store.bytes_moved_by_owner;
  const uint64_t grads_home =
      moved.count("gradients") ? moved.at("gradients")[int(Tier::Pinned)][int(Tier::Nvme)] : 0;
  std::printf("[ figures  ] %llu commits, %llu kept gradients let go at step(), %llu gradient bytes to NVMe\n",
              static_cast<unsigned long long>(got.stats.speculation_commits),
              static_cast<unsigned long long>(got.stats.kept_grads_freed_early),
              static_cast<unsigned long long>(grads_home));
  EXPECT_EQ(got.stats.speculation_commits, 10u);
  EXPECT_GT(got.stats.kept_grads_freed_early, 0u);
  ASSERT_NO_FATAL_FAILURE(expect_same_states(got, plain, 10, "committing at the smallest pinned budget"));
  for (int t = 0; t < kTierCount; ++t)
    EXPECT_LE(got.stats.store.tiers[t].peak, got.stats.store.tiers[t].budget) << to_string(static_cast<Tier>(t));
}

// Without speculation (EngineAblation::plain_state_prefetch): the states start towards the
// optimizer's tier during the last micro-step's backward pass, into the room the tier has
// free, and step() reads ahead into the room the stepped ones leave. The states' bits and
// the losses after every step are those of the run that reads each sub-group's states at
// step(), at the smallest pinned budget the layout plans (little room to prefetch into)
// and at eight times it, with clipping on some steps and a NaN gradient on one (the
// fetched states of a skipped step stay valid), and the budgets hold.
TEST(PlainOptimizer, StatesPrefetchedDuringBackwardGiveTheSameSteps) {
  TempDir dir("plain-prefetch");
  auto comm = self();
  for (uint64_t times : {1u, 8u}) {
    RunSpec base = nvme_at_the_smallest_pinned_budget();
    base.pinned_budget *= times;
    base.accum = 2;
    RunSpec probe = base;
    probe.snapshots = false;
    std::vector<double> n = train(*comm, *comm, probe, 12, dir.path).norms;
    std::nth_element(n.begin(), n.begin() + n.size() / 2, n.end());
    base.clip = static_cast<float>(n[n.size() / 2]);
    base.poison_step = 5;
    RunSpec late = base;
    late.state_prefetch = false;
    const RunResult want = train(*comm, *comm, late, 12, dir.path);
    const RunResult got = train(*comm, *comm, base, 12, dir.path);
    const std::string label = "pinned budget x" + std::to_string(times);
    ASSERT_NO_FATAL_FAILURE(expect_same_states(got, want, 12, label));
    EXPECT_EQ(want.stats.early_state_fetches, 0u) << label;
    EXPECT_GT(got.stats.early_state_fetches, 0u) << label;
    if (times > 1) EXPECT_LT(got.stats.early_state_fetches_skipped, got.stats.early_state_fetches) << label;
    for (int t = 0; t < kTierCount; ++t)
      EXPECT_LE(got.stats.store.tiers[t].peak, got.stats.store.tiers[t].budget) << label << ", " << to_string(static_cast<Tier>(t));
    std::printf("[ figures  ] %s: %llu of %llu early fetches placed\n", label.c_str(),
                static_cast<unsigned long long>(got.stats.early_state_fetches - got.stats.early_state_fetches_skipped),
                static_cast<unsigned long long>(got.stats.early_state_fetches));
  }
}

TEST(SpeculativeOptimizer, NvmeSpaceIsTheSameAfterAHundredStepsWithRollbacks) {
  TempDir dir("spec-nvme");
  auto comm = self();
  RunSpec spec{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .sub_group = 1024,
               .speculative = true};
  // A clip near the norms the run sees: some steps commit, some roll back.
  RunSpec probe = spec;
  probe.speculative = false;
  std::vector<double> n = train(*comm, *comm, probe, 100, dir.path).norms;
  std::nth_element(n.begin(), n.begin() + n.size() / 2, n.end());
  spec.clip = static_cast<float>(n[n.size() / 2]);
  spec.poison_step = 50;
  const RunResult one = train(*comm, *comm, spec, 1, dir.path);
  const RunResult hundred = train(*comm, *comm, spec, 100, dir.path);
  EXPECT_GT(hundred.stats.speculation_rollbacks, 10u);
  EXPECT_GT(hundred.stats.speculation_commits, 10u);
  const int nv = int(Tier::Nvme);
  EXPECT_EQ(hundred.stats.store.tiers[nv].used, one.stats.store.tiers[nv].used);
  EXPECT_LE(hundred.stats.store.tiers[nv].peak, hundred.stats.store.tiers[nv].budget);
  EXPECT_EQ(hundred.stats.store.failed_moves, 0u);
  // The states were fetched a group ahead (ZeroEngine::prefetch_first_states), and the
  // space stayed exact with those fetches in flight.
  EXPECT_GT(hundred.stats.early_state_fetches, 0u);
  EXPECT_EQ(hundred.stats.early_state_fetches_skipped, 0u);
}

// The GPU optimizer's path (ZeroEngine::update_on_device: each sub-group one
// Stream::adam_step on the optimizer stream, states in device memory, initialisation and
// restores through pinned copies) on the cpu backend, where the stream runs
// adam_step_host: the same bits as CpuAdam stepping the device tier in place, after every
// step, plain and speculative, in every stage, in fp32 (the MLP) and bf16 (the GPT), with
// clipping on some steps and a NaN gradient on one. The cuda kernel runs the same math
// (core/math/adam.hpp); on a GPU, Train.CudaGpuOptimizerMatchesCpuAdam checks it.
TEST(GpuOptimizerPath, BitIdenticalToCpuAdamInEveryStage) {
  TempDir dir("gpu-optimizer");
  auto comm = self();
  for (DType p : {DType::F32, DType::BF16})
    for (int stage : {1, 2, 3})
      for (bool speculative : {false, true}) {
        const Runner run = p == DType::F32 ? Runner(run_mlp) : Runner(run_gpt);
        const int steps = p == DType::F32 ? 12 : 8;
        RunSpec base{.stage = stage, .optimizer = OffloadDevice::None, .clip = 0.0f, .sub_group = 1024,
                     .precision = p, .speculative = speculative, .snapshots = true};
        base.clip = median_norm(run, *comm, base, steps, dir.path);  // some steps clip, some do not
        base.poison_step = steps / 2;
        RunSpec gpu = base;
        gpu.optimizer_on_stream = true;
        const RunResult want = run(*comm, base, steps, dir.path);
        const RunResult got = run(*comm, gpu, steps, dir.path);
        const std::string label = gpu.label();
        ASSERT_NO_FATAL_FAILURE(expect_same_states(got, want, steps, label));
        EXPECT_FALSE(got.stepped[steps / 2]) << label << ": the NaN step was not skipped";
        if (speculative) {
          EXPECT_GT(got.stats.speculation_commits, 0u) << label;
        }
      }
}

// offload_optimizer.ratio (Twin-Flow): the groups past the ratio keep their states in
// device memory and the GPU optimizer steps them (here: the cpu stream, concurrently with
// CPU Adam on the main thread) while CPU Adam steps the rest from pinned memory or NVMe.
// The bits are those of CPU Adam stepping everything, after every step, in every stage,
// plain and speculative, with clipping on some steps and a NaN gradient; the layout puts
// the split where the ratio says. Without a GPU optimizer (the cpu backend as it is), a
// ratio below 1 is a clear error.
TEST(GpuOptimizerPath, RatioSplitsTheStatesAndGivesCpuAdamsBits) {
  TempDir dir("ratio");
  auto comm = self();
  for (DType p : {DType::F32, DType::BF16})
    for (int stage : {1, 2, 3})
      for (double ratio : {0.5, 0.0})
        for (bool speculative : {false, true}) {
          const Runner run = p == DType::F32 ? Runner(run_mlp) : Runner(run_gpt);
          const int steps = p == DType::F32 ? 12 : 8;
          // NVMe for the host share in fp32, pinned memory in bf16.
          const OffloadDevice home = p == DType::F32 ? OffloadDevice::Nvme : OffloadDevice::Cpu;
          RunSpec base{.stage = stage, .optimizer = home, .clip = 0.0f, .sub_group = 1024, .precision = p,
                       .speculative = speculative, .snapshots = true, .pinned_budget = 4 << 20};
          base.clip = median_norm(run, *comm, base, steps, dir.path);
          base.poison_step = steps / 2;
          RunSpec split = base;
          split.optimizer_on_stream = true;
          split.optimizer_ratio = ratio;
          const RunResult want = run(*comm, base, steps, dir.path);
          const RunResult got = run(*comm, split, steps, dir.path);
          ASSERT_NO_FATAL_FAILURE(expect_same_states(got, want, steps, split.label()));
        }
  // Where the split falls: the groups from the first past half of the shard elements.
  std::vector<GroupSize> sizes;
  for (int g = 0; g < 6; ++g) sizes.push_back({"g" + std::to_string(g), 10'000});
  ShardStrategy st;
  st.optimizer_home = Tier::Pinned;
  st.optimizer_ratio = 0.5;
  const ShardLayout L = make_shard_layout(sizes, st);
  for (int g = 0; g < 6; ++g)
    EXPECT_EQ(L.groups[g].optimizer_home, g < 3 ? Tier::Pinned : Tier::Device) << "group " << g;
  EXPECT_GT(L.need[int(Tier::Device)].optimizer, 0u);
  EXPECT_GT(L.need[int(Tier::Pinned)].optimizer, 0u);
  st.optimizer_ratio = 0.0;
  for (const GroupLayout& g : make_shard_layout(sizes, st).groups) EXPECT_EQ(g.optimizer_home, Tier::Device);
  st.optimizer_home = Tier::Device;
  st.optimizer_ratio = 0.5;
  EXPECT_THROW(make_shard_layout(sizes, st), ConfigError);
  // The cpu backend has no GPU optimizer: a ratio below 1 says so.
  RunSpec cpu{.stage = 3, .optimizer = OffloadDevice::Cpu};
  cpu.optimizer_ratio = 0.5;
  try {
    run_mlp(*comm, cpu, 1, dir.path);
    ADD_FAILURE() << "a ratio below 1 on the cpu backend was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.ratio below 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("strata.backend cuda"), std::string::npos) << e.what();
  }
}
