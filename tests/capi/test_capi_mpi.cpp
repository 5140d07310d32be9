// The C API across ranks, under mpirun (tests/CMakeLists.txt: STRATA_MPIEXEC_FLAGS).
// Every rank hands in a different gradient; the engine averages them, so training
// follows a reference AdamW on the averaged gradient. Mismatched registrations are
// reported on every rank instead of hanging.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "capi_precision.hpp"

using namespace capi_test;

namespace {
strata_runtime_info info_of(strata_runtime rt) {
  strata_runtime_info i{};
  i.struct_size = sizeof i;
  EXPECT_STRATA_OK(strata_runtime_get_info(rt, &i));
  return i;
}
}  // namespace

// Also with ZeRO++ hpZ over pairs of ranks (zero_hpz_partition_size 2): the C API splits
// the ranks as strata train does, and the same reference holds.
TEST(CApiMpi, TrainingAcrossRanksFollowsTheAveragedGradient) {
  for (auto [stage, hpz] : {std::pair{3, 1}, std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + ", hpz " + std::to_string(hpz));
    TempDir dir("mpi");
    RuntimeHandle h(
        config_json({.stage = stage, .accum = 2, .offload = "nvme", .nvme_dir = dir.path.string(), .hpz = hpz}));
    const strata_runtime_info info = info_of(h.rt);
    ASSERT_GT(info.world_size, 1) << "run this test under mpirun";
    auto gs = toy_groups(4);
    register_toy(h.rt, gs);
    ReferenceAdamW ref(gs, 0.01, 0.01);
    for (int s = 0; s < 6; ++s) {
      for (int m = 0; m < 2; ++m) toy_micro_step(h.rt, gs, forward_backward(4), s, m, info.rank);
      ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
      ref.step(s, 2, info.world_size);
    }
    auto got = read_all(h.rt, gs);
    double worst = 0;
    for (size_t g = 0; g < gs.size(); ++g)
      for (size_t i = 0; i < got[g].size(); ++i) worst = std::max(worst, std::abs(got[g][i] - ref.w[g][i]));
    EXPECT_LT(worst, 2e-5) << "(fp32 against a double reference, as in test_capi.cpp)";
    EXPECT_NE(got[0][0], initial_value(0, 0));
  }
}

TEST(CApiMpi, OrderChangeOnEveryRankFallsBackAndStaysCorrect) {
  auto run = [](bool change) {
    RuntimeHandle h(config_json({}));
    const int rank = info_of(h.rt).rank;
    auto gs = toy_groups(4);
    register_toy(h.rt, gs);
    const std::vector<int> a = forward_backward(4), b = {1, 3, 0, 2, 2, 0, 3, 1};
    for (int s = 0; s < 6; ++s) {
      toy_micro_step(h.rt, gs, change && s >= 3 ? b : a, s, 0, rank);
      EXPECT_STRATA_OK(strata_step(h.rt, nullptr));
    }
    strata_stats st{};
    st.struct_size = sizeof st;
    EXPECT_STRATA_OK(strata_get_stats(h.rt, &st));
    return std::make_pair(read_all(h.rt, gs), st.trace_departures);
  };
  auto fixed = run(false), changed = run(true);
  EXPECT_EQ(fixed.second, 0u);
  EXPECT_EQ(changed.second, 1u);
  EXPECT_EQ(changed.first, fixed.first);
}

TEST(CApiMpi, DifferentGroupsOnDifferentRanksAreReportedEverywhere) {
  RuntimeHandle h(config_json({}));
  const int rank = info_of(h.rt).rank;
  std::vector<ToyGroup> gs = toy_groups(3);
  if (rank == 1) gs[1].shape[0] += 1;  // one rank's group 1 is larger
  register_toy(h.rt, gs);
  EXPECT_STRATA_FAILS(strata_start(h.rt), STRATA_ERR_COLLECTIVE, "group 1 ('block.1'");
  RuntimeHandle h2(config_json({}));
  register_toy(h2.rt, toy_groups(rank == 0 ? 2 : 3));
  EXPECT_STRATA_FAILS(strata_start(h2.rt), STRATA_ERR_COLLECTIVE, "different numbers of parameter groups");
}

