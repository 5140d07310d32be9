// ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size) under mpirun -np 4: stage 3 with
// secondary partitions over groups of 2 consecutive ranks, against flat stage 3 over the
// 4 ranks with the same data. hpZ changes which ranks a gather reads, not what it
// gathers, so the runs must match bit for bit; the bytes say the gathers moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpt_harness.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/runtime/plan/plan.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

coll::Communicator& world() { return mpi_world(); }

std::unique_ptr<coll::Communicator> groups_of(int n) {
  coll::Communicator& w = world();
  return coll::split(w, w.rank() / n, w.rank() % n);
}

double worst_rel(const RunResult& got, const RunResult& ref) {
  double worst = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    worst = std::max(worst, std::abs(got.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
  return worst;
}

void expect_same_run(const RunResult& hpz, const RunResult& flat, const std::string& what) {
  ASSERT_EQ(hpz.losses.size(), flat.losses.size()) << what;
  // The bound is 1e-5 relative; hpZ reorders no arithmetic, so the runs are equal.
  EXPECT_EQ(worst_rel(hpz, flat), 0.0) << what;
  EXPECT_EQ(hpz.norms, flat.norms) << what;
  EXPECT_EQ(hpz.weights, flat.weights) << what << ": final weights differ";
  EXPECT_LT(hpz.losses.back(), hpz.losses.front()) << what;
}

void expect_gathers_moved(const RunResult& hpz, const RunResult& flat, const std::string& what) {
  // Flat gathers every time over all ranks; hpZ once per change of the parameters, the
  // rest within its group.
  EXPECT_EQ(flat.stats.secondary_collective_bytes, 0u) << what;
  EXPECT_GT(hpz.stats.secondary_collective_bytes, 0u) << what;
  EXPECT_LT(hpz.stats.shard_collective_bytes, flat.stats.shard_collective_bytes) << what;
  EXPECT_EQ(hpz.stats.gathers, flat.stats.gathers) << what << ": as many gathers, from other ranks";
}

void report(const RunResult& hpz, const RunResult& flat, const std::string& what) {
  if (world().rank() != 0) return;
  std::printf("hpz 2 of %d, %s: loss %.5f -> %.5f, max rel diff to flat %.2e; bytes over every rank %llu "
              "(flat %llu), within the group %llu\n",
              world().size(), what.c_str(), hpz.losses.front(), hpz.losses.back(), worst_rel(hpz, flat),
              static_cast<unsigned long long>(hpz.stats.shard_collective_bytes),
              static_cast<unsigned long long>(flat.stats.shard_collective_bytes),
              static_cast<unsigned long long>(hpz.stats.secondary_collective_bytes));
}

void hpz_follows_flat(const std::vector<RunSpec>& specs) {
  coll::Communicator& w = world();
  ASSERT_EQ(w.size() % 2, 0) << "run this under mpirun with an even number of ranks";
  auto g = groups_of(2);
  TempDir dir("hpz-r" + std::to_string(w.rank()));
  for (const RunSpec& spec : specs) {
    const RunResult flat = train_gpt(w, w, spec, 20, dir.path.string());
    const RunResult hpz = train_gpt(w, w, spec, 20, dir.path.string(), false, small_gpt(), nullptr, g.get());
    expect_same_run(hpz, flat, spec.label());
    expect_gathers_moved(hpz, flat, spec.label());
    report(hpz, flat, spec.label());
  }
}

}  // namespace

TEST(HpzMpi, GroupsOfTwoFollowFlatStageThreeEveryOffload) {
  std::vector<RunSpec> specs;
  for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme})
    specs.push_back({.stage = 3, .param = off, .optimizer = off, .precision = DType::F32});
  hpz_follows_flat(specs);
}

TEST(HpzMpi, SixteenBitAccumulationAndSpeculationFollowFlat) {
  RunSpec bf16{.stage = 3, .param = OffloadDevice::Cpu, .optimizer = OffloadDevice::Cpu, .precision = DType::BF16};
  RunSpec accum{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .accum = 2,
                .precision = DType::F32};
  RunSpec spec{.stage = 3, .param = OffloadDevice::Cpu, .optimizer = OffloadDevice::Cpu, .precision = DType::BF16,
               .speculative = true};
  hpz_follows_flat({bf16, accum, spec});
}

