// The shard layout (runtime/shard_layout.hpp) is the one place that decides padding,
// shards, sub-groups and per-tier bytes. Each test changes one rule there and checks that
// the engine (what it registers with the store), the planner (what it counts) and the
// simulator (the real engine under the plan's budgets) all follow, against sizes the
// test works out itself from the rule's statement.
#include <gtest/gtest.h>

#include <stdexcept>

#include "strata/collectives/sim_communicator.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"
#include "strata/runtime/plan/plan_detail.hpp"
#include "strata/runtime/engine/shard_layout.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

using namespace strata;
using namespace strata::plan;

namespace {

// A GPT whose groups are not multiples of 4 x 4096 elements, so the alignment shows.
GptShape small_gpt() {
  GptShape s;
  s.layers = 3;
  s.d_model = 200;
  s.heads = 4;
  s.seq_len = 48;
  s.vocab = 1000;
  return s;
}

ClusterSpec four_gpus() {
  ClusterSpec c = find_cluster_preset("dgx-2");
  c.gpus_per_node = 4;
  return c;
}

Strategy pinned_everything(uint64_t align, uint64_t sub_group = 0) {
  Strategy st;
  st.stage = 3;
  st.offload_param = OffloadDevice::Cpu;
  st.offload_optimizer = OffloadDevice::Cpu;
  st.shard_align_elems = align;
  st.sub_group_elems = sub_group;
  return st;
}

uint64_t round_up(uint64_t x, uint64_t unit) { return (x + unit - 1) / unit * unit; }

// Sizes from the rule as documented: groups padded to world x align elements, fp32,
// every home copy rounded up to the tier's 4 KiB allocation unit.
struct Expected {
  std::vector<uint64_t> shard;  // elements per group
  uint64_t param_bytes = 0;     // the parameter shards' homes
};
Expected expected(const GptShape& s, int world, uint64_t align) {
  Expected e;
  for (const GptGroup& g : gpt_groups(s)) {
    const uint64_t shard = round_up(g.numel, world * align) / world;
    e.shard.push_back(shard);
    e.param_bytes += round_up(4 * shard, 4096);
  }
  return e;
}

// The real engine on the sim backend with the plan's options, rank 0 of the plan's world.
struct SimEngine {
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> comm;
  std::unique_ptr<ZeroEngine> engine;
  explicit SimEngine(const Plan& p) {
    device = make_sim_device(p.cost);
    comm = coll::make_sim_communicator(0, p.world, p.cost);
    std::vector<GroupSpec> specs;
    for (const GptGroup& g : gpt_groups(p.shape)) specs.push_back({g.name, g.numel, InitKind::Normal, 0.02f, {}});
    EngineOptions eo = p.engine;
    eo.optimizer_threads = 1;
    engine = std::make_unique<ZeroEngine>(*device, *comm, *comm, eo, specs);
  }
  uint64_t owned(Tier t, const std::string& owner) const {
    const EngineStats stats = engine->stats();  // by value: keep it alive while reading
    const auto& by = stats.store.tiers[int(t)].by_owner;
    auto it = by.find(owner);
    return it == by.end() ? 0 : it->second;
  }
};

}  // namespace

TEST(ShardLayout, TheAlignmentReachesTheEngineThePlannerAndTheSimulator) {
  const GptShape s = small_gpt();
  const ClusterSpec c = four_gpus();
  const Plan p1 = make_plan(s, c, pinned_everything(1024));
  const Plan p4 = make_plan(s, c, pinned_everything(4096));
  ASSERT_TRUE(p1.fits && p4.fits);
  for (const auto& [p, align] : {std::pair<const Plan&, uint64_t>{p1, 1024}, {p4, 4096}}) {
    const Expected e = expected(s, 4, align);
    SCOPED_TRACE("align " + std::to_string(align));
    // The planner counts the rule's bytes.
    EXPECT_EQ(p.tiers[1].need.params, double(e.param_bytes));
    // The engine registers exactly those shards, and its store holds what the plan counted.
    SimEngine se(p);
    for (size_t g = 0; g < e.shard.size(); ++g) EXPECT_EQ(se.engine->shard_numel(int(g)), e.shard[g]) << g;
    EXPECT_EQ(double(se.owned(Tier::Pinned, "params")), p.tiers[1].need.params);
    EXPECT_EQ(double(se.owned(Tier::Pinned, "optimizer")), p.tiers[1].need.optimizer);
    EXPECT_EQ(double(se.owned(Tier::Pinned, "gradients")), p.tiers[1].need.grads);
    // The simulator's engine holds at least its homes and stays in the plan's budget.
    const SimulateReport r = simulate_plan(p, 1);
    EXPECT_GE(double(r.peak[1]), p.tiers[1].need.params + p.tiers[1].need.optimizer + p.tiers[1].need.grads);
    EXPECT_LE(r.peak[1], r.budget[1]);
  }
  // A test that cannot fail is a defect: the two alignments give different layouts here.
  EXPECT_GT(p4.tiers[1].need.params, p1.tiers[1].need.params);
}

