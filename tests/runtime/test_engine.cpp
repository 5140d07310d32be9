// The ZeRO engine on one process: every stage and offload setting trains the test model
// to the same losses and weights as plain stage 1 without offload; budgets hold; the
// learned acquire order is followed, and a departure from it falls back and re-learns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_harness.hpp"
#include "config_errors.hpp"
#include "strata/core/error.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

// Tolerances. Every setting runs the same float operations in the same order on one
// rank, so they agree exactly; across world sizes the reductions add in another order
// (see test_engine_mpi.cpp).
void expect_same(const RunResult& ref, const RunResult& got, const std::string& label, double loss_rtol,
                 double weight_atol) {
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s)
    ASSERT_NEAR(got.losses[s], ref.losses[s], loss_rtol * std::abs(ref.losses[s])) << label << ", step " << s;
  for (size_t g = 0; g < ref.weights.size(); ++g) {
    float worst = 0;
    for (size_t i = 0; i < ref.weights[g].size(); ++i)
      worst = std::max(worst, std::abs(ref.weights[g][i] - got.weights[g][i]));
    EXPECT_LE(worst, weight_atol) << label << ", group " << g;
  }
}

std::unique_ptr<coll::Communicator> self() { return coll::make_host_communicator(coll::HostBackend::Self); }

}  // namespace

TEST(ZeroEngine, TrainingLowersTheLoss) {
  auto comm = self();
  RunResult r = train(*comm, *comm, {}, 30, "");
  EXPECT_LT(r.losses.back(), 0.5 * r.losses.front()) << "first " << r.losses.front() << " last " << r.losses.back();
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(ZeroEngine, EveryStageAndOffloadMatchesTheReference) {
  TempDir dir("engine");
  auto comm = self();
  const int steps = 30;
  RunResult ref = train(*comm, *comm, {.stage = 1}, steps, "");
  for (int stage : {1, 2, 3})
    for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off};
      RunResult got = train(*comm, *comm, spec, steps, dir.path);
      expect_same(ref, got, spec.label(), 0.0, 0.0f);
    }
}

TEST(ZeroEngine, SubGroupsAccumulationAndClippingAgree) {
  TempDir dir("engine-acc");
  auto comm = self();
  for (bool clip : {false, true}) {
    RunSpec base{.stage = 1, .accum = 2, .clip = clip ? 0.05f : 0.0f};
    RunResult ref = train(*comm, *comm, base, 20, "");
    RunSpec spec = base;
    spec.stage = 3;
    spec.param = spec.optimizer = OffloadDevice::Nvme;
    spec.sub_group = 1024;  // several optimizer sub-groups per shard
    RunResult got = train(*comm, *comm, spec, 20, dir.path);
    // Clipping scales by a norm summed per sub-group, in another order than stage 1's.
    expect_same(ref, got, spec.label(), clip ? 1e-6 : 0.0, clip ? 1e-6f : 0.0f);
    if (clip) {
      EXPECT_GT(got.stats.last_grad_norm, 0.05) << "the test never clipped";
    }
  }
}

