// The `scheduler` section (DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR): parsing,
// defaults, every refusal (each names the key), a few values worked out by hand, and
// ZeroEngine::set_learning_rate. The full sequences are compared with DeepSpeed's own
// classes by test_lr_schedule.py.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/config/lr_schedule.hpp"
#include "strata/runtime/engine/zero_engine.hpp"
#include "config_errors.hpp"

using namespace strata;
using nlohmann::json;
using strata::test::error_of;

namespace {

// A config with this scheduler section and optimizer lr.
json with_scheduler(const json& scheduler, double lr = 1e-3) {
  return {{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", lr}}}}}, {"scheduler", scheduler}};
}

std::string scheduler_error(const json& scheduler) { return error_of(with_scheduler(scheduler)); }

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (msg)

}  // namespace

// ---- parsing and defaults ---------------------------------------------------------------

TEST(LrScheduleConfig, NoSchedulerKeepsTheOptimizersConstantLrAsBefore) {
  const Config c = parse_config(json::parse(R"({"optimizer": {"params": {"lr": 3e-4}}})"));
  EXPECT_EQ(c.scheduler.type, LrScheduleType::Constant);
  const LrSchedule s{c.scheduler};
  // The float the engine has always been built with (OptimizerConfig::lr), not 3e-4.
  for (int64_t step : {0, 1, 7, 100000}) EXPECT_EQ(s.lr_at(step), static_cast<double>(c.optimizer.lr));
  EXPECT_EQ(s.lr_at(0), static_cast<double>(3e-4f));
  EXPECT_NE(s.lr_at(0), 3e-4);
}

TEST(LrScheduleConfig, WarmupLRAsInTheDocs) {
  const Config c = parse_config(with_scheduler(json::parse(
      R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000,
          "warmup_type": "log"}})")));
  EXPECT_EQ(c.scheduler.type, LrScheduleType::WarmupLR);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.001);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::Log);
}

TEST(LrScheduleConfig, DefaultsAreDeepSpeeds) {
  // WarmupLR: warmup_max_lr defaults to the optimizer's lr, as written (double).
  Config c = parse_config(with_scheduler({{"type", "WarmupLR"}}, 3e-4));
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::Log);
  // WarmupDecayLR: warmup_max_lr defaults to 0.001 whatever the optimizer's lr.
  c = parse_config(with_scheduler({{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 5000}}}}, 0.5));
  EXPECT_EQ(c.scheduler.warmup_max_lr, 1e-3);
  EXPECT_EQ(c.scheduler.total_num_steps, 5000);
  // WarmupCosineLR: ratios of the optimizer's lr.
  c = parse_config(with_scheduler({{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 5000}}}}, 6e-4));
  EXPECT_EQ(c.scheduler.warmup_min_ratio, 0.0);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 1e-4);
  EXPECT_EQ(c.scheduler.optimizer_lr, 6e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  // Step counts in DeepSpeed's float notation are whole numbers, as elsewhere.
  c = parse_config(with_scheduler(json::parse(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1e2}})")));
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
}

TEST(LrScheduleConfig, OverridesReachTheSchedulerLikeAnyKey) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata-lr-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "c.json").string();
  std::ofstream(path) << with_scheduler(json::parse(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1000}})"))
                             .dump();
  Config c = load_config(path, {"scheduler.params.warmup_num_steps=100", "scheduler.params.warmup_type=linear"});
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::Linear);
  // The whole section from the command line, onto a file without one.
  std::ofstream(path) << R"({"optimizer": {"params": {"lr": 1e-3}}})";
  c = load_config(path, {"scheduler.type=WarmupCosineLR", "scheduler.params.total_num_steps=2000",
                         "scheduler.params.warmup_num_steps=200"});
  EXPECT_EQ(c.scheduler.type, LrScheduleType::WarmupCosineLR);
  EXPECT_EQ(c.scheduler.total_num_steps, 2000);
  // A misspelt override fails like the file would, naming the key.
  std::string m;
  try {
    load_config(path, {"scheduler.type=WarmupLR", "scheduler.params.warmup_num_step=100"});
  } catch (const ConfigError& e) {
    m = e.what();
  }
  EXPECT_HAS(m, "with the overrides");
  EXPECT_HAS(m, "unknown config key 'scheduler.params.warmup_num_step'");
  std::filesystem::remove_all(dir);
}

