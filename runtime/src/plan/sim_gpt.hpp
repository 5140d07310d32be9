// The GPT on the sim backend: the real model's acquire/compute/release order (the very
// templates of strata/model/gpt_driver.hpp that the cpu and cuda models run) over kernels
// that compute nothing and take the planner's kernel times (group_times) on one compute
// stream, which the model's thread waits for, as the cpu model's does. What `strata plan
// --simulate` drives through the step driver.
#pragma once

#include <vector>

#include "strata/core/device.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/plan/plan_detail.hpp"

namespace strata::plan {

class SimGpt final : public GptModel {
 public:
  // times: per group (gpt_groups), blocks' backward with the recompute when checkpointing.
  // A block read in parts (WeightSource::num_parts) gives each part its share of the
  // block's time in proportion to its elements.
  SimGpt(const GptShape& shape, const GptOptions& opts, std::vector<GroupTimes> times, double device_flops,
         Stream& compute);
  ~SimGpt() override;

  // Returns 0: there is no loss, only time.
  double forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets,
                          float loss_scale = 1.0f) override;
  // The planner times training steps only: these throw.
  double forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) override;
  void next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* logits) override;
  uint64_t activation_bytes() const override { return 0; }  // the planner counts them (activation_bytes)

  // Kernel seconds issued since the last call (a step's compute time).
  double take_compute_s();

 private:
  struct Kernels;
  std::unique_ptr<Kernels> k_;
};

}  // namespace strata::plan