// Gradient accumulation with the optimizer off the device: where the device budget has
// room for every accumulating gradient shard beside the plan, they stay there between
// micro-steps and go to the optimizer's tier only in the last one; the bits are those of
// sending them back and forth every micro-step, fewer bytes cross from pinned memory to the
// device, and no tier exceeds its budget. Where the budget has no such room they go back and
// forth as before.
TEST(ZeroEngine, AccumulatingGradientsStayOnTheDeviceWhereItHasRoom) {
  TempDir dir("engine-keep-grads");
  auto comm = self();
  for (int stage : {2, 3})
    for (OffloadDevice opt : {OffloadDevice::Cpu, OffloadDevice::Nvme}) {
      RunSpec spec{.stage = stage, .param = stage == 3 ? opt : OffloadDevice::None, .optimizer = opt, .accum = 4,
                   .clip = 0.05f, .sub_group = 1024};
      spec.device_budget = 128 << 10;  // room for the 32 KiB of gradients beside the plan, little more
      RunSpec off = spec;
      off.keep_grads = false;
      SCOPED_TRACE(spec.label());
      const RunResult kept = train(*comm, *comm, spec, 8, dir.path);
      const RunResult moved = train(*comm, *comm, off, 8, dir.path);
      expect_same(moved, kept, spec.label(), 0.0, 0.0f);
      EXPECT_GT(kept.stats.grads_kept_on_device_bytes, 0u);
      EXPECT_EQ(moved.stats.grads_kept_on_device_bytes, 0u);
      const int D = static_cast<int>(Tier::Device), P = static_cast<int>(Tier::Pinned);
      EXPECT_LT(kept.stats.store.bytes_moved[P][D] + kept.stats.store.bytes_moved[D][P],
                moved.stats.store.bytes_moved[P][D] + moved.stats.store.bytes_moved[D][P]);
      for (const RunResult* r : {&kept, &moved})
        for (int t = 0; t < kTierCount; ++t)
          EXPECT_LE(r->stats.store.tiers[t].peak, r->stats.store.tiers[t].budget) << to_string(static_cast<Tier>(t));
      // 64 KiB has no such room (the smallest of these budgets the engine starts with):
      // back and forth, with the same bits.
      RunSpec tight = spec;
      tight.device_budget = 64 << 10;
      const RunResult t = train(*comm, *comm, tight, 8, dir.path);
      EXPECT_EQ(t.stats.grads_kept_on_device_bytes, 0u);
      expect_same(moved, t, tight.label(), 0.0, 0.0f);
    }
}

TEST(ZeroEngine, NvmeOffloadMovesDataAndStaysInBudget) {
  TempDir dir("engine-nvme");
  auto comm = self();
  RunSpec spec{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme};
  RunResult r = train(*comm, *comm, spec, 5, dir.path);
  const StoreStats& s = r.stats.store;
  EXPECT_GT(s.bytes_moved[2][1], 0u) << "nothing was read from NVMe";
  EXPECT_GT(s.bytes_moved[1][2], 0u) << "nothing was written to NVMe";
  for (int t = 0; t < 3; ++t) EXPECT_LE(s.tiers[t].peak, s.tiers[t].budget) << to_string(static_cast<Tier>(t));
  EXPECT_GT(r.stats.prefetched, 0u) << "the schedule was given, yet nothing was gathered ahead of need";
}

TEST(ZeroEngine, LearnsTheOrderAndRecoversFromADeparture) {
  auto comm = self();
  // Parameters in pinned memory, so each group is gathered (on one rank with them on the
  // device, each is read in place: nothing to prefetch).
  RunSpec spec{.stage = 3, .param = OffloadDevice::Cpu, .give_schedule = false};
  RunResult ref = train(*comm, *comm, {.stage = 1}, 6, "");
  RunResult learned = train(*comm, *comm, spec, 6, "");
  expect_same(ref, learned, spec.label(), 0.0, 0.0f);
  EXPECT_GT(learned.stats.prefetched, 0u) << "the learned order was not used for prefetch";

  // Change the acquire order mid-run: a forward-only pass (no backward) departs from
  // the learned forward+backward order; results stay right and the order is re-learned.
  auto device = make_device({});
  ResidualMlp model(kLayers, kWidth);
  EngineOptions o;
  o.stage = 3;
  o.store.device_budget = 2 << 20;
  o.store.pinned_budget = 2 << 20;
  o.optimizer_threads = 1;
  std::vector<GroupSpec> groups;
  for (int b = 0; b < kLayers; ++b) groups.push_back({.name = "block." + std::to_string(b), .numel = model.group_numel()});
  ZeroEngine engine(*device, *comm, *comm, o, groups);
  std::vector<float> x(kGlobalBatch * kWidth), y(x.size());
  for (int i = 0; i < kGlobalBatch; ++i) make_row(0, 0, i, &x[i * kWidth], &y[i * kWidth]);
  engine.begin_micro_step();
  model.forward_backward(engine, x.data(), y.data(), kGlobalBatch);
  engine.step();
  engine.begin_micro_step();
  double eval = model.forward(engine, x.data(), y.data(), kGlobalBatch);  // departs at the end
  model.forward_backward(engine, x.data(), y.data(), kGlobalBatch);
  EXPECT_GE(engine.stats().trace_departures, 1u);
  EXPECT_TRUE(std::isfinite(eval));
  engine.step();
}

