// The GPT under the ZeRO engine on one process: every stage and offload setting, with
// and without activation checkpointing, gives the losses of stage 1 without offload.
// (Across ranks: test_gpt_engine_mpi.cpp.)
#include <gtest/gtest.h>

#include <cmath>

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

TEST(GptEngine, ActivationCheckpointingGivesTheSameLosses) {
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-ckpt");
  RunSpec spec{.stage = 3, .param = OffloadDevice::Cpu, .optimizer = OffloadDevice::Cpu};
  RunResult a = train_gpt(*self, *self, spec, 10, "", false);
  RunResult b = train_gpt(*self, *self, spec, 10, "", true);
  for (int s = 0; s < 10; ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
}