TEST(ShardLayout, TheSubGroupRuleReachesTheEngineAndThePlanner) {
  const GptShape s = small_gpt();
  const ClusterSpec c = four_gpus();
  // 5000 elements round down to the alignment: sub-groups of 4096.
  const Plan p = make_plan(s, c, pinned_everything(1024, 5000));
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.engine.sub_group_elems, 4096u);
  const Expected e = expected(s, 4, 1024);
  uint64_t subs = 0, max_shard = 0;
  for (uint64_t shard : e.shard) {
    subs += (shard + 4095) / 4096;
    max_shard = std::max(max_shard, shard);
  }
  SimEngine se(p);
  EXPECT_EQ(se.engine->layout().sub_group, 4096u);
  EXPECT_EQ(se.engine->layout().sub_group_count, subs);
  // Pinned staging: two sub-groups' four states and a shard, as planned and as the engine
  // checks its budget.
  EXPECT_EQ(se.engine->layout().pinned_staging, 8 * 4 * 4096 + 4 * max_shard);
  EXPECT_EQ(p.tiers[1].need.buffers, double(se.engine->layout().pinned_staging));
  // Optimizer states per sub-group: each rounded to 4 KiB on its own. fp32 stage 3 with
  // both homes pinned: the parameter shard is the master weights, so the two moments only.
  uint64_t opt = 0;
  for (const GroupLayout& g : se.engine->layout().groups) {
    EXPECT_TRUE(g.master_in_shard) << g.name;
    for (const SubGroup& sg : g.sub_groups) opt += 2 * round_up(4 * sg.n, 4096);
  }
  EXPECT_EQ(double(se.owned(Tier::Pinned, "optimizer")), double(opt));
  EXPECT_EQ(p.tiers[1].need.optimizer, double(opt));
}