// ---- refusals: each names the key and the fix ---------------------------------------------

TEST(LrScheduleConfig, TypesOtherThanTheThreeAreRefusedNamingThem) {
  for (const char* t : {"OneCycle", "LRRangeTest", "CosineAnnealingLR", "warmuplr", ""}) {
    const std::string m = scheduler_error({{"type", t}});
    EXPECT_HAS(m, std::string("scheduler.type = \"") + t + "\" is invalid");
    EXPECT_HAS(m, "\"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
    EXPECT_HAS(m, "case-sensitive");
    EXPECT_HAS(m, "OneCycle and LRRangeTest");
  }
  std::string m = scheduler_error({{"type", 1}});
  EXPECT_HAS(m, "scheduler.type = 1 is invalid: expected a string");
  m = scheduler_error({{"params", {{"warmup_num_steps", 10}}}});
  EXPECT_HAS(m, "scheduler.type is missing");
  EXPECT_HAS(m, "remove the scheduler section for a constant learning rate");
}

TEST(LrScheduleConfig, SectionsOfTheWrongShapeAreRefused) {
  std::string m = error_of(json::parse(R"({"scheduler": "WarmupLR"})"));
  EXPECT_HAS(m, "scheduler = \"WarmupLR\" is invalid: expected a JSON object");
  m = scheduler_error({{"type", "WarmupLR"}, {"params", {1, 2}}});
  EXPECT_HAS(m, "scheduler.params = [1,2] is invalid: expected a JSON object");
}

TEST(LrScheduleConfig, UnknownKeysNameTheDottedKeyAndTheNearestValidOne) {
  std::string m = scheduler_error({{"type", "WarmupLR"}, {"parms", json::object()}});
  EXPECT_HAS(m, "unknown config key 'scheduler.parms'");
  EXPECT_HAS(m, "did you mean 'params'");
  m = scheduler_error({{"type", "WarmupLR"}, {"params", {{"warmup_num_step", 10}}}});
  EXPECT_HAS(m, "unknown config key 'scheduler.params.warmup_num_step'");
  EXPECT_HAS(m, "did you mean 'warmup_num_steps'");
  m = scheduler_error({{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 10}, {"cos_min_raito", 0.1}}}});
  EXPECT_HAS(m, "unknown config key 'scheduler.params.cos_min_raito'");
  EXPECT_HAS(m, "did you mean 'cos_min_ratio'");
  // DeepSpeed's resume argument: Strata resumes from the engine's step count instead.
  m = scheduler_error({{"type", "WarmupLR"}, {"params", {{"last_batch_iteration", -1}}}});
  EXPECT_HAS(m, "unknown config key 'scheduler.params.last_batch_iteration'");
}

TEST(LrScheduleConfig, KeysOfAnotherTypeSayWhichTypeTheyBelongTo) {
  std::string m = scheduler_error({{"type", "WarmupLR"}, {"params", {{"total_num_steps", 100}}}});
  EXPECT_HAS(m, "scheduler.params.total_num_steps does not apply to WarmupLR");
  EXPECT_HAS(m, "\"WarmupDecayLR\" or \"WarmupCosineLR\"");
  m = scheduler_error({{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 100}, {"warmup_max_lr", 1e-3}}}});
  EXPECT_HAS(m, "scheduler.params.warmup_max_lr does not apply to WarmupCosineLR");
  EXPECT_HAS(m, "optimizer.params.lr");
  m = scheduler_error({{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 100}, {"warmup_min_lr", 0}}}});
  EXPECT_HAS(m, "scheduler.params.warmup_min_lr does not apply to WarmupCosineLR");
  m = scheduler_error({{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 100}, {"cos_min_ratio", 0.1}}}});
  EXPECT_HAS(m, "scheduler.params.cos_min_ratio only applies to WarmupCosineLR");
  m = scheduler_error({{"type", "WarmupLR"}, {"params", {{"warmup_min_ratio", 0.1}}}});
  EXPECT_HAS(m, "scheduler.params.warmup_min_ratio only applies to WarmupCosineLR");
}

