// The GPT under the ZeRO engine on one process: every stage and offload setting, with
// and without activation checkpointing, gives the losses of stage 1 without offload; the
// same for Llama.
// (Across ranks: test_gpt_engine_mpi.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "gpt_harness.hpp"

using namespace strata;
using namespace strata::testing_engine;

TEST(GptEngine, EveryStageAndOffloadMatchesStageOneWithoutOffload) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-engine");
  const int steps = 20;
  RunResult ref = train_gpt(*self, *self, {.stage = 1}, steps, "");
  EXPECT_LT(ref.losses.back(), 0.8 * ref.losses.front()) << "the GPT does not learn the progressions";
  for (int stage : {1, 2, 3})
    for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off};
      RunResult got = train_gpt(*self, *self, spec, steps, dir.path.string());
      // One process: the same sums in the same order, so the same bits.
      for (int s = 0; s < steps; ++s) EXPECT_EQ(got.losses[s], ref.losses[s]) << spec.label() << ", step " << s;
    }
}

// In 16 bits too: at one rank every stage and offload reduces, accumulates and rounds the
// same values in the same order.
TEST(GptEngine, SixteenBitEveryStageAndOffloadMatchesStageOneWithoutOffload) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-engine-16");
  const int steps = 20;
  for (DType p : {DType::BF16, DType::F16}) {
    RunResult ref = train_gpt(*self, *self, {.stage = 1, .precision = p}, steps, "");
    EXPECT_LT(ref.losses.back(), 0.8 * ref.losses.front()) << precision_name(p) << ": the GPT does not learn";
    for (int stage : {1, 2, 3})
      for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off, .precision = p};
        RunResult got = train_gpt(*self, *self, spec, steps, dir.path.string());
        for (int s = 0; s < steps; ++s) EXPECT_EQ(got.losses[s], ref.losses[s]) << spec.label() << ", step " << s;
      }
  }
}

// bf16 follows the fp32 run's loss curve: the same model and data, 16-bit rounding only.
TEST(GptEngine, Bf16FollowsTheFp32LossCurve) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  const int steps = 30;
  RunResult f32 = train_gpt(*self, *self, {.stage = 3}, steps, "");
  RunResult b16 = train_gpt(*self, *self, {.stage = 3, .precision = DType::BF16}, steps, "");
  double worst = 0;
  for (int s = 0; s < steps; ++s) worst = std::max(worst, std::abs(b16.losses[s] - f32.losses[s]) / f32.losses[s]);
  std::printf("bf16 vs fp32 over %d steps: loss %.4f -> %.4f vs %.4f -> %.4f, max rel diff %.2e\n", steps,
              b16.losses.front(), b16.losses.back(), f32.losses.front(), f32.losses.back(), worst);
  // The curves cross where the loss falls fastest (a step's shift there is a few percent);
  // the end point is held tighter.
  EXPECT_LT(worst, 0.1);
  EXPECT_LT(std::abs(b16.losses.back() - f32.losses.back()) / f32.losses.back(), 0.02);
}

TEST(GptEngine, ActivationCheckpointingGivesTheSameLosses) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-ckpt");
  RunSpec spec{.stage = 3, .param = OffloadDevice::Cpu, .optimizer = OffloadDevice::Cpu};
  RunResult a = train_gpt(*self, *self, spec, 10, "", false);
  RunResult b = train_gpt(*self, *self, spec, 10, "", true);
  for (int s = 0; s < 10; ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
}

// Llama (grouped-query attention, untied head: group 0 is not acquired for the head and
// its gradient buffer is asked for last): every stage and offload, fp32 and bf16, and
// with activation checkpointing, gives stage 1's losses bit for bit at one rank.
TEST(GptEngine, LlamaEveryStageAndOffloadMatchesStageOneWithoutOffload) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("llama-engine");
  const int steps = 20;
  for (DType p : {DType::F32, DType::BF16}) {
    RunResult ref = train_gpt(*self, *self, {.stage = 1, .precision = p}, steps, "", false, small_llama());
    EXPECT_LT(ref.losses.back(), 0.8 * ref.losses.front()) << precision_name(p) << ": Llama does not learn";
    std::printf("llama %s: loss %.4f -> %.4f\n", precision_name(p), ref.losses.front(), ref.losses.back());
    for (int stage : {1, 2, 3})
      for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off, .precision = p};
        const bool ck = stage == 3;  // recomputed blocks give the same values
        RunResult got = train_gpt(*self, *self, spec, steps, dir.path.string(), ck, small_llama());
        for (int s = 0; s < steps; ++s)
          EXPECT_EQ(got.losses[s], ref.losses[s]) << "llama " << spec.label() << (ck ? " checkpointed" : "") << ", step " << s;
      }
  }
}