// Where the parameter shard is the master weights (GroupLayout::master_in_shard): fp32
// stage 3, parameters and optimizer states in one tier, stepped by CPU Adam, and a group's
// sub-groups all speculative or none. Such a group registers no Master, and a speculative
// one a single MasterNext of its whole shard; the homes' bytes drop by the masters.
TEST(ShardLayout, TheParameterShardIsTheMasterWeightsWhereOneTierHoldsBoth) {
  // Three groups of 8, 20 and 3 units of 1024 elements; sub-groups of 8 units.
  const std::vector<GroupSize> sizes = {{"a", 8 * 1024}, {"b", 20 * 1024}, {"c", 3 * 1024}};
  ShardStrategy st;
  st.world = 1;
  st.stage = 3;
  st.param_home = st.optimizer_home = Tier::Nvme;
  st.rules.sub_group_elems = 8 * 1024;
  auto count = [](const GroupLayout& g, StateRole r) {
    return std::count_if(g.tensors.begin(), g.tensors.end(), [&](const StateTensor& t) { return t.role == r; });
  };
  const ShardLayout L = make_shard_layout(sizes, st);
  ASSERT_EQ(L.groups[1].sub_groups.size(), 3u);
  for (const GroupLayout& g : L.groups) {
    EXPECT_TRUE(g.master_in_shard) << g.name;
    EXPECT_EQ(count(g, StateRole::Master), 0) << g.name;
    EXPECT_EQ(count(g, StateRole::ParamShard), 1) << g.name;
    EXPECT_EQ(count(g, StateRole::ExpAvg), long(g.sub_groups.size())) << g.name;
  }
  // 31 units of 4 KiB: params once, two moments, the gradient (fp32: 16 bytes an element).
  EXPECT_EQ(L.need[int(Tier::Nvme)].params + L.need[int(Tier::Nvme)].optimizer, 3u * 31 * 4096);

  // Each condition off in turn gives every group its own master weights again.
  auto all_own = [&](ShardStrategy s, const char* why) {
    const ShardLayout M = make_shard_layout(sizes, s);
    for (const GroupLayout& g : M.groups) {
      EXPECT_FALSE(g.master_in_shard) << why << ": " << g.name;
      EXPECT_EQ(count(g, StateRole::Master), long(g.sub_groups.size())) << why << ": " << g.name;
    }
  };
  ShardStrategy bf16 = st;
  bf16.working = bf16.grads = DType::BF16;
  all_own(bf16, "a 16-bit working copy is not the fp32 masters");
  ShardStrategy homes = st;
  homes.optimizer_home = Tier::Pinned;
  all_own(homes, "parameters on NVMe, optimizer pinned");
  ShardStrategy stage2 = st;
  stage2.stage = 2;
  all_own(stage2, "stages 1 and 2 replicate the parameters");
  ShardStrategy gpu = st;
  gpu.param_home = gpu.optimizer_home = Tier::Device;
  gpu.device_states_staged = true;
  all_own(gpu, "the GPU optimizer");
  ShardStrategy cpu_device = gpu;
  cpu_device.device_states_staged = false;  // the cpu backend's device is host memory: CPU Adam
  for (const GroupLayout& g : make_shard_layout(sizes, cpu_device).groups) EXPECT_TRUE(g.master_in_shard) << g.name;

  // Speculation: the last 4 of the 5 sub-groups (b's three and c) have a Next set. b and c
  // are whole: one MasterNext of their shard; a is not speculative. With 2, b is split
  // between the two and keeps its own masters and a MasterNext per speculative sub-group.
  ShardStrategy spec = st;
  spec.speculative_sub_groups = 4;
  const ShardLayout S = make_shard_layout(sizes, spec);
  for (const GroupLayout& g : S.groups) EXPECT_TRUE(g.master_in_shard) << g.name;
  EXPECT_EQ(count(S.groups[0], StateRole::MasterNext), 0);
  for (int i : {1, 2}) {
    EXPECT_EQ(count(S.groups[i], StateRole::MasterNext), 1);
    for (const StateTensor& t : S.groups[i].tensors) {
      if (t.role == StateRole::MasterNext) {
        EXPECT_EQ(t.spec.bytes, 4 * S.groups[i].shard);
      }
    }
  }
  spec.speculative_sub_groups = 2;
  const ShardLayout P = make_shard_layout(sizes, spec);
  EXPECT_TRUE(P.groups[0].master_in_shard);
  EXPECT_FALSE(P.groups[1].master_in_shard) << "one of b's three sub-groups is speculative";
  EXPECT_EQ(count(P.groups[1], StateRole::Master), 3);
  EXPECT_EQ(count(P.groups[1], StateRole::MasterNext), 1);
  EXPECT_TRUE(P.groups[2].master_in_shard);
}

TEST(ShardLayout, NvmeSwapSpaceIsTheSameInThePlanAndTheEngine) {
  const GptShape s = small_gpt();
  Strategy st = pinned_everything(1024);
  st.offload_param = OffloadDevice::Nvme;
  st.offload_optimizer = OffloadDevice::Nvme;
  const Plan p = make_plan(s, four_gpus(), st);
  ASSERT_TRUE(p.fits) << p.problems.front();
  const SimulateReport r = simulate_plan(p, 1);
  EXPECT_EQ(double(r.budget[2]), p.tiers[2].need.total()) << "the swap space the engine sized vs the plan's NVMe bytes";
  EXPECT_GT(r.peak[2], 0u);
}

TEST(ShardLayout, BadRulesAreClearErrors) {
  ShardStrategy st;
  st.rules.align_elems = 1000;
  try {
    make_shard_layout({{"g", 10}}, st);
    FAIL() << "an alignment that is not a multiple of 1024 elements was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 1024"), std::string::npos) << e.what();
  }
  st.rules.align_elems = 1024;
  EXPECT_THROW(make_shard_layout({}, st), ConfigError);
  EXPECT_THROW(make_shard_layout({{"empty", 0}}, st), ConfigError);
  st.stage = 4;
  EXPECT_THROW(make_shard_layout({{"g", 10}}, st), ConfigError);
  st.stage = 3;
  st.world = 0;
  EXPECT_THROW(make_shard_layout({{"g", 10}}, st), ConfigError);
}

