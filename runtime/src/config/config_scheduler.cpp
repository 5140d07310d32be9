// The `scheduler` section of the run configuration: DeepSpeed's learning-rate schedules,
// as a table like the others (config_table.cpp says how the tables work).
#include "config_scheduler.hpp"

#include <climits>
#include <cmath>
#include <string>
#include <string_view>

#include "strata/runtime/config/config.hpp"

namespace strata {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxInt = INT_MAX;  // whole numbers stored in an int

Config& config_of(void* target) { return *static_cast<Config*>(target); }

const ConfigKey& key_of(const ConfigSection& s, std::string_view name) {
  for (const ConfigKey& k : s.keys)
    if (name == k.name) return k;
  STRATA_CHECK(false, "config table: no key '" + std::string(name) + "' in '" + s.path + "'");
  __builtin_unreachable();
}


// ---- scheduler ------------------------------------------------------------------------

// DeepSpeed passes a scheduler's params to its class as keyword arguments, so each type
// takes only its own keys; a key of another type gets a message saying whose it is.
// Then the defaults that depend on the type, and the checks across keys.
void check_scheduler(const json& j, void* target);

const ConfigSection kSchedulerParams = {
    .path = "scheduler.params",
    .keys = {
        {.name = "warmup_num_steps", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
         .help = "All types. Optimizer steps of warm-up. 1 acts as 2, as in DeepSpeed (the log warm-up divides by "
                 "log(steps)).",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.warmup_num_steps)},
        {.name = "warmup_type", .type = KeyType::Text,
         .choices = {{"log", int(WarmupType::Log)}, {"linear", int(WarmupType::Linear)}},
         .note = "DeepSpeed falls back to \"log\" with a warning",
         .help = "All types. How the warm-up rises: the fraction f(i) = log(i + 1) / log(W), or i / W, of the way "
                 "(i and W below).",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.warmup_type)},
        {.name = "warmup_min_lr", .type = KeyType::Double, .lo = 0,
         .help = "WarmupLR, WarmupDecayLR. lr at the start of the warm-up, and WarmupDecayLR's lr at and after "
                 "`total_num_steps`.",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.warmup_min_lr)},
        {.name = "warmup_max_lr", .type = KeyType::Double, .lo = 0, .lo_open = true,
         .fallback = "WarmupLR: `optimizer.params.lr`; WarmupDecayLR: `0.001`",
         .help = "WarmupLR, WarmupDecayLR. lr at the end of the warm-up; at least `warmup_min_lr`. The two "
                 "defaults differ because DeepSpeed's do.",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.warmup_max_lr)},
        {.name = "total_num_steps", .type = KeyType::Whole, .min = 1, .max = kMaxInt, .fallback = "required",
         .help = "WarmupDecayLR, WarmupCosineLR. The optimizer step at which the decay reaches its end, at least "
                 "`warmup_num_steps`; usually the run's length (`strata.steps`). After it the lr stays at the end "
                 "value.",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.total_num_steps)},
        {.name = "warmup_min_ratio", .type = KeyType::Double, .lo = 0, .hi = 1,
         .help = "WarmupCosineLR. lr at the start of the warm-up, as a fraction of `optimizer.params.lr`.",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.warmup_min_ratio)},
        {.name = "cos_min_ratio", .type = KeyType::Double, .lo = 0, .hi = 1,
         .help = "WarmupCosineLR. lr at `total_num_steps` and after, as a fraction of `optimizer.params.lr`.",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.cos_min_ratio)},
    },
};

const ConfigSection kScheduler = {
    .path = "scheduler",
    .keys = {
        {.name = "type", .type = KeyType::Text,
         .choices = {{"WarmupLR", int(LrScheduleType::WarmupLR)},
                     {"WarmupDecayLR", int(LrScheduleType::WarmupDecayLR)},
                     {"WarmupCosineLR", int(LrScheduleType::WarmupCosineLR)}},
         .note = "case-sensitive, as in DeepSpeed; DeepSpeed's OneCycle and LRRangeTest and torch.optim.lr_scheduler "
                 "classes are not supported",
         .fallback = "required",
         .help = "The learning-rate schedule.",
         .field = STRATA_CONFIG_FIELD(Config, scheduler.type)},
        {.name = "params", .type = KeyType::Section, .fallback = "`{}`",
         .help = "The type's parameters (table below). A key of another type is an error that says whose key it is.",
         .section = &kSchedulerParams},
    },
    .check = check_scheduler,
};