// With accumulation, the micro-steps after the first gather from the secondaries too: the
// bytes over every rank are those of accumulation 1 plus the extra reduce-scatters.
TEST(HpzMpi, LaterMicroStepsGatherWithinTheGroup) {
  coll::Communicator& w = world();
  auto g = groups_of(2);
  TempDir dir("hpz-accum-r" + std::to_string(w.rank()));
  RunSpec one{.stage = 3, .precision = DType::F32};
  RunSpec four = one;
  four.accum = 4;
  const RunResult a1 = train_gpt(w, w, one, 5, dir.path.string(), false, small_gpt(), nullptr, g.get());
  const RunResult a4 = train_gpt(w, w, four, 5, dir.path.string(), false, small_gpt(), nullptr, g.get());
  const RunResult flat1 = train_gpt(w, w, one, 5, dir.path.string());
  const RunResult flat4 = train_gpt(w, w, four, 5, dir.path.string());
  // Over every rank: one gather per group and step however many micro-steps, and one
  // reduce-scatter per micro-step. So hpZ's growth from 1 to 4 micro-steps is three
  // steps' reduce-scatters, and flat's is that plus three steps' gathers.
  EXPECT_GT(a4.stats.secondary_collective_bytes, 3 * a1.stats.secondary_collective_bytes);
  EXPECT_LT(a4.stats.shard_collective_bytes - a1.stats.shard_collective_bytes,
            flat4.stats.shard_collective_bytes - flat1.stats.shard_collective_bytes);
  expect_same_run(a4, flat4, four.label());
}

