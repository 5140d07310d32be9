#include "strata/runtime/engine/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "strata/core/error.hpp"

namespace strata {

LossScaler::LossScaler(const Fp16Config& c)
    : enabled_(c.enabled),
      dynamic_(c.enabled && c.loss_scale == 0),
      consecutive_hysteresis_(c.consecutive_hysteresis),
      window_(c.loss_scale_window),
      hysteresis_(c.hysteresis),
      min_scale_(c.min_loss_scale) {
  if (!enabled_) return;
  st_.scale = dynamic_ ? std::ldexp(1.0, c.initial_scale_power) : c.loss_scale;
  st_.hysteresis = hysteresis_;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++st_.iter;
    return;
  }
  if (overflow) {
    if (hysteresis_ == 1 || st_.hysteresis == 1) {
      if (st_.scale <= min_scale_)
        throw Error("fp16: the gradients overflow at the minimum loss scale (" + std::to_string(min_scale_) +
                    "): training has diverged in fp16. Lower the learning rate, lower fp16.min_loss_scale, or train "
                    "in bf16 (its range is fp32's)");
      st_.scale = std::max(st_.scale / 2, min_scale_);
    } else {
      --st_.hysteresis;
    }
    st_.last_overflow_iter = st_.iter;
  } else {
    if (consecutive_hysteresis_) st_.hysteresis = hysteresis_;
    // Clean steps since the last overflow, before this one (DeepSpeed's stable_interval).
    const int64_t stable = st_.iter - st_.last_overflow_iter - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_hysteresis_) st_.hysteresis = hysteresis_;
      st_.scale *= 2;
    }
  }
  ++st_.iter;
}

}  // namespace strata