TEST(LrScheduleConfig, WrongTypesNameTheKeyTheValueAndWhatIsAccepted) {
  struct Case {
    const char* type;
    const char* params;
    const char* expected;
  };
  const Case cases[] = {
      {"WarmupLR", R"({"warmup_num_steps": "100"})",
       "scheduler.params.warmup_num_steps = \"100\" is invalid: expected a whole number >= 1"},
      {"WarmupLR", R"({"warmup_num_steps": true})", "scheduler.params.warmup_num_steps = true is invalid"},
      {"WarmupLR", R"({"warmup_max_lr": "1e-3"})",
       "scheduler.params.warmup_max_lr = \"1e-3\" is invalid: expected a number > 0"},
      {"WarmupLR", R"({"warmup_max_lr": [0.001]})", "scheduler.params.warmup_max_lr = [0.001] is invalid"},
      {"WarmupLR", R"({"warmup_min_lr": null})",
       "scheduler.params.warmup_min_lr = null is invalid: expected a number >= 0"},
      {"WarmupLR", R"({"warmup_type": "cosine"})",
       "scheduler.params.warmup_type = \"cosine\" is invalid: expected \"log\" or \"linear\""},
      {"WarmupLR", R"({"warmup_type": 1})", "scheduler.params.warmup_type = 1 is invalid: expected a string"},
      {"WarmupDecayLR", R"({"total_num_steps": 1.5e3, "warmup_num_steps": 2.5})",
       "scheduler.params.warmup_num_steps = 2.5 is invalid"},
      {"WarmupDecayLR", R"({"total_num_steps": "auto"})", "scheduler.params.total_num_steps = \"auto\" is invalid"},
      {"WarmupCosineLR", R"({"total_num_steps": 100, "warmup_min_ratio": "0.1"})",
       "scheduler.params.warmup_min_ratio = \"0.1\" is invalid: expected a number from 0 to 1"},
  };
  for (const auto& c : cases) {
    const std::string m = scheduler_error({{"type", c.type}, {"params", json::parse(c.params)}});
    EXPECT_HAS(m, c.expected);
  }
  // The HuggingFace Trainer's placeholder gets its own hint.
  EXPECT_HAS(scheduler_error({{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", "auto"}}}}), "HuggingFace");
}

TEST(LrScheduleConfig, OutOfRangeValuesNameTheKey) {
  struct Case {
    const char* type;
    const char* params;
    const char* expected;
  };
  const Case cases[] = {
      {"WarmupLR", R"({"warmup_num_steps": 0})",
       "scheduler.params.warmup_num_steps = 0 is invalid: expected a whole number >= 1"},
      {"WarmupLR", R"({"warmup_num_steps": -5})", "scheduler.params.warmup_num_steps = -5 is invalid"},
      {"WarmupLR", R"({"warmup_num_steps": 3e9})", "scheduler.params.warmup_num_steps = 3000000000.0 is invalid"},
      {"WarmupDecayLR", R"({"total_num_steps": 0, "warmup_num_steps": 1})",
       "scheduler.params.total_num_steps = 0 is invalid: expected a whole number >= 1"},
      {"WarmupCosineLR", R"({"total_num_steps": -100})", "scheduler.params.total_num_steps = -100 is invalid"},
      {"WarmupLR", R"({"warmup_min_lr": -1e-5})",
       "scheduler.params.warmup_min_lr = -1e-05 is invalid: expected a number >= 0"},
      {"WarmupLR", R"({"warmup_max_lr": 0})", "scheduler.params.warmup_max_lr = 0 is invalid: expected a number > 0"},
      {"WarmupCosineLR", R"({"total_num_steps": 100, "warmup_min_ratio": 1.5})",
       "scheduler.params.warmup_min_ratio = 1.5 is invalid: expected a number from 0 to 1"},
      {"WarmupCosineLR", R"({"total_num_steps": 100, "cos_min_ratio": -0.1})",
       "scheduler.params.cos_min_ratio = -0.1 is invalid: expected a number from 0 to 1"},
  };
  for (const auto& c : cases) {
    const std::string m = scheduler_error({{"type", c.type}, {"params", json::parse(c.params)}});
    EXPECT_HAS(m, c.expected);
  }
}

TEST(LrScheduleConfig, ChecksAcrossKeysNameBothAndTheFix) {
  for (const char* type : {"WarmupDecayLR", "WarmupCosineLR"}) {
    std::string m = scheduler_error({{"type", type}, {"params", {{"warmup_num_steps", 10}}}});
    EXPECT_HAS(m, std::string("scheduler.params.total_num_steps is required for ") + type);
    EXPECT_HAS(m, "strata.steps");
    m = scheduler_error({{"type", type}, {"params", {{"total_num_steps", 50}, {"warmup_num_steps", 100}}}});
    EXPECT_HAS(m, "scheduler.params.total_num_steps = 50 is less than scheduler.params.warmup_num_steps = 100:");
    EXPECT_HAS(m, "raise total_num_steps or lower warmup_num_steps");
    m = scheduler_error({{"type", type}, {"params", {{"total_num_steps", 500}}}});
    EXPECT_HAS(m, "scheduler.params.warmup_num_steps = 1000 (the default)");
  }
  // Both problems at once: the first of the checks across keys is reported.
  const json min_above_max = {{"total_num_steps", 50}, {"warmup_min_lr", 0.01}, {"warmup_max_lr", 0.001}};
  std::string m = scheduler_error({{"type", "WarmupDecayLR"}, {"params", min_above_max}});
  EXPECT_HAS(m, "scheduler.params.total_num_steps = 50 is less than");
  json params = min_above_max;
  params["warmup_num_steps"] = 5;
  m = scheduler_error({{"type", "WarmupDecayLR"}, {"params", params}});
  EXPECT_HAS(m, "scheduler.params.warmup_min_lr = 0.01 is above scheduler.params.warmup_max_lr = 0.001:");
  EXPECT_HAS(m, "lower warmup_min_lr or raise warmup_max_lr");
  m = error_of(with_scheduler({{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.01}}}}, 1e-3));
  EXPECT_HAS(m, "(not given: optimizer.params.lr)");
  // total_num_steps == warmup_num_steps is allowed: the decay is immediate.
  EXPECT_EQ(scheduler_error({{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 10}, {"warmup_num_steps", 10}}}}), "");
}