// The planner's prediction of the bytes each rank sends (Plan::*_collective_bytes), for
// the same GPT, world, node layout and strategy, against the engine's counters over the
// training steps: flat and MiCS 2 at every stage, hpZ 2 at stage 3, qwZ (stage 3), qgZ in
// two hops (stages 2 and 3) and ZeRO++ whole (hpZ, qwZ and qgZ), accumulation 1 and 4.
// The issue asks for 15%; the planner counts the engine's gathers and reductions one by
// one, so they agree exactly.
TEST(HpzMpi, ThePlannerPredictsTheBytesTheEngineSends) {
  coll::Communicator& w = world();
  ASSERT_EQ(w.size(), 4) << "run this under mpirun -np 4";
  auto hpz = groups_of(2);
  auto shard = groups_of(2);
  auto replicas = coll::split(w, w.rank() % 2, w.rank() / 2);
  TempDir dir("hpz-plan-r" + std::to_string(w.rank()));
  plan::ClusterSpec cluster = plan::find_cluster_preset("dgx-a100");
  cluster.gpus_per_node = 2;
  cluster.nodes = 2;
  const int steps = 3;
  for (int accum : {1, 4})
    for (int stage : {1, 2, 3})
    for (const std::string layout : {"flat", "mics", "hpz", "qwz", "qgz", "zero++"}) {
      // ZeRO++ whole: hpZ, qwZ and qgZ (two hops: the engine's ranks_per_node 2, as the
      // cluster's nodes of 2).
      const bool mics = layout == "mics", is_hpz = layout == "hpz" || layout == "zero++";
      const bool qwz = layout == "qwz" || layout == "zero++", qgz = layout == "qgz" || layout == "zero++";
      if ((stage < 3 && (is_hpz || qwz)) || (stage < 2 && qgz)) continue;
      RunSpec spec{.stage = stage, .accum = accum, .precision = DType::BF16};
      spec.quantized_block = qwz ? 256 : 0;
      spec.quantized_gradients_block = qgz ? 256 : 0;
      spec.ranks_per_node = 2;
      const std::string what = layout + ", stage " + std::to_string(stage) + ", accumulation " + std::to_string(accum);
      const RunResult run =
          mics ? train_gpt(*shard, *shard, spec, steps, dir.path.string(), false, small_gpt(), replicas.get())
               : train_gpt(w, w, spec, steps, dir.path.string(), false, small_gpt(), nullptr,
                           is_hpz ? hpz.get() : nullptr);
      plan::Strategy st;
      st.stage = stage;
      st.offload_param = st.offload_optimizer = OffloadDevice::None;
      st.precision = DType::BF16;
      st.micro_batch = kGptGlobalBatch / w.size();
      st.grad_accum = accum;
      st.checkpointing = false;
      st.mics_shard_size = mics ? 2 : 0;
      st.hpz = is_hpz ? 2 : 1;
      st.qwz = qwz;
      st.qgz = qgz;
      const plan::Plan p = plan::make_plan(small_gpt(), cluster, st);
      auto near = [&](double predicted, uint64_t measured, const char* counter) {
        const double per_step = double(measured) / steps;
        if (per_step == 0) {
          EXPECT_EQ(predicted, 0.0) << what << ": " << counter;
          return;
        }
        EXPECT_NEAR(predicted / per_step, 1.0, 1e-9)
            << what << ": " << counter << " predicted " << predicted << ", the engine sent " << per_step;
      };
      near(p.shard_collective_bytes, run.train_stats.shard_collective_bytes, "over the shard's ranks");
      near(p.replica_collective_bytes, run.train_stats.replica_collective_bytes, "across the MiCS groups");
      near(p.secondary_collective_bytes, run.train_stats.secondary_collective_bytes, "within the hpZ groups");
      near(p.node_collective_bytes, run.train_stats.node_collective_bytes, "qgZ within the node");
      near(p.cross_collective_bytes, run.train_stats.cross_collective_bytes, "qgZ across the nodes");
      if (w.rank() == 0)
        std::printf("%s: bytes a step predicted / sent: shard %.0f / %.0f, replicas %.0f / %.0f, secondary %.0f / %.0f,"
                    " node %.0f / %.0f, cross %.0f / %.0f; between nodes predicted %.0f\n",
                    what.c_str(), p.shard_collective_bytes, double(run.train_stats.shard_collective_bytes) / steps,
                    p.replica_collective_bytes, double(run.train_stats.replica_collective_bytes) / steps,
                    p.secondary_collective_bytes, double(run.train_stats.secondary_collective_bytes) / steps,
                    p.node_collective_bytes, double(run.train_stats.node_collective_bytes) / steps,
                    p.cross_collective_bytes, double(run.train_stats.cross_collective_bytes) / steps,
                    p.inter_node_bytes);
    }
}

// ZeRO++ qwZ (EngineOptions::quantized_weights_block): the gathers over every rank move
// int8 blocks with fp32 scales. Flat stage 3 against the same with qwZ, 20 steps of this
// toy GPT at lr 1e-2, whose trajectory the 0.6% rounding of every gathered weight moves
// (4.2% at worst in one step, measured): the losses within 5% (the 2% is over 200
// steps on text, train.hybrid_mpi), fewer bytes over every rank, and the error each rank
// measured reported, small and non-zero. With hpZ the gathers within the node stay exact.
TEST(QwzMpi, QuantizedGathersFollowFlatClosely) {
  coll::Communicator& w = world();
  auto g = groups_of(2);
  TempDir dir("qwz-r" + std::to_string(w.rank()));
  std::vector<RunSpec> specs;
  for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme})
    specs.push_back({.stage = 3, .param = off, .optimizer = off, .precision = DType::BF16});
  specs.push_back({.stage = 3, .accum = 2, .precision = DType::F32});
  for (const RunSpec& spec : specs)
    for (bool with_hpz : {false, true}) {
      RunSpec q = spec;
      q.quantized_block = 64;
      const std::string what = q.label() + (with_hpz ? ", hpZ 2" : "");
      const RunResult flat = train_gpt(w, w, spec, 20, dir.path.string());
      const RunResult got =
          train_gpt(w, w, q, 20, dir.path.string(), false, small_gpt(), nullptr, with_hpz ? g.get() : nullptr);
      const double worst = worst_rel(got, flat);
      EXPECT_LE(worst, 0.05) << what;
      EXPECT_GT(worst, 0.0) << what << ": quantized gathers that change nothing were not quantized";
      EXPECT_LT(got.losses.back(), got.losses.front()) << what;
      EXPECT_GT(got.train_stats.quantized_weights_error, 0.0) << what;
      EXPECT_LT(got.train_stats.quantized_weights_error, 0.01) << what << ": int8 blocks of 64 lose under 1%";
      EXPECT_LT(got.train_stats.shard_collective_bytes, flat.train_stats.shard_collective_bytes) << what;
      EXPECT_EQ(flat.train_stats.quantized_weights_error, 0.0);
      if (w.rank() == 0)
        std::printf("qwZ, %s: loss %.5f -> %.5f, max rel diff to flat %.2e, quantization error %.2e; bytes over "
                    "every rank %llu (flat %llu)\n",
                    what.c_str(), got.losses.front(), got.losses.back(), worst,
                    got.train_stats.quantized_weights_error,
                    static_cast<unsigned long long>(got.train_stats.shard_collective_bytes),
                    static_cast<unsigned long long>(flat.train_stats.shard_collective_bytes));
    }
}

