// The speculative optimizer (strata.speculative_optimizer): during the last micro-step's
// backward, each sub-group with a Next set (the resolved layout's speculative sub-groups)
// is stepped into it as soon as its group's gradient is reduced, one group behind the
// backward pass, assuming the step that will be taken: t + 1, no clipping, finite
// gradients, the learning rate of the time. step() validates with the norm: it commits
// (the Next sets become the states) or rolls back (they are dropped, and the sub-groups
// step again plainly, or the step is skipped). Bit-identical to the plain step.
// Stage 3's CPU updates run on the optimizer lane; the rest on the model's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine_state.hpp"
#include "gatherer.hpp"
#include "optimizer_lane.hpp"
#include "optimizer_steppers.hpp"

namespace strata::engine {

// gradient_clipping's factor for a norm: 1 when off or not needed.
double clip_coefficient(double clipping, double norm);

class Speculation {
 public:
  Speculation(EngineCore& core, Gatherer& gatherer, Steppers& steppers);
  ~Speculation();

  // The last micro-step reduced group g's gradient: its states start towards the
  // optimizer, and the group before it (whose reduction is done by now) is stepped.
  // next_t: the step number the speculation assumes; grad_scale: unclipped.
  void group_reduced(int g, int64_t next_t, float grad_scale);
  void pump();  // after each gradient: the lane releases what is done, starts what may
  // Everything the lane queued is done (before the learning rate changes, and at step()).
  void finish_lane();
  // step(), the norm known and the lane not yet done: where the speculation commits, lets
  // go the gradients kept for a rollback (unwritten) of the sub-groups the lane is done with.
  void free_dead_kept_grads(double norm);
  // The speculative updates' waits of this step, reset.
  double take_wait();
  bool commits(double norm) const;  // step() keeps the speculative results
  // step() with a finite norm: commits or rolls back the speculated sub-groups; returns
  // the sub-groups to step plainly, in order (the rolled back ones among them).
  std::vector<Update> settle(const std::vector<Update>& speculated, std::vector<Update> plain, double norm);
  // After a skipped step: the working parameters of speculated sub-groups back to their
  // committed master weights.
  void restore_params(const std::vector<Update>& items);
  void end_step() { queue_.clear(); }

 private:
  void speculate_group(int g, int64_t next_t, float grad_scale);
  void prefetch_first_states(const GroupState& gr);

  EngineCore& c_;
  Gatherer& gatherer_;
  Steppers& steppers_;
  std::vector<int> queue_;  // groups whose last gradients are reduced, not yet speculated
  double lr_ = 0;           // the learning rate the speculated sub-groups were stepped with
  double wait_ = 0;         // the speculative updates' waits so far in this step
  std::unique_ptr<OptimizerLane> lane_;  // where the resolved layout says so
};

}  // namespace strata::engine