// Activation checkpoints held by the engine (strata train's way): on the device, in pinned
// memory (activation_checkpointing.cpu_checkpointing) or on NVMe give the losses of the
// model keeping its own, bit for bit, in fp32 and bf16, at every offload of stage 3. Off
// the device, the device holds at most kLiveCheckpoints of them at once instead of all
// (the tier's accounting of the "activations" owner), and every checkpoint but the last
// block's input and the final residual goes to its home once per micro-step, and back.
TEST(GptEngine, CpuCheckpointingMovesTheCheckpointsOffTheDeviceWithTheSameLosses) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-cpu-ckpt");
  GptShape shape = small_gpt();
  shape.layers = 8;  // 9 checkpoints, 3 of them live off the device
  const int steps = 6, accum = 2;
  const uint64_t cp = static_cast<uint64_t>(kGptGlobalBatch) * shape.seq_len * shape.d_model * sizeof(float);
  const int D = int(Tier::Device), P = int(Tier::Pinned), N = int(Tier::Nvme);
  for (DType p : {DType::F32, DType::BF16})
    for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      RunSpec spec{.stage = 3, .param = off, .optimizer = off, .accum = accum, .precision = p};
      spec.pinned_budget = spec.device_budget = 8 << 20;
      const RunResult ref = train_gpt(*self, *self, spec, steps, dir.path.string(), true, shape);
      EXPECT_LT(ref.losses.back(), ref.losses.front());
      std::map<OffloadDevice, RunResult> got;
      for (OffloadDevice home : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        RunSpec s = spec;
        s.checkpoints = home;
        got[home] = train_gpt(*self, *self, s, steps, dir.path.string(), true, shape);
        for (int i = 0; i < steps; ++i) EXPECT_EQ(got[home].losses[i], ref.losses[i]) << s.label() << ", step " << i;
      }
      const StoreStats& kept = got[OffloadDevice::None].stats.store;
      EXPECT_EQ(kept.tiers[D].peak_by_owner.at("activations"), (shape.layers + 1) * cp);
      for (OffloadDevice home : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        const StoreStats& st = got[home].stats.store;
        SCOPED_TRACE(std::string(precision_name(p)) + ", offload " + to_string(off) + ", checkpoints on " +
                     to_string(home));
        const uint64_t live = st.tiers[D].peak_by_owner.at("activations");
        EXPECT_LE(live, kLiveCheckpoints * cp);
        EXPECT_GE(live, 2 * cp);  // a block's input and output
        // Out and back, layers - 1 per micro-step, counted by the store for the "activations"
        // owner; the run keeping them on the device moves none.
        const uint64_t moved = static_cast<uint64_t>(steps) * accum * (shape.layers - 1) * cp;
        EXPECT_EQ(kept.bytes_moved_by_owner.count("activations"), 0u);
        const auto& m = st.bytes_moved_by_owner.at("activations");
        EXPECT_EQ(m[D][P], moved);
        // Back: as many, less those a read found still on the device, their move home
        // not yet done (the last two moved in each forward at most).
        EXPECT_LE(m[P][D], moved);
        EXPECT_GE(m[P][D] + static_cast<uint64_t>(steps) * accum * 2 * cp, moved);
        EXPECT_EQ(m[P][N], home == OffloadDevice::Nvme ? moved : 0);
        // (A read may find the pinned copy of one still on its way to NVMe, and take it.)
        EXPECT_LE(m[N][P], home == OffloadDevice::Nvme ? moved : 0);
        if (p == DType::F32)
          std::printf("offload %s, checkpoints on %s: device peak %llu against %llu (checkpoints %llu against %llu)\n",
                      to_string(off), to_string(home), static_cast<unsigned long long>(st.tiers[D].peak),
                      static_cast<unsigned long long>(kept.tiers[D].peak), static_cast<unsigned long long>(live),
                      static_cast<unsigned long long>(kept.tiers[D].peak_by_owner.at("activations")));
      }
    }
}