// In bf16 the ranks' gradients meet in the reduce-scatter as bf16 and their sum is
// rounded to bf16 (Reference16 does the same); accumulation over micro-batches is fp32.
TEST(CApiMpi, Bf16TrainingAcrossRanksFollowsTheRoundedReference) {
  for (int accum : {1, 2}) {
    SCOPED_TRACE("accum " + std::to_string(accum));
    TempDir dir("mpi16");
    RuntimeHandle h(config16(STRATA_BF16, {.stage = 3, .accum = accum, .offload = "nvme", .nvme_dir = dir.path.string()}));
    const strata_runtime_info info = info_of(h.rt);
    ASSERT_EQ(info.world_size, 2) << "Reference16 sums exactly two ranks' gradients";
    auto gs = toy_groups(4);
    register_toy16(h.rt, gs, STRATA_BF16);
    Reference16 ref(STRATA_BF16, gs, 0.01, 0.01);
    for (int s = 0; s < 6; ++s) {
      for (int m = 0; m < accum; ++m) micro_step16(h.rt, gs, STRATA_BF16, s, m, 1.0, info.rank);
      int32_t stepped = 0;
      ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
      ASSERT_EQ(stepped, 1);
      ref.step(s, accum, 1.0, info.world_size);
    }
    // As in test_capi_precision.cpp: fp32 against double master weights may round to
    // neighbours, rarely.
    size_t total = 0, off_by_one = 0;
    for (size_t g = 0; g < gs.size(); ++g) {
      std::vector<uint16_t> bits(gs[g].numel());
      ASSERT_STRATA_OK(strata_read_params(h.rt, static_cast<int32_t>(g), bits.data(), STRATA_BF16, bits.size()));
      for (size_t i = 0; i < bits.size(); ++i, ++total) {
        const uint16_t want = bf16_bits(ref.working(g, i));
        if (bits[i] == want) continue;
        ++off_by_one;
        ASSERT_EQ(std::abs(ordered16(bits[i]) - ordered16(want)), 1) << "group " << g << " element " << i;
      }
    }
    EXPECT_LE(off_by_one, total / 100) << off_by_one << " of " << total;
  }
}

// A rank whose configuration trains in another precision is found at the start, on every
// rank, before any buffer of the wrong size reaches a collective.
TEST(CApiMpi, DifferentPrecisionsOnDifferentRanksAreReportedEverywhere) {
  RuntimeHandle probe(config_json({}));
  const int rank = info_of(probe.rt).rank;
  const strata_dtype t = rank == 0 ? STRATA_F32 : STRATA_BF16;
  RuntimeHandle h(t == STRATA_F32 ? config_json({}) : config16(t));
  std::vector<int64_t> shape{64};
  strata_group_desc d = desc16("w", shape, t, STRATA_INIT_ZEROS);
  int32_t id = -1;
  ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
  EXPECT_STRATA_FAILS(strata_start(h.rt), STRATA_ERR_COLLECTIVE, "different precisions");
  EXPECT_STRATA_FAILS(strata_start(h.rt), STRATA_ERR_COLLECTIVE, "same bf16 and fp16 sections");
}

// Every rank saves its shards into one checkpoint directory; a fresh runtime on every
// rank loads it and continues exactly as the uninterrupted run.
TEST(CApiMpi, CheckpointAcrossRanksResumesExactly) {
  // One directory for all ranks: mpirun is every rank's parent.
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("strata-capi-mpi-ckpt-" + std::to_string(::getppid()));
  std::filesystem::create_directories(root);
  TempDir nvme("mpi-ckpt-nvme");
  const std::string json = config_json({.offload = "nvme", .nvme_dir = nvme.path.string()});
  auto gs = toy_groups(3);
  auto train = [&](strata_runtime rt, int rank, int from, int to) {
    for (int s = from; s < to; ++s) {
      toy_micro_step(rt, gs, forward_backward(3), s, 0, rank);
      EXPECT_STRATA_OK(strata_step(rt, nullptr));
    }
  };
  std::vector<std::vector<float>> straight;
  int rank = 0;
  {
    RuntimeHandle h(json);
    rank = info_of(h.rt).rank;
    register_toy(h.rt, gs);
    train(h.rt, rank, 0, 4);
    straight = read_all(h.rt, gs);
  }
  char dir[4096] = {};
  {
    RuntimeHandle h(json);
    register_toy(h.rt, gs);
    train(h.rt, rank, 0, 2);
    ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.c_str(), "{\"rank_count\": 2}", dir, sizeof dir));
  }
  {
    RuntimeHandle h(json);
    register_toy(h.rt, gs);
    char extra[64] = {};
    ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, dir, extra, sizeof extra));
    EXPECT_EQ(std::string(extra), "{\"rank_count\":2}");
    train(h.rt, rank, 2, 4);
    EXPECT_EQ(read_all(h.rt, gs), straight);  // read_params is collective: every rank finished loading
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

// zero_optimization.mics_shard_size shards within groups in strata train only: the C API
// refuses it on every rank, naming the fix, rather than shard over every rank silently.
TEST(CApiMpi, MicsShardSizeIsRefusedNamingTheFix) {
  strata_runtime rt{};
  const std::string json = "{\"zero_optimization\": {\"stage\": 3, \"mics_shard_size\": 1}}";
  EXPECT_STRATA_FAILS(strata_runtime_create(STRATA_API_VERSION, json.c_str(), &rt), STRATA_ERR_CONFIG,
                      "mics_shard_size shards within groups of ranks in strata train only so far");
}
