// Learning-rate schedules: DeepSpeed's `scheduler` section (WarmupLR, WarmupDecayLR,
// WarmupCosineLR), with DeepSpeed's parameter names, defaults and formulas
// (deepspeed/runtime/lr_schedules.py), so a DeepSpeed config gives the same learning
// rate at every optimizer step here (docs/configuration.md, "scheduler").
//
// The schedule is a pure function of the number of optimizer steps already taken, so
// it needs no state of its own: resuming from a checkpoint, which restores the engine's
// step count, resumes the schedule too.
#pragma once

#include <cstdint>

namespace strata {

enum class LrScheduleType {
  Constant,        // no `scheduler` section: optimizer.params.lr at every step
  WarmupLR,        // warm up from warmup_min_lr to warmup_max_lr, then hold
  WarmupDecayLR,   // WarmupLR, then linear decay to warmup_min_lr at total_num_steps
  WarmupCosineLR,  // warm up to optimizer.params.lr, then cosine decay
};
enum class WarmupType { Log, Linear };  // DeepSpeed's warmup_type "log", "linear"

const char* to_string(LrScheduleType t);  // DeepSpeed's name; "constant" for Constant
const char* to_string(WarmupType t);

// The parsed `scheduler` section, defaults resolved (config.cpp). Learning rates are
// doubles, as the Python floats DeepSpeed computes with, so the two agree to the last
// bit or two; the engine's Adam keeps its lr in double too.
struct SchedulerConfig {
  LrScheduleType type = LrScheduleType::Constant;
  // optimizer.params.lr as written. Constant's lr; WarmupLR's default warmup_max_lr;
  // WarmupCosineLR's peak, which its ratios scale.
  double optimizer_lr = 1e-3;
  double warmup_min_lr = 0.0;           // WarmupLR, WarmupDecayLR
  double warmup_max_lr = 1e-3;          // WarmupLR, WarmupDecayLR
  int64_t warmup_num_steps = 1000;      // optimizer steps, >= 1 (1 acts as 2, as in DeepSpeed)
  WarmupType warmup_type = WarmupType::Log;
  int64_t total_num_steps = 0;          // WarmupDecayLR, WarmupCosineLR: >= warmup_num_steps
  double warmup_min_ratio = 0.0;        // WarmupCosineLR: of optimizer_lr, at the start
  double cos_min_ratio = 1e-4;          // WarmupCosineLR: of optimizer_lr, at the end
};

struct LrSchedule {
  SchedulerConfig config;

  // The learning rate of the optimizer step that follows `step` steps already taken
  // (0 for the first step; ZeroEngine::optimizer_steps() before step()). DeepSpeed sets
  // the lr when the scheduler is built (its last_batch_iteration = -1) and advances it
  // after every optimizer step, so step s runs with the formula at iteration s - 1:
  // the first step gets warmup_min_lr (WarmupLR, WarmupDecayLR) or 0 (WarmupCosineLR).
  // For Constant, optimizer_lr rounded to float: the value the engine used before
  // schedules existed (OptimizerConfig::lr is a float), so such runs are unchanged.
  double lr_at(int64_t step) const;
};

}  // namespace strata