// A frozen group is its parameters alone, in every stage: the working parameter shard (and
// stage 3's gather buffer, or stages 1 and 2's replicated parameters), no gradient tensor,
// no sub-group, no master weights or moments; and the tiers count only those bytes.
TEST(ShardLayout, AFrozenGroupHoldsItsParametersAlone) {
  for (int stage : {1, 2, 3}) {
    ShardStrategy st;
    st.world = 2;
    st.stage = stage;
    st.param_home = Tier::Pinned;
    st.optimizer_home = Tier::Pinned;
    st.working = DType::BF16;
    st.grads = DType::BF16;
    const uint64_t n = 8 * 2048;  // 8 units of world x alignment: no padding
    const ShardLayout frozen = make_shard_layout({{"base", n, true}, {"adapter", 2048, false}}, st);
    const ShardLayout trained = make_shard_layout({{"base", n, false}, {"adapter", 2048, false}}, st);
    const GroupLayout& g = frozen.groups[0];
    EXPECT_TRUE(g.frozen);
    EXPECT_FALSE(frozen.groups[1].frozen);
    EXPECT_TRUE(g.sub_groups.empty()) << "stage " << stage;
    EXPECT_FALSE(g.master_in_shard);
    std::vector<StateRole> roles;
    for (const StateTensor& t : g.tensors) roles.push_back(t.role);
    const std::vector<StateRole> want = stage == 3 ? std::vector{StateRole::GatherBuffer, StateRole::ParamShard}
                                                   : std::vector{StateRole::ReplicatedParams};
    EXPECT_EQ(roles, want) << "stage " << stage;
    EXPECT_EQ(frozen.sub_group_count, trained.sub_group_count - trained.groups[0].sub_groups.size());
    EXPECT_EQ(frozen.trained_shard_total, 1024u);
    // Stage 3's parameter shards live in pinned memory, 2 bytes per element either way;
    // the states and gradient sub-groups (12 + 2 bytes per shard element) only for the
    // trained base.
    const int where = stage == 3 ? int(Tier::Pinned) : int(Tier::Device);
    EXPECT_EQ(frozen.need[where].params, trained.need[where].params) << "stage " << stage;
    const uint64_t base_shard = n / 2;
    EXPECT_EQ(trained.need[int(Tier::Pinned)].optimizer - frozen.need[int(Tier::Pinned)].optimizer, 12 * base_shard);
    const uint64_t grads_saved = stage == 1 ? 2 * n : 2 * base_shard;  // stage 1: the accumulated full gradient
    const int grads_at = stage == 1 ? int(Tier::Device) : int(Tier::Pinned);
    EXPECT_EQ(trained.need[grads_at].grads - frozen.need[grads_at].grads, grads_saved) << "stage " << stage;
  }
}