// ---- values worked out by hand (the full sequences are test_lr_schedule.py's) ---------

TEST(LrSchedule, TheFirstStepRunsWithTheValueDeepSpeedSetsAtConstruction) {
  SchedulerConfig c;
  c.type = LrScheduleType::WarmupLR;
  c.warmup_min_lr = 0.125;
  c.warmup_max_lr = 1.125;
  c.warmup_num_steps = 8;
  c.warmup_type = WarmupType::Linear;
  const LrSchedule s{c};
  // Step 1 (0 taken): DeepSpeed's lr at last_batch_iteration -1, warmup_min_lr. Step 2:
  // iteration 0, fraction 0/8. Then k/8 of the way, and the peak from iteration 8 on.
  EXPECT_EQ(s.lr_at(0), 0.125);
  EXPECT_EQ(s.lr_at(1), 0.125);
  EXPECT_EQ(s.lr_at(2), 0.25);
  EXPECT_EQ(s.lr_at(5), 0.625);
  EXPECT_EQ(s.lr_at(8), 1.0);
  EXPECT_EQ(s.lr_at(9), 1.125);
  EXPECT_EQ(s.lr_at(1000000), 1.125);
  // Log: log(k + 1) / log(8) of the way.
  c.warmup_type = WarmupType::Log;
  const LrSchedule l{c};
  EXPECT_EQ(l.lr_at(1), 0.125);
  EXPECT_DOUBLE_EQ(l.lr_at(4), 0.125 + std::log(4.0) / std::log(8.0));
  EXPECT_DOUBLE_EQ(l.lr_at(8), 1.125);  // iteration 7, the last of the warm-up: log(8) / log(8)
}