// ZeRO++ qgZ (EngineOptions::quantized_gradients_block): each reduce-scatter moves int8
// blocks through all-to-alls and sums them in fp32. At 4 ranks as 2 nodes of 2 it runs in
// two hops (within the node, then across, the partial sums quantized again); as one node
// of 4, in one. Against flat stage 2 and 3 over the same ranks and data, 20 steps of the
// toy GPT: losses close (the 2% is over 200 steps on text, train.hybrid_mpi),
// the error reported, and the bytes: the reduce-scatters leave the world's counter for the
// node's and the cross one in two hops, and cross nodes as one int8 part per node.
// Measured: the gradient's error (of all this rank quantized for a reduce-scatter) 0.8% in
// two hops and 1.2% in one, and the loss at worst 8.0% off in one step of this toy at
// lr 1e-2 (Adam's normalised update magnifies the rounding of small gradients), 4.8% in
// fp32 with accumulation 2: the bound is 10%. ExactBlocks... below checks the reduction
// itself exactly.
TEST(QgzMpi, QuantizedReduceScattersFollowFlatClosely) {
  coll::Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks, not " << w.size();
  auto g = groups_of(2);
  TempDir dir("qgz-r" + std::to_string(w.rank()));
  struct Case {
    RunSpec spec;
    int ranks_per_node;
    bool qwz_hpz;  // with qwZ and hpZ 2 too: ZeRO++ whole
  };
  std::vector<Case> cases;
  for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme})
    cases.push_back({{.stage = 3, .param = off, .optimizer = off, .precision = DType::BF16}, 2, false});
  cases.push_back({{.stage = 3, .precision = DType::BF16}, 4, false});
  cases.push_back({{.stage = 2, .optimizer = OffloadDevice::Cpu, .precision = DType::BF16}, 2, false});
  cases.push_back({{.stage = 3, .accum = 2, .precision = DType::F32}, 2, false});
  cases.push_back({{.stage = 3, .optimizer = OffloadDevice::Cpu, .precision = DType::BF16}, 2, true});
  for (const Case& c : cases) {
    RunSpec q = c.spec;
    q.quantized_gradients_block = 64;
    q.ranks_per_node = c.ranks_per_node;
    if (c.qwz_hpz) q.quantized_block = 64;
    const std::string what = q.label() + (c.qwz_hpz ? ", hpZ 2" : "");
    const RunResult flat = train_gpt(w, w, c.spec, 20, dir.path.string());
    const RunResult got =
        train_gpt(w, w, q, 20, dir.path.string(), false, small_gpt(), nullptr, c.qwz_hpz ? g.get() : nullptr);
    const double worst = worst_rel(got, flat);
    EXPECT_LE(worst, 0.10) << what;
    EXPECT_GT(worst, 0.0) << what << ": quantized reduce-scatters that change nothing were not quantized";
    EXPECT_LT(got.losses.back(), got.losses.front()) << what;
    const EngineStats& s = got.train_stats;
    EXPECT_GT(s.quantized_gradients_error, 0.0) << what;
    EXPECT_LT(s.quantized_gradients_error, 0.02) << what << ": int8 blocks of 64 lose under 2%";
    EXPECT_EQ(flat.train_stats.quantized_gradients_error, 0.0) << what;
    if (c.ranks_per_node == 2) {
      EXPECT_GT(s.node_collective_bytes, 0u) << what;
      EXPECT_GT(s.cross_collective_bytes, 0u) << what;
      // Across the nodes: one quantized part per node; within: the world's parts.
      EXPECT_LT(s.cross_collective_bytes, s.node_collective_bytes) << what;
    } else {
      EXPECT_EQ(s.node_collective_bytes + s.cross_collective_bytes, 0u) << what << ": one node is one hop";
    }
    if (!c.qwz_hpz) {
      // The gathers are unchanged; the reduce-scatter's bytes leave for int8 all-to-alls.
      const uint64_t moved = s.shard_collective_bytes + s.node_collective_bytes + s.cross_collective_bytes;
      EXPECT_LT(moved, flat.train_stats.shard_collective_bytes) << what;
      if (c.ranks_per_node == 2) EXPECT_LT(s.shard_collective_bytes, flat.train_stats.shard_collective_bytes) << what;
    }
    if (w.rank() == 0)
      std::printf("qgZ, %s: loss %.5f -> %.5f, max rel diff to flat %.2e, quantization error %.2e; bytes: world "
                  "%llu, node %llu, cross %llu (flat: world %llu)\n",
                  what.c_str(), got.losses.front(), got.losses.back(), worst, s.quantized_gradients_error,
                  static_cast<unsigned long long>(s.shard_collective_bytes),
                  static_cast<unsigned long long>(s.node_collective_bytes),
                  static_cast<unsigned long long>(s.cross_collective_bytes),
                  static_cast<unsigned long long>(flat.train_stats.shard_collective_bytes));
  }
}