void check_scheduler(const json& j, void* target) {
  SchedulerConfig& c = config_of(target).scheduler;
  if (!j.contains("type"))
    throw ConfigError("scheduler.type is missing: give one of " + accepted_text(key_of(kScheduler, "type")) +
                      ", or remove the scheduler section for a constant learning rate (optimizer.params.lr)");
  const std::string name = j.at("type").get<std::string>();
  const bool cosine = c.type == LrScheduleType::WarmupCosineLR;
  const bool decays = c.type != LrScheduleType::WarmupLR;
  static const json kEmpty = json::object();
  const json& p = j.contains("params") ? j.at("params") : kEmpty;
  for (const auto& [k, v] : p.items()) {
    const std::string key = "scheduler.params." + k;
    if (k == "total_num_steps" && !decays)
      throw ConfigError(key + " does not apply to WarmupLR, which holds warmup_max_lr after the warm-up: remove "
                        "it, or set scheduler.type to \"WarmupDecayLR\" or \"WarmupCosineLR\" to decay the "
                        "learning rate until total_num_steps");
    if ((k == "warmup_min_lr" || k == "warmup_max_lr") && cosine)
      throw ConfigError(key + " does not apply to WarmupCosineLR, whose peak is optimizer.params.lr and whose "
                        "start and end are warmup_min_ratio and cos_min_ratio of it: remove " + key +
                        " and set optimizer.params.lr (and the ratios), or use \"WarmupDecayLR\" for "
                        "warmup_min_lr/warmup_max_lr with a linear decay");
    if ((k == "warmup_min_ratio" || k == "cos_min_ratio") && !cosine)
      throw ConfigError(key + " only applies to WarmupCosineLR (scheduler.type is \"" + name + "\"): remove it, "
                        "or set scheduler.type to \"WarmupCosineLR\"");
  }
  if (decays && !p.contains("total_num_steps"))
    throw ConfigError("scheduler.params.total_num_steps is required for " + name +
                      ": set it to the optimizer step the decay ends at (usually the run's length, strata.steps)");
  // DeepSpeed: WarmupLR's warmup_max_lr defaults to the optimizer's lr, WarmupDecayLR's
  // to 0.001 (SchedulerConfig's default).
  if (c.type == LrScheduleType::WarmupLR && !p.contains("warmup_max_lr")) c.warmup_max_lr = c.optimizer_lr;

  if (decays && c.total_num_steps < c.warmup_num_steps)
    throw ConfigError("scheduler.params.total_num_steps = " + std::to_string(c.total_num_steps) +
                      " is less than scheduler.params.warmup_num_steps = " + std::to_string(c.warmup_num_steps) +
                      (p.contains("warmup_num_steps") ? "" : " (the default)") +
                      ": the decay follows the warm-up; raise total_num_steps or lower warmup_num_steps");
  if (!cosine && c.warmup_min_lr > c.warmup_max_lr) {
    std::string max_from = p.contains("warmup_max_lr")          ? ""
                           : c.type == LrScheduleType::WarmupLR ? " (not given: optimizer.params.lr)"
                                                                : " (not given: the default)";
    throw ConfigError("scheduler.params.warmup_min_lr = " + p.at("warmup_min_lr").dump() +
                      " is above scheduler.params.warmup_max_lr = " + json(c.warmup_max_lr).dump() + max_from +
                      ": the warm-up rises from warmup_min_lr to warmup_max_lr; lower warmup_min_lr or raise "
                      "warmup_max_lr");
  }
}

}  // namespace

const ConfigSection& scheduler_config_section() { return kScheduler; }

}  // namespace strata
