// The speculative optimizer against the plain step: the same run twice, states compared
// bit for bit after every step (test_speculative.cpp on one rank, test_engine_mpi.cpp
// across ranks).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "gpt_harness.hpp"

namespace strata::testing_engine {

// The clipping regimes of the acceptance: never triggers, triggers on every step, on
// some steps; and a NaN gradient on one rank on one step.
enum class Regime { NeverClips, AlwaysClips, SometimesClips, NonFinite };

inline const char* regime_name(Regime r) {
  switch (r) {
    case Regime::NeverClips: return "clipping never triggers";
    case Regime::AlwaysClips: return "clipping on every step";
    case Regime::SometimesClips: return "clipping on some steps";
    case Regime::NonFinite: return "a NaN gradient on one rank";
  }
  return "";
}

// One training run: the residual MLP (fp32 only) or the small GPT (any precision).
using Runner = std::function<RunResult(coll::Communicator&, const RunSpec&, int, const std::string&)>;
inline RunResult run_mlp(coll::Communicator& c, const RunSpec& s, int steps, const std::string& dir) {
  return train(c, c, s, steps, dir);
}
inline RunResult run_gpt(coll::Communicator& c, const RunSpec& s, int steps, const std::string& dir) {
  return train_gpt(c, c, s, steps, dir);
}

// The median gradient norm of a plain run of `spec`: clipping there triggers on some steps
// and not on others.
inline float median_norm(const Runner& train, coll::Communicator& comm, RunSpec spec, int steps,
                         const std::string& nvme_dir) {
  spec.clip = 0;
  spec.snapshots = false;
  spec.speculative = false;
  std::vector<double> n = train(comm, spec, steps, nvme_dir).norms;
  std::nth_element(n.begin(), n.begin() + n.size() / 2, n.end());
  return static_cast<float>(n[n.size() / 2]);
}

// After every step of two runs with snapshots: the same steps taken or skipped, the same
// state bits and the same losses.
inline void expect_same_states(const RunResult& got, const RunResult& want, int steps, const std::string& label) {
  ASSERT_EQ(want.states.size(), static_cast<size_t>(steps)) << label;
  ASSERT_EQ(got.states.size(), want.states.size()) << label;
  for (int s = 0; s < steps; ++s) {
    ASSERT_EQ(got.stepped[s], want.stepped[s]) << label << ", step " << s;
    ASSERT_EQ(got.states[s].size(), want.states[s].size()) << label;
    ASSERT_EQ(std::memcmp(got.states[s].data(), want.states[s].data(), got.states[s].size() * sizeof(float)), 0)
        << label << ": the states differ after step " << s;
    ASSERT_EQ(got.losses[s], want.losses[s]) << label << ", step " << s;
  }
}

// Runs `base` plainly and speculatively in the regime and expects identical bits after
// every step, and the speculation counts the regime implies. Stage 3 speculates on the
// optimizer lane; with `also_on_the_models_thread`, once more without it.
inline void expect_speculation_exact(const Runner& train, coll::Communicator& comm, RunSpec base, Regime regime,
                                     int steps, const std::string& nvme_dir, bool also_on_the_models_thread = false) {
  base.snapshots = true;
  base.speculative = false;
  switch (regime) {
    case Regime::NeverClips: base.clip = 1e6f; break;
    case Regime::AlwaysClips: base.clip = 1e-4f; break;
    case Regime::SometimesClips: base.clip = median_norm(train, comm, base, steps, nvme_dir); break;
    case Regime::NonFinite:
      base.clip = 1.0f;
      base.poison_step = steps / 3;
      base.poison_rank = comm.size() - 1;
      break;
  }
  RunSpec spec = base;
  spec.speculative = true;
  const std::string label = spec.label() + ", " + regime_name(regime) + ", world " + std::to_string(comm.size());
  const RunResult plain = train(comm, base, steps, nvme_dir);
  const RunResult got = train(comm, spec, steps, nvme_dir);
  ASSERT_NO_FATAL_FAILURE(expect_same_states(got, plain, steps, label));
  const EngineStats& st = got.stats;
  const uint64_t total = st.speculation_commits + st.speculation_rollbacks;
  EXPECT_EQ(st.speculation_fallback_sub_groups, 0u) << label;
  EXPECT_EQ(total, static_cast<uint64_t>(steps)) << label << ": every step speculated";
  switch (regime) {
    case Regime::NeverClips: EXPECT_EQ(st.speculation_rollbacks, 0u) << label; break;
    case Regime::AlwaysClips: EXPECT_EQ(st.speculation_commits, 0u) << label; break;
    case Regime::SometimesClips:
      EXPECT_GT(st.speculation_commits, 0u) << label;
      EXPECT_GT(st.speculation_rollbacks, 0u) << label;
      break;
    case Regime::NonFinite:
      EXPECT_EQ(st.skipped_steps, 1u) << label;
      EXPECT_FALSE(got.stepped[steps / 3]) << label;
      EXPECT_GE(st.speculation_rollbacks, 1u) << label;
      break;
  }
  for (int t = 0; t < kTierCount; ++t)
    EXPECT_LE(st.store.tiers[t].peak, st.store.tiers[t].budget) << label << ", " << to_string(static_cast<Tier>(t));
  if (spec.stage != 3 || !spec.lane) {
    EXPECT_EQ(st.lane_sub_groups, 0u) << label;
  } else if (!spec.optimizer_on_stream) {  // CpuAdam's sub-groups (all, or a ratio's share)
    EXPECT_GT(st.lane_sub_groups, 0u) << label << ": stage 3 steps its host sub-groups on the optimizer lane";
  }
  if (also_on_the_models_thread && spec.stage == 3) {
    spec.lane = false;
    const RunResult inline_run = train(comm, spec, steps, nvme_dir);
    ASSERT_NO_FATAL_FAILURE(expect_same_states(inline_run, plain, steps, label + ", on the model's thread"));
    EXPECT_EQ(inline_run.stats.lane_sub_groups, 0u) << label;
  }
}

}  // namespace strata::testing_engine
