// The fp16 loss scaler against DeepSpeed's DynamicLossScaler (deepspeed 0.x,
// deepspeed/runtime/fp16/loss_scaler.py). The expected scales were printed by DeepSpeed's
// own class for the same overflow pattern:
//   s = DynamicLossScaler(init_scale=16, scale_window=3, min_scale=0.5, delayed_shift=H,
//                         consecutive_hysteresis=C)
//   for o in pattern: s.update_scale(bool(o)); print(s.cur_scale)
#include <gtest/gtest.h>

#include <vector>

#include "strata/runtime/engine/loss_scaler.hpp"

using namespace strata;

namespace {

std::vector<double> run(int hysteresis, bool consecutive) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = 4;
  c.loss_scale_window = 3;
  c.min_loss_scale = 0.5;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  LossScaler s(c);
  const int pattern[] = {0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0};
  std::vector<double> out;
  for (int o : pattern) {
    s.update(o != 0);
    out.push_back(s.scale());
  }
  return out;
}

}  // namespace

TEST(LossScaler, MatchesDeepSpeedsDynamicScaler) {
  EXPECT_EQ(run(1, false), (std::vector<double>{16, 8, 8, 4, 2, 2, 2, 2, 4, 4, 2, 2, 2, 2, 4, 4, 4, 8, 4, 2, 1, 1,
                                                1}));
  EXPECT_EQ(run(2, false), (std::vector<double>{16, 16, 16, 8, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 16, 16, 16, 32, 32, 16,
                                                8, 8, 8}));
  EXPECT_EQ(run(2, true), (std::vector<double>{16, 16, 16, 16, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 32, 32, 32, 64, 64,
                                               32, 16, 16, 16}));
}

TEST(LossScaler, OverflowAtTheMinimumScaleStopsTheRunWithTheFixes) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = 1;
  c.min_loss_scale = 1;
  c.hysteresis = 1;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  try {
    s.update(true);
    FAIL() << "an overflow at the minimum scale was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train in bf16"), std::string::npos) << e.what();
  }
}

TEST(LossScaler, StaticScaleNeverChangesAndDisabledIsOne) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(LossScaler().scale(), 1.0);
  EXPECT_FALSE(LossScaler().enabled());
}

TEST(LossScaler, StateRestoresExactly) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale_window = 2;
  LossScaler a(c), b(c);
  for (int o : {0, 1, 0, 0, 0}) a.update(o != 0);
  b.restore(a.state());
  for (int o : {0, 0, 1, 0, 0, 0}) {
    a.update(o != 0);
    b.update(o != 0);
    EXPECT_EQ(a.scale(), b.scale());
  }
}