// Stage 3 on one rank with the parameters on the device: each shard is the whole group,
// already in device memory, and the model reads it there. The same weights as gathering it
// into a buffer of its own (EngineAblation::params_in_place false), bit for bit, with no
// gather and no gathered memory; with the parameters in pinned memory it still gathers.
TEST(ZeroEngine, OneRankReadsDeviceShardsInPlace) {
  auto comm = self();
  RunSpec in_place{.stage = 3, .accum = 2};
  RunSpec gathered = in_place;
  gathered.params_in_place = false;
  const RunResult a = train(*comm, *comm, in_place, 4, "");
  const RunResult b = train(*comm, *comm, gathered, 4, "");
  expect_same(b, a, in_place.label(), 0.0, 0.0f);
  EXPECT_EQ(a.stats.gathers, 0u);
  EXPECT_GT(b.stats.gathers, 0u);
  const int D = int(Tier::Device);
  EXPECT_EQ(a.stats.store.tiers[D].peak_by_owner.count("gathered"), 0u);
  EXPECT_GT(b.stats.store.tiers[D].peak_by_owner.at("gathered"), 0u);
  EXPECT_LT(a.stats.store.tiers[D].peak, b.stats.store.tiers[D].peak);
  RunSpec pinned = in_place;
  pinned.param = OffloadDevice::Cpu;
  EXPECT_GT(train(*comm, *comm, pinned, 2, "").stats.gathers, 0u) << "parameters in pinned memory are gathered";
}

// Stages 2 and 3 on one rank: a micro-step's gradient is accumulated straight from the
// model's buffer. The same weights as reduce-scattering it into a buffer first
// (EngineAblation::grads_in_place false), bit for bit, with no reduce-scatter; with the
// optimizer states off the device and over micro-steps too.
TEST(ZeroEngine, OneRankAccumulatesGradientsInPlace) {
  auto comm = self();
  for (int stage : {2, 3})
    for (OffloadDevice opt : {OffloadDevice::None, OffloadDevice::Cpu}) {
      RunSpec in_place{.stage = stage, .optimizer = opt, .accum = 3};
      RunSpec reduced = in_place;
      reduced.grads_in_place = false;
      const RunResult a = train(*comm, *comm, in_place, 3, "");
      const RunResult b = train(*comm, *comm, reduced, 3, "");
      expect_same(b, a, in_place.label(), 0.0, 0.0f);
      EXPECT_EQ(a.stats.reduce_scatters, 0u) << in_place.label();
      EXPECT_GT(b.stats.reduce_scatters, 0u) << in_place.label();
    }
}

TEST(ZeroEngine, BudgetTooSmallForOneGroupFailsAtStart) {
  auto comm = self();
  auto device = make_device({});
  EngineOptions o;
  o.stage = 3;
  o.store.device_budget = 64 << 10;  // a group of 1 M floats needs 4 MiB gathered
  o.store.pinned_budget = 64 << 20;
  try {
    ZeroEngine engine(*device, *comm, *comm, o, {{.name = "big", .numel = 1u << 20}});
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("device budget"), std::string::npos) << m;
    EXPECT_NE(m.find("strata.device_budget"), std::string::npos) << m;
  }
  o.stage = 4;
  EXPECT_THROW(ZeroEngine(*device, *comm, *comm, o, {{.name = "g", .numel = 10}}), ConfigError);
}

TEST(ZeroEngine, OptionsFromConfigRefuseWhatTheEngineLacks) {
  Config c = parse_config(nlohmann::json::parse(R"({"bf16": {"enabled": true}})"));
  EXPECT_EQ(EngineOptions::from_config(c).precision, DType::BF16);
  c = parse_config(nlohmann::json::parse(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu"}}, "strata": {"device_budget": "8MiB"}})"));
  EngineOptions o = EngineOptions::from_config(c);
  EXPECT_EQ(o.stage, 2);
  EXPECT_EQ(o.optimizer_home, Tier::Pinned);
  EXPECT_EQ(o.store.device_budget, 8u << 20);
  EXPECT_FALSE(o.speculative);
  c = parse_config(nlohmann::json::parse(R"({"strata": {"speculative_optimizer": true}})"));
  EXPECT_TRUE(EngineOptions::from_config(c).speculative);
}

