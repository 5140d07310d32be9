// fp16 loss scaling, as DeepSpeed's (deepspeed/runtime/fp16/loss_scaler.py) does it, so a
// DeepSpeed fp16 configuration behaves the same here.
//
// The model's gradients are of loss x scale, so that small gradients stay above fp16's
// smallest values; the optimizer divides the scale out (fused into its gradient scale).
// A step whose gradients hold inf or NaN on any rank is skipped on every rank before any
// state changes (ZeroEngine::step), and the dynamic scaler reacts:
//   - overflow: with hysteresis left above 1, one is used up; otherwise the scale halves
//     (not below min_loss_scale). At the minimum already, the run cannot go on in fp16:
//     update() throws, naming the fixes.
//   - no overflow: when the clean steps before this one since the last overflow are a
//     positive multiple of loss_scale_window, the scale doubles and the hysteresis is
//     refilled (refilled after every clean step with consecutive_hysteresis).
// A static scale (loss_scale > 0) never changes; an overflow still skips the step.
#pragma once

#include <cstdint>

#include "strata/runtime/config/config.hpp"

namespace strata {

// What a checkpoint keeps of the scaler, so that a resumed run scales as the first would.
struct LossScalerState {
  double scale = 1.0;
  int64_t iter = 0;                // steps seen (skipped ones included)
  int64_t last_overflow_iter = -1;
  int hysteresis = 1;              // overflows left before the next halving
};

class LossScaler {
 public:
  // fp16 disabled: scale 1, never changes.
  LossScaler() = default;
  explicit LossScaler(const Fp16Config& c);

  double scale() const { return st_.scale; }
  bool enabled() const { return enabled_; }
  bool dynamic() const { return dynamic_; }
  // After each step: overflow says whether its gradients were not finite (the step
  // was skipped). Throws Error at the minimum scale (see the top).
  void update(bool overflow);

  const LossScalerState& state() const { return st_; }
  void restore(const LossScalerState& s) { st_ = s; }

 private:
  bool enabled_ = false, dynamic_ = false, consecutive_hysteresis_ = false;
  int window_ = 1000, hysteresis_ = 1;
  double min_scale_ = 1.0;
  LossScalerState st_;
};

}  // namespace strata
