// DeepSpeed's learning-rate schedules (lr_schedule.hpp). The arithmetic follows
// deepspeed/runtime/lr_schedules.py operation for operation (same operands, same
// order), so that the results agree with DeepSpeed's to rounding of the last bit;
// tests/runtime/test_lr_schedule.py compares them with DeepSpeed's own classes.
#include "strata/runtime/config/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "strata/core/error.hpp"

namespace strata {

const char* to_string(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::Constant: return "constant";
    case LrScheduleType::WarmupLR: return "WarmupLR";
    case LrScheduleType::WarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleType::WarmupCosineLR: return "WarmupCosineLR";
  }
  return "?";
}

const char* to_string(WarmupType t) {
  switch (t) {
    case WarmupType::Log: return "log";
    case WarmupType::Linear: return "linear";
  }
  return "?";
}

namespace {

// DeepSpeed raises a warm-up of 1 step to 2: the log warm-up divides by log(steps).
int64_t warmup_steps(const SchedulerConfig& c) { return std::max<int64_t>(2, c.warmup_num_steps); }

// The warm-up fraction at iteration `it` (0 <= it < warmup_steps): 0 at it = 0, rising
// towards 1. DeepSpeed's _get_gamma / get_lr_ratio during warm-up.
double warmup_fraction(const SchedulerConfig& c, int64_t it) {
  const int64_t warm = warmup_steps(c);
  if (c.warmup_type == WarmupType::Log)
    return 1.0 / std::log(static_cast<double>(warm)) * std::log(static_cast<double>(it + 1));
  return static_cast<double>(it) / static_cast<double>(warm);
}

}  // namespace

double LrSchedule::lr_at(int64_t step) const {
  const SchedulerConfig& c = config;
  if (c.type == LrScheduleType::Constant) return static_cast<double>(static_cast<float>(c.optimizer_lr));
  STRATA_CHECK(step >= 0, "lr_at(" + std::to_string(step) + "): a step count is never negative");
  // DeepSpeed's last_batch_iteration when this step runs: -1 for the first step (the lr
  // set when the scheduler is built), then one more after each optimizer step.
  const int64_t it = step - 1;
  const int64_t warm = warmup_steps(c);

  if (c.type == LrScheduleType::WarmupCosineLR) {
    if (it < 0) return 0.0;  // DeepSpeed's get_lr before the first scheduler step
    double ratio;
    if (it < warm) {
      ratio = c.warmup_min_ratio + warmup_fraction(c, it) * (1.0 - c.warmup_min_ratio);
    } else {
      const int64_t real_last_step = it - warm + 1;
      const int64_t real_total_steps = std::max<int64_t>(1, c.total_num_steps - warm);
      // Clamped, as DeepSpeed does: past total_num_steps the lr stays at the floor.
      const double progress =
          std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
      const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
    }
    return c.optimizer_lr * ratio;
  }

  // WarmupLR and WarmupDecayLR: warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma.
  if (it < 0) return c.warmup_min_lr;
  double gamma = 1.0;
  if (it < warm) {
    gamma = warmup_fraction(c, it);
  } else if (c.type == LrScheduleType::WarmupDecayLR) {
    gamma = std::max(0.0, static_cast<double>(c.total_num_steps - it) /
                              std::max(1.0, static_cast<double>(c.total_num_steps - warm)));
  }
  return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
}

}  // namespace strata