// Per-tensor gathers and tiles (gpt_parts): blocks gathered in parts of at most
// part_bucket elements, linears in tiles. Untiled parts run the same matmuls as whole
// blocks: the same losses bit for bit. Tiles sum dX over tiles: the same within rounding.
// The device's gathered parameters peak lower by about a block less the few parts in use
// and ahead.
TEST(GptEngine, PerTensorGathersAndTilesMatchWholeBlocksWithALowerDevicePeak) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-parts");
  GptShape shape = small_gpt();
  shape.d_model = 64;  // a block of 49,984 elements; its largest tensors 16,384
  const int steps = 5;
  const int D = int(Tier::Device);
  const uint64_t block = gpt_groups(shape)[1].numel;
  for (DType p : {DType::F32, DType::BF16})
    for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      RunSpec spec{.stage = 3, .param = off, .optimizer = off, .accum = 2, .precision = p};
      spec.pinned_budget = spec.device_budget = 8 << 20;
      const RunResult whole = train_gpt(*self, *self, spec, steps, dir.path.string(), false, shape);
      EXPECT_LT(whole.losses.back(), whole.losses.front());
      RunSpec per = spec;
      per.part_bucket = 4096;  // vectors coalesced, each matrix alone
      const RunResult parts = train_gpt(*self, *self, per, steps, dir.path.string(), false, shape);
      RunSpec tiled = per;
      tiled.tile_factor = 4;
      const RunResult tiles = train_gpt(*self, *self, tiled, steps, dir.path.string(), false, shape);
      for (int i = 0; i < steps; ++i) {
        EXPECT_EQ(parts.losses[i], whole.losses[i]) << per.label() << ", step " << i;
        EXPECT_NEAR(tiles.losses[i], whole.losses[i], (p == DType::F32 ? 1e-5 : 2e-2) * whole.losses[i])
            << tiled.label() << ", step " << i;
      }
      ASSERT_EQ(parts.weights.size(), whole.weights.size());
      for (size_t g = 0; g < whole.weights.size(); ++g) EXPECT_EQ(parts.weights[g], whole.weights[g]) << "group " << g;
      SCOPED_TRACE(spec.label());
      if (off == OffloadDevice::None) {
        // One rank, the parameters on the device: read in place, with no gathered memory.
        for (const RunResult* r : {&whole, &parts, &tiles}) {
          EXPECT_EQ(r->stats.store.tiers[D].peak_by_owner.count("gathered"), 0u);
          EXPECT_EQ(r->stats.gathers, 0u);
        }
        continue;
      }
      const uint64_t wb = dtype_size(p);
      const uint64_t peak_whole = whole.stats.store.tiers[D].peak_by_owner.at("gathered");
      const uint64_t peak_parts = parts.stats.store.tiers[D].peak_by_owner.at("gathered");
      const uint64_t peak_tiles = tiles.stats.store.tiers[D].peak_by_owner.at("gathered");
      // Whole: at least the block in use (beside the embeddings, held for the tied head).
      // Parts: the part in use and the bucket ahead, each at most the largest tensor
      // (16,384 elements); tiles: a quarter of that. So the peak drops by at least a block
      // less four tiles.
      EXPECT_GE(peak_whole, block * wb);
      EXPECT_LT(peak_parts, peak_whole);
      EXPECT_LE(peak_tiles, peak_parts);
      EXPECT_GE(peak_whole - peak_tiles, (block - 4 * 4'096) * wb);
      std::printf("%s: gathered device peak whole blocks %llu, parts %llu, tiles %llu bytes\n", spec.label().c_str(),
                  static_cast<unsigned long long>(peak_whole), static_cast<unsigned long long>(peak_parts),
                  static_cast<unsigned long long>(peak_tiles));
    }
}

// With checkpoints off the device and tiles, the same losses as the run with neither.
TEST(GptEngine, TilesComposeWithCpuCheckpointing) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-parts-ckpt");
  GptShape shape = small_gpt();
  shape.layers = 4;
  RunSpec spec{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Cpu, .accum = 2};
  spec.pinned_budget = spec.device_budget = 8 << 20;
  const RunResult ref = train_gpt(*self, *self, spec, 5, dir.path.string(), true, shape);
  RunSpec s = spec;
  s.part_bucket = 1;
  s.tile_factor = 2;
  s.checkpoints = OffloadDevice::Cpu;
  const RunResult got = train_gpt(*self, *self, s, 5, dir.path.string(), true, shape);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << s.label() << ", step " << i;
}
