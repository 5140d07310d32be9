// The ZeRO engine across ranks (run under mpirun at 2 and 4 ranks): every stage and
// offload setting gives the same losses and final weights as one rank without offload;
// the speculative optimizer gives the plain step's bits at the same world size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "speculative_check.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

// Across world sizes the gradient sums are added in another order (a reduce-scatter
// of per-rank partial sums instead of one rank's sum over the whole batch), so results
// differ by float rounding, which Adam then carries forward. 30 steps of this model
// stay within these bounds; a wrong shard, a missed micro-batch or a stale copy gives
// errors of order 1e-2 and more.
constexpr double kLossRtol = 1e-5;
constexpr float kWeightAtol = 1e-5f;

coll::Communicator& world() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  return *comm;
}

}  // namespace

TEST(ZeroEngineMpi, EveryStageAndOffloadMatchesOneRankWithoutOffload) {
  coll::Communicator& comm = world();
  ASSERT_GT(comm.size(), 1) << "run this under mpirun with at least 2 ranks";
  TempDir dir("engine-mpi-r" + std::to_string(comm.rank()));
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  const int steps = 30;
  std::vector<RunSpec> specs;
  for (int stage : {1, 2, 3})
    for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme})
      specs.push_back({.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off});
  specs.push_back({.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .accum = 2,
                   .clip = 0.05f, .give_schedule = false, .sub_group = 512});
  specs.push_back({.stage = 2, .optimizer = OffloadDevice::Cpu, .accum = 2, .clip = 0.05f});
  for (const RunSpec& spec : specs) {
    RunSpec ref_spec{.stage = 1, .accum = spec.accum, .clip = spec.clip};
    RunResult ref = train(*self, *self, ref_spec, steps, "");
    RunResult got = train(comm, comm, spec, steps, dir.path);
    double worst_loss = 0;
    for (int s = 0; s < steps; ++s)
      worst_loss = std::max(worst_loss, std::abs(got.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
    float worst_w = 0;
    for (size_t g = 0; g < ref.weights.size(); ++g)
      for (size_t i = 0; i < ref.weights[g].size(); ++i)
        worst_w = std::max(worst_w, std::abs(ref.weights[g][i] - got.weights[g][i]));
    EXPECT_LE(worst_loss, kLossRtol) << spec.label() << " at world " << comm.size();
    EXPECT_LE(worst_w, kWeightAtol) << spec.label() << " at world " << comm.size();
    EXPECT_LT(got.losses.back(), 0.5 * got.losses.front()) << spec.label();
    if (comm.rank() == 0)
      std::printf("world %d, %s: loss %.5f -> %.5f, max rel loss diff %.2e, max weight diff %.2e\n", comm.size(),
                  spec.label().c_str(), got.losses.front(), got.losses.back(), worst_loss, worst_w);
  }
}

// The speculative optimizer at world 2 and 4: the norm is an all-reduce of every rank's
// partial sums, a NaN on the last rank skips the step everywhere, and every rank's
// states match the plain step's bit for bit after every step.
TEST(ZeroEngineMpi, SpeculativeStepIsBitIdenticalToThePlainStep) {
  coll::Communicator& comm = world();
  ASSERT_GT(comm.size(), 1) << "run this under mpirun with at least 2 ranks";
  TempDir dir("engine-mpi-spec-r" + std::to_string(comm.rank()));
  for (int stage : {1, 2, 3})
    for (OffloadDevice off : {OffloadDevice::Cpu, OffloadDevice::Nvme})
      for (Regime regime : {Regime::NeverClips, Regime::AlwaysClips, Regime::SometimesClips, Regime::NonFinite}) {
        RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off,
                     .sub_group = 1024};
        expect_speculation_exact(run_mlp, comm, spec, regime, 30, dir.path);
      }
  // bf16 through the small GPT, stage 3 on NVMe, with gradient accumulation.
  for (Regime regime : {Regime::SometimesClips, Regime::NonFinite}) {
    RunSpec spec{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme, .accum = 2,
                 .precision = DType::BF16};
    expect_speculation_exact(run_gpt, comm, spec, regime, 12, dir.path);
  }
}
