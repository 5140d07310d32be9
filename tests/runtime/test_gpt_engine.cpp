// The GPT under the ZeRO engine on one process: every stage and offload setting, with
// and without activation checkpointing, gives the losses of stage 1 without offload; the
// same for Llama.
// (Across ranks: test_gpt_engine_mpi.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

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