TEST(LrSchedule, DecayEndsAtTheMinimumAtTotalNumStepsAndStaysThere) {
  SchedulerConfig c;
  c.type = LrScheduleType::WarmupDecayLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1.0;
  c.warmup_num_steps = 4;
  c.total_num_steps = 12;
  c.warmup_type = WarmupType::Linear;
  const LrSchedule s{c};
  EXPECT_EQ(s.lr_at(5), 1.0);          // iteration 4: (12 - 4) / (12 - 4)
  EXPECT_EQ(s.lr_at(9), 0.5);          // iteration 8: 4 / 8
  EXPECT_EQ(s.lr_at(13), 0.0);         // iteration 12 = total_num_steps
  EXPECT_EQ(s.lr_at(100), 0.0);
}

TEST(LrSchedule, CosineStartsAtZeroAndEndsAtTheFloorOfTheOptimizersLr) {
  SchedulerConfig c;
  c.type = LrScheduleType::WarmupCosineLR;
  c.optimizer_lr = 2.0;
  c.warmup_min_ratio = 0.25;
  c.cos_min_ratio = 0.125;
  c.warmup_num_steps = 4;
  c.total_num_steps = 12;
  c.warmup_type = WarmupType::Linear;
  const LrSchedule s{c};
  EXPECT_EQ(s.lr_at(0), 0.0);          // DeepSpeed's WarmupCosineLR before its first step
  EXPECT_EQ(s.lr_at(1), 0.5);          // warmup_min_ratio * 2
  EXPECT_EQ(s.lr_at(3), 2.0 * (0.25 + 0.5 * 0.75));
  EXPECT_DOUBLE_EQ(s.lr_at(8), 2.0 * (0.125 + 0.875 * 0.5));  // half-way through the cosine
  EXPECT_EQ(s.lr_at(12), 0.25);        // the floor, cos_min_ratio * 2
  EXPECT_EQ(s.lr_at(500), 0.25);       // and it stays there (DeepSpeed clamps)
}

// ---- the engine takes the lr it is given --------------------------------------------------

namespace {

// Two optimizer steps of a small engine on a fixed synthetic gradient; before step k,
// set_learning_rate(lrs[k]) unless lrs[k] < 0. Returns the parameters afterwards.
std::vector<float> two_steps(float built_lr, std::vector<double> lrs, std::vector<double>* seen = nullptr) {
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  auto device = make_device({});
  EngineOptions o;
  o.stage = 3;
  o.optimizer.lr = built_lr;
  o.optimizer.weight_decay = 0.1f;
  o.optimizer_threads = 1;
  o.store.device_budget = 4 << 20;
  o.store.pinned_budget = 4 << 20;
  ZeroEngine engine(*device, *comm, *comm, o, {{"g", 1000, InitKind::Normal, 0.5f, {}}});
  engine.set_schedule({0});
  for (double lr : lrs) {
    if (lr >= 0) engine.set_learning_rate(lr);
    if (seen) seen->push_back(engine.learning_rate());
    engine.begin_micro_step();
    const float* p = engine.acquire_f32(0);
    float* grad = engine.gradient_f32(0);
    for (uint64_t i = 0; i < engine.group_numel(0); ++i) grad[i] = std::sin(p[i] * 3.0f + static_cast<float>(i));
    engine.release_params(0);
    engine.grads_ready(0);
    EXPECT_TRUE(engine.step());
  }
  return engine.gather_full_params(0);
}

}  // namespace

TEST(LrSchedule, TheEngineStepsWithTheLearningRateItIsGiven) {
  const std::vector<float> built = two_steps(0.25f, {-1, -1});
  const std::vector<float> set = two_steps(0.01f, {0.25, 0.25});
  const std::vector<float> other = two_steps(0.01f, {-1, -1});
  EXPECT_EQ(set, built);   // bit for bit: the same lr, however it got there
  EXPECT_NE(set, other);   // and not the lr the engine was built with
  // lr 0 leaves the weights as they were initialised, weight decay included.
  EXPECT_EQ(two_steps(0.01f, {0.0, 0.0}), two_steps(0.5f, {0.0, 0.0}));
  // Set before step 2 only: step 1 ran with the built lr.
  std::vector<double> seen;
  const std::vector<float> mixed = two_steps(0.01f, {-1, 0.25}, &seen);
  EXPECT_NE(mixed, built);
  EXPECT_NE(mixed, other);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], static_cast<double>(0.01f));
  EXPECT_EQ(seen[1], 0.25);
}