// Options with a 4 MiB device and a 1 MiB pinned budget, for the start-up checks below.
static EngineOptions small_budgets() {
  EngineOptions o;
  o.store.device_budget = 4 << 20;
  o.store.pinned_budget = 1 << 20;
  return o;
}

// Stage 3 gathers a group whole: stage3_max_live_parameters below the largest group
// cannot be kept, and is refused at start-up naming the key and the smallest value.
TEST(ZeroEngine, MaxLiveParametersBelowTheLargestGroupIsRefused) {
  auto device = make_device({});
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  EngineOptions o = small_budgets();
  o.max_live_elems = 9'999;
  const std::vector<GroupSpec> groups = {{.name = "small", .numel = 10}, {.name = "big", .numel = 10'000}};
  auto build = [&] { ZeroEngine e(*device, *comm, *comm, o, groups); };
  const std::string m = test::error_of<ConfigError>(build);
  EXPECT_NE(m.find("zero_optimization.stage3_max_live_parameters = 9999 is smaller than the largest parameter "
                   "group, 'big' (10000 elements), which stage 3 gathers whole: give at least 10000"),
            std::string::npos) << m;
  o.max_live_elems = 10'000;
  EXPECT_NO_THROW(build());
  o.stage = 2;  // stages 1 and 2 gather nothing
  o.max_live_elems = 1;
  EXPECT_NO_THROW(build());
}

// cpu_checkpointing moves checkpoints the engine holds: an engine given none (the C API's,
// whose trainer keeps its own activations) refuses it rather than ignore it. Checkpoints
// that do not fit the pinned budget and have no NVMe to go to are refused with the sizes.
TEST(ZeroEngine, CpuCheckpointingNeedsCheckpointsAndRoomForThem) {
  auto device = make_device({});
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  EngineOptions o = small_budgets();
  o.cpu_checkpointing = true;
  auto build = [&] { ZeroEngine e(*device, *comm, *comm, o, {{.name = "g", .numel = 10}}); };
  std::string m = test::error_of<ConfigError>(build);
  EXPECT_NE(m.find("this engine holds none"), std::string::npos) << m;
  o.checkpoints = {.count = 9, .bytes = 256 << 10};  // 2.25 MiB: more than the pinned budget
  m = test::error_of<OutOfBudget>(build);
  EXPECT_NE(m.find("2.25 MiB of activation checkpoints (9, activation_checkpointing.cpu_checkpointing)"),
            std::string::npos) << m;
  EXPECT_NE(m.find("give an NVMe path"), std::string::npos) << m;
  o.store.pinned_budget = 4 << 20;  // room: they live in pinned memory, and the engine offers them
  ZeroEngine e(*device, *comm, *comm, o, {{.name = "g", .numel = 10}});
  ASSERT_NE(e.activation_store(), nullptr);
  EXPECT_EQ(e.activation_store()->count(), 9);
  EXPECT_EQ(e.store().usage(Tier::Pinned).by_owner.at("activations"), 9u * (256 << 10));
  EXPECT_EQ(e.store().usage(Tier::Device).by_owner.count("activations"), 0u);
  // A micro-step the model left half-way (an exception between begin_write and
  // end_forward): the next micro-step starts with nothing held on the device.
  e.begin_micro_step();
  e.activation_store()->begin_write(0);
  e.activation_store()->begin_write(1);
  EXPECT_EQ(e.store().usage(Tier::Device).by_owner.at("activations"), 2u * (256 << 10));
  e.step();
  e.begin_micro_step();
  EXPECT_EQ(e.store().usage(Tier::Device).by_owner.count("activations"), 0u);
  e.activation_store()->begin_write(0);  // and the store works as before
  e.activation_store()->end_forward(0, false);
  EXPECT_THROW(e.activation_store()->end_forward(0, false), Error);  // not written since
  EXPECT_THROW(e.activation_store()->read(9), Error);                  // out of range
}