// The all-to-alls deliver every slice to its rank: gradients that int8 blocks hold exactly
// (integers up to 127 in every block, times the rank's factor r + 1, each block led by its
// largest magnitude) reduce with qgZ to exactly what the plain reduce-scatter gives, in
// two hops (the node's partial sums, 3 x and 7 x the pattern, quantize exactly again) and
// in one. The pattern differs from slice to slice, so a part sent to the wrong rank shows.
// Compared: Adam's first moment and the master weights after one fp32 step, bit for bit;
// also in chunks (a scratch of 4 KiB: a block of each slice at a time, two buffers).
TEST(QgzMpi, ExactBlocksReduceExactlyAsThePlainReduceScatter) {
  coll::Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks, not " << w.size();
  constexpr uint64_t kNumel = 3000, kBlock = 64;
  auto run = [&](int qgz_block, int ranks_per_node, uint64_t scratch = 0) {
    RunSpec spec{.stage = 3, .precision = DType::F32};
    spec.quantized_gradients_block = qgz_block;
    spec.ranks_per_node = ranks_per_node;
    spec.quantized_scratch = scratch;
    EngineOptions o = test_engine_options(spec, kNumel, "");
    auto device = make_device({});
    ZeroEngine e(*device, w, w, o, {{.name = "g", .numel = kNumel}});
    const uint64_t shard = e.shard_numel(0);
    e.begin_micro_step();
    e.acquire_params(0);
    e.release_params(0);
    auto* grad = static_cast<float*>(e.gradient_buffer(0));
    for (uint64_t i = 0; i < kNumel; ++i) {
      const uint64_t in_block = (i % shard) % kBlock;
      const int k = in_block == 0 ? 127 : static_cast<int>((i * 37 + i / shard * 11) % 253) - 126;
      grad[i] = static_cast<float>(k * (w.rank() + 1)) / 1024.0f;
    }
    e.grads_ready(0);
    EXPECT_TRUE(e.step());
    std::vector<float> master(shard), m(shard), v(shard);
    e.read_optimizer_shard(0, master.data(), m.data(), v.data());
    return std::pair{master, m};
  };
  const auto plain = run(0, 0);
  for (int rpn : {2, 4})
    for (uint64_t scratch : {uint64_t{0}, uint64_t{4096}}) {
      const auto quantized = run(static_cast<int>(kBlock), rpn, scratch);
      const std::string what = "nodes of " + std::to_string(rpn) + (scratch ? ", in chunks" : "");
      EXPECT_EQ(quantized.second, plain.second) << what << ": Adam's first moment differs";
      EXPECT_EQ(quantized.first, plain.first) << what << ": the master weights differ";
    }
}

