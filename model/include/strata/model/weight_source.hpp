// What a model asks of whoever holds its weights. The model knows nothing of sharding
// or tiers (DESIGN.md, Layout): before it computes with a parameter group it asks for
// the group's full parameters, and after backward it hands back the group's gradient.
// The ZeRO engine (runtime/) implements this; so can another trainer's store.
//
// Buffers are device memory of the engine's backend (host memory on the cpu backend),
// fp32, in the group's flat layout.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual int num_groups() const = 0;
  virtual uint64_t group_numel(int g) const = 0;  // elements

  // The full parameters of group g, ready to read when this returns (it waits for any
  // transfer still in flight). Valid until release_params(g).
  virtual const float* acquire_params(int g) = 0;
  virtual void release_params(int g) = 0;

  // A buffer of group_numel(g) floats for group g's gradient of this micro-batch. The
  // model overwrites every element, then calls grads_ready(g); the buffer is not
  // touched by the model after that.
  virtual float* gradient_buffer(int g) = 0;
  virtual void grads_ready(int g) = 0;
};

}  // namespace strata
