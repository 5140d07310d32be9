// The gradients the model hands back (WeightSource's gradient_buffer and grads_ready):
// each micro-batch's gradient is reduced across ranks and accumulated into this rank's
// optimizer sub-groups, whose squared norms the last micro-step sums for clipping and
// the finite check. Two kinds, one per way of reducing:
//   - stage 1 keeps the full gradient on the device, accumulated over micro-steps, and
//     all-reduces it once per step (at step(), or as each group completes when speculating);
//   - stages 2 and 3 reduce-scatter every micro-batch's gradient as soon as it is ready.
// Owns each group's gradient buffer and the events that order its reuse.
#pragma once

#include <memory>
#include <vector>

#include "engine_state.hpp"

namespace strata::engine {

class GradientReducer {
 public:
  static std::unique_ptr<GradientReducer> make(EngineCore& core);
  virtual ~GradientReducer() = default;

  void* gradient_buffer(int g);
  // The model wrote group g's gradient of micro-step `micro` (last: the step's last), or
  // will have once `after` completes (its device work still writing it).
  void grads_ready(int g, int micro, bool last, const Event& after);
  bool outstanding(int g) const { return slots_[g].grad != nullptr; }
  // At step(): every reduction issued and finished (the wait counted as exposed).
  void finish_reduction();
  // The global norm of the averaged, unscaled gradient (all ranks agree).
  double global_norm(double loss_scale) const;
  void end_step();

 protected:
  explicit GradientReducer(EngineCore& core) : c_(core), slots_(core.groups.size()) {}
  struct Slot {
    void* grad = nullptr;  // the model's gradient buffer, outstanding
    Event tail_zeroed;     // the padding beyond the model's elements is zeroed
    Event consumed;        // the last reduction that read the buffer
    Event reduced_consumed;  // the last accumulation that read the reduce-scatter output
    bool reduced = false;  // stage 1, speculating: this step's all-reduce already ran
  };
  virtual void reduce(int g, int micro, bool last) = 0;
  virtual void reduce_rest() {}  // what finish_reduction still has to issue
  virtual void reductions_done() {}  // finish_reduction: every reduction has finished
  // Adds the reduced gradient of this rank's shard (`reduced`, of type t) into the
  // group's sub-groups; the first micro-step overwrites them.
  void accumulate(GroupState& gr, const void* reduced, DType t, Event reduced_ready, bool first, bool last,
                  bool across_replicas = false);

  EngineCore& c_;
  std::vector<Slot> slots_;
};

}  // namespace strata::engine