// Chunks change how a quantized collective moves, not what it computes: blocks start at
// the same elements of each slice, so qwZ and qgZ in chunks of a 4 KiB scratch (several
// chunks through two buffers) follow the whole-shard runs bit for bit, with the same bytes
// sent, and the scratch in the layout is within the cap.
TEST(QgzMpi, ChunksOfABoundedScratchGiveTheSameRun) {
  coll::Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks, not " << w.size();
  auto g = groups_of(2);
  TempDir dir("qgz-chunks-r" + std::to_string(w.rank()));
  for (int rpn : {2, 4}) {
    RunSpec whole{.stage = 3, .optimizer = OffloadDevice::Cpu, .precision = DType::BF16};
    whole.quantized_block = 64;
    whole.quantized_gradients_block = 64;
    whole.ranks_per_node = rpn;
    RunSpec chunked = whole;
    chunked.quantized_scratch = 4096;
    const RunResult a = train_gpt(w, w, whole, 6, dir.path.string(), false, small_gpt(), nullptr, g.get());
    const RunResult b = train_gpt(w, w, chunked, 6, dir.path.string(), false, small_gpt(), nullptr, g.get());
    EXPECT_EQ(b.losses, a.losses) << chunked.label();
    EXPECT_EQ(b.weights, a.weights) << chunked.label();
    EXPECT_EQ(b.train_stats.shard_collective_bytes, a.train_stats.shard_collective_bytes) << chunked.label();
    EXPECT_EQ(b.train_stats.node_collective_bytes, a.train_stats.node_collective_bytes) << chunked.label();
    EXPECT_EQ(b.train_stats.cross_collective_bytes, a.train_stats.cross_collective_bytes) << chunked.label();
    // The error's sums add in another order.
    EXPECT_NEAR(b.train_stats.quantized_gradients_error, a.train_stats.quantized_gradients_error,
                1e-9 * a.train_stats.quantized_gradients_error)
        << chunked.label();
    EXPECT_NEAR(b.train_stats.quantized_weights_error, a.train_stats.quantized_weights_error,
                1e-9 * a.train_stats.quantized_weights_error)
        << chunked.label();
    EXPECT_LT(b.train_stats.store.tiers[0].peak, a.train_stats.store.tiers[0].peak) << chunked.label();
  }
}

// An fp16 overflow on one rank reaches every rank through the quantized reduce-scatter
// (the block turns NaN), so every rank skips the same step, as without qgZ.
TEST(QgzMpi, ANonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  coll::Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks, not " << w.size();
  TempDir dir("qgz-nan-r" + std::to_string(w.rank()));
  for (int rpn : {2, 4}) {
    RunSpec spec{.stage = 3, .precision = DType::F16, .poison_step = 3, .poison_rank = 1};
    spec.quantized_gradients_block = 64;
    spec.ranks_per_node = rpn;
    const RunResult got = train_gpt(w, w, spec, 6, dir.path.string());
    ASSERT_EQ(got.stepped.size(), 6u) << spec.label();
    for (int s = 0; s < 6; ++s) EXPECT_EQ(got.stepped[s], s != 3) << spec.label() << ", step " << s;
  }
}