// ZeRO++ hpZ (ShardStrategy::hpz): stage 3 keeps, beside each parameter shard, a
// secondary partition of padded / hpz elements of the working type in the parameter
// shard's home (params bytes), except for persistent groups (gathered once, kept); a
// gather reads it, so the device's working set passes the larger of the two through.
// Anything but stage 3 and a divisor of the world is refused, naming the fix.
TEST(ShardLayout, HpzAddsASecondaryPartitionInTheParameterHome) {
  ShardStrategy st;
  st.world = 8;
  st.stage = 3;
  st.param_home = Tier::Nvme;
  st.optimizer_home = Tier::Pinned;
  st.working = DType::BF16;
  st.grads = DType::BF16;
  st.rules.persistence_threshold_elems = 100;
  const uint64_t n = 16 * 8192;  // 16 units of world x alignment: no padding
  const std::vector<GroupSize> groups{{"block", n}, {"norm", 64}, {"base", n, true}};
  const ShardLayout flat = make_shard_layout(groups, st);
  st.hpz = 4;
  const ShardLayout hpz = make_shard_layout(groups, st);
  for (size_t g : {0u, 2u}) {
    const StateTensor& secondary = [&]() -> const StateTensor& {
      for (const StateTensor& t : hpz.groups[g].tensors)
        if (t.role == StateRole::ParamSecondary) return t;
      throw std::runtime_error("no secondary partition in group " + hpz.groups[g].name);
    }();
    EXPECT_EQ(secondary.spec.bytes, n / 4 * 2) << hpz.groups[g].name;
    EXPECT_EQ(secondary.spec.home, Tier::Nvme);
    EXPECT_FALSE(secondary.spec.scratch);
  }
  for (const StateTensor& t : hpz.groups[1].tensors)
    EXPECT_NE(t.role, StateRole::ParamSecondary) << "a persistent group has no secondary";
  EXPECT_EQ(hpz.need[int(Tier::Nvme)].params - flat.need[int(Tier::Nvme)].params, 2 * (n / 4 * 2));
  EXPECT_EQ(hpz.need[int(Tier::Pinned)].homes(), flat.need[int(Tier::Pinned)].homes());
  // The source passing through: padded / 4 instead of padded / 8, bf16.
  EXPECT_EQ(hpz.device_working - flat.device_working, n / 4 * 2 - n / 8 * 2);

  auto refused = [&](ShardStrategy s, const std::string& want) {
    try {
      make_shard_layout(groups, s);
      ADD_FAILURE() << "accepted: " << want;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  ShardStrategy s = st;
  s.hpz = 3;
  refused(s, "zero_hpz_partition_size 3 does not divide the 8 ranks");
  s = st;
  s.stage = 2;
  s.param_home = Tier::Device;
  refused(s, "zero_hpz_partition_size 4 partitions stage 3's parameters, and the stage is 2");
  s = st;
  s.hpz = 0;
  refused(s, "zero_hpz_partition_size 0 is below 1");
}

// qwZ's quantization runs as host work over the device's memory: an engine on a device
// whose parameters are not host bytes (sim here; cuda likewise) refuses it at start-up,
// naming the fix, and the layout counts its buffers only at stage 3.
TEST(ShardLayout, QuantizedWeightsAreRefusedWhereTheirHostWorkCannotRun) {
  auto device = make_sim_device(SimCostModel{});
  auto comm = coll::make_sim_communicator(0, 2, SimCostModel{});
  EngineOptions eo;
  eo.stage = 3;
  eo.quantized_weights_block = 256;
  eo.store.device_budget = eo.store.pinned_budget = 64 << 20;
  try {
    ZeroEngine engine(*device, *comm, *comm, eo, {{"g", 4096, InitKind::Normal, 0.02f, {}}});
    ADD_FAILURE() << "qwZ ran on the sim backend";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_quantized_weights runs on the cpu backend only"), std::string::npos)
        << e.what();
  }
  ShardStrategy st;
  st.world = 2;
  st.stage = 2;
  st.quantized_block = 256;
  EXPECT_THROW(make_shard_layout({{"g", 4096}}, st), ConfigError);
  st.stage = 3;
  const ShardLayout L = make_shard_layout({{"g", 4096}}, st);
  bool found = false;
  for (const StateTensor& t : L.groups[0].tensors)
    if (t.role == StateRole::QuantizedGather) {
      found = true;
      EXPECT_EQ(t.spec.bytes, 3 * quantized_bytes(2048, 256));  // this rank's shard and both ranks'
      EXPECT_TRUE(t.spec.scratch);
    }
  EXPECT_TRUE(found);
}

// qgZ's scratch: per group that reduce-scatters (stages 2 and 3), device scratch of the
// world's parts sent and received and the fp32 sums, more with two hops; counted in the
// device's working set; refused at stage 1, where nodes do not divide the world, and on a
// device whose memory the host cannot reach.
TEST(ShardLayout, QuantizedGradientsAddAReduceScratchAndAreRefusedWhereTheyCannotRun) {
  auto device = make_sim_device(SimCostModel{});
  auto comm = coll::make_sim_communicator(0, 2, SimCostModel{});
  EngineOptions eo;
  eo.stage = 3;
  eo.quantized_gradients_block = 256;
  eo.store.device_budget = eo.store.pinned_budget = 64 << 20;
  try {
    ZeroEngine engine(*device, *comm, *comm, eo, {{"g", 4096, InitKind::Normal, 0.02f, {}}});
    ADD_FAILURE() << "qgZ ran on the sim backend";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_quantized_gradients runs on the cpu backend only"), std::string::npos)
        << e.what();
  }
  ShardStrategy st;
  st.world = 8;
  st.quantized_gradients_block = 256;
  st.stage = 1;
  EXPECT_THROW(make_shard_layout({{"g", 8192}}, st), ConfigError);
  st.stage = 3;
  st.gradient_nodes = 3;
  EXPECT_THROW(make_shard_layout({{"g", 8192}}, st), ConfigError);
  const uint64_t q = quantized_bytes(1024, 256);
  for (int stage : {2, 3})
    for (int nodes : {1, 2, 8}) {
      st.stage = stage;
      st.gradient_nodes = nodes;
      const ShardLayout L = make_shard_layout({{"g", 8192}}, st);
      ShardStrategy plain = st;
      plain.quantized_gradients_block = 0;
      const ShardLayout P = make_shard_layout({{"g", 8192}}, plain);
      // One hop (one node, or a node a rank): the parts and one fp32 shard; two: a shard
      // and a part sent and received per node besides.
      const uint64_t expect = nodes == 2 ? 2 * 8 * q + 2 * (4 * 1024 + 2 * q) : 2 * 8 * q + 4 * 1024;
      int found = 0;
      for (const StateTensor& t : L.groups[0].tensors)
        if (t.role == StateRole::QuantizedReduce) {
          ++found;
          EXPECT_EQ(t.spec.bytes, expect) << "stage " << stage << ", " << nodes << " nodes";
          EXPECT_TRUE(t.spec.scratch);
          EXPECT_EQ(t.spec.home, Tier::Device);
        }
      EXPECT_EQ(found, 1) << "stage " << stage << ", " << nodes << " nodes";
      EXPECT_EQ(L.device_working, P.device_working + expect) << "stage " << stage << ", " << nodes << " nodes";
    }
}

// A quantized collective whose scratch would pass the cap goes in chunks of whole blocks
// through two buffers, within the cap; a small one goes whole; and the layout's tensor and
// working set follow.
TEST(ShardLayout, QuantizedScratchIsCutIntoChunksWithinTheCap) {
  const uint64_t block = 256, n = 1 << 20, cap = 1 << 20;
  const QuantizedChunks whole = qgz_chunks(n, 8, 2, block, uint64_t{1} << 40);
  EXPECT_EQ(whole.elems, n);
  EXPECT_EQ(whole.buffers, 1);
  EXPECT_EQ(whole.bytes, qgz_scratch_bytes(n, 8, 2, block));
  for (const QuantizedChunks& c : {qgz_chunks(n, 8, 2, block, cap), qgz_chunks(n, 8, 1, block, cap),
                                   qwz_chunks(n, 8, block, cap)}) {
    EXPECT_EQ(c.buffers, 2);
    EXPECT_EQ(c.elems % block, 0u);
    EXPECT_LE(c.bytes, cap);
    EXPECT_GT(c.bytes, cap / 2) << "the chunks are as large as the cap allows";
    EXPECT_EQ(c.count(n), (n + c.elems - 1) / c.elems);
  }
  EXPECT_EQ(qgz_chunks(n, 8, 2, block, cap).bytes, 2 * qgz_scratch_bytes(qgz_chunks(n, 8, 2, block, cap).elems, 8, 2, block));
  // One block's scratch above the cap: a block at a time, the cap exceeded by what one needs.
  EXPECT_EQ(qgz_chunks(n, 8, 2, block, 100).elems, block);
  ShardStrategy st;
  st.world = 8;
  st.stage = 3;
  st.quantized_block = block;
  st.quantized_gradients_block = block;
  st.gradient_nodes = 2;
  st.quantized_scratch = cap;
  const ShardLayout L = make_shard_layout({{"g", 8 * n}}, st);
  for (const StateTensor& t : L.groups[0].tensors) {
    if (t.role == StateRole::QuantizedReduce) EXPECT_EQ(t.spec.bytes, qgz_chunks(n, 8, 2, block, cap).bytes);
    if (t.role == StateRole::QuantizedGather) EXPECT_EQ(t.spec.bytes, qwz_chunks(n, 8, block, cap).bytes);
  }
}
