// What a model asks of whoever holds its weights. The model knows nothing of sharding
// or tiers: before it computes with a parameter group it asks for
// the group's full parameters, and after backward it hands back the group's gradient.
// The ZeRO engine (runtime/) implements this; so can another trainer's store.
//
// Buffers are device memory of the engine's backend (host memory on the cpu backend),
// in the group's flat layout, of element type dtype(): F32, or BF16 / F16 when the
// source trains in 16 bits (parameters and gradients alike; master weights are the
// source's business).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/event.hpp"
#include "strata/model/activation_store.hpp"

namespace strata {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual int num_groups() const = 0;
  virtual uint64_t group_numel(int g) const = 0;  // elements
  // The element type of every parameter and gradient buffer this source hands out.
  virtual DType dtype() const { return DType::F32; }

  // The full parameters of group g, ready to read when this returns (it waits for any
  // transfer still in flight). Valid until release_params(g).
  virtual const void* acquire_params(int g) = 0;
  virtual void release_params(int g) = 0;

  // A buffer of group_numel(g) elements for group g's gradient of this micro-batch. The
  // model overwrites every element, then calls grads_ready(g); the buffer is not
  // touched by the model after that.
  virtual void* gradient_buffer(int g) = 0;
  virtual void grads_ready(int g) = 0;

  // Parts (per-tensor gathers and tiles; gpt_layout.hpp's gpt_parts): a source may split
  // a group into parts, contiguous element ranges it gathers, releases and reduce-scatters
  // one at a time, so the device holds a few of a block's tensors rather than the whole
  // block. Part p starts at element part_begin(g, p) (part 0 at 0) and ends where the next
  // begins (the last at group_numel(g)); each holds whole tensors, or whole rows of one
  // linear weight (a tile). A model that reads parts asks for each one when it first reads
  // it and releases it after its last read (part_gradient / part_grads_ready likewise:
  // the buffer holds the part's elements only, each overwritten once). With one part, the
  // part calls are the whole-group calls; a source with several refuses acquire_params.
  virtual int num_parts(int g) const { return g >= 0 ? 1 : 0; }
  virtual uint64_t part_begin(int /*g*/, int /*p*/) const { return 0; }
  virtual const void* acquire_part(int g, int /*p*/) { return acquire_params(g); }
  virtual void release_part(int g, int /*p*/) { release_params(g); }
  virtual void* part_gradient(int g, int /*p*/) { return gradient_buffer(g); }
  virtual void part_grads_ready(int g, int /*p*/) { grads_ready(g); }

  // The same hand-backs, with the model's work still running: `after` completes once the
  // device work the model queued that reads the parameters (or writes the gradient) is
  // done. A model on a device stream (the cuda GPT) calls these instead of synchronising
  // its stream before each hand-back, so the GPU never idles while the host catches up.
  // A source that orders its own later use of the memory after the event (the ZeRO
  // engine: its streams wait for it on the GPU, and freed memory is fenced by it) returns
  // at once; the default waits for `after` on the host, then hands back as above.
  virtual void release_params_after(int g, const Event& after) {
    after.wait();
    release_params(g);
  }
  virtual void grads_ready_after(int g, const Event& after) {
    after.wait();
    grads_ready(g);
  }
  virtual void release_part_after(int g, int p, const Event& after) {
    after.wait();
    release_part(g, p);
  }
  virtual void part_grads_ready_after(int g, int p, const Event& after) {
    after.wait();
    part_grads_ready(g, p);
  }

  // Where the model's activation checkpoints live (activation_store.hpp), when this source
  // holds them; null when the model keeps its own.
  virtual ActivationStore* activation_store() { return nullptr; }

  // The same, for callers that only handle fp32 (tests, tools): throws when dtype() is
  // not F32.
  const float* acquire_f32(int g) {
    require_f32("acquire_f32");
    return static_cast<const float*>(acquire_params(g));
  }
  float* gradient_f32(int g) {
    require_f32("gradient_f32");
    return static_cast<float*>(gradient_buffer(g));
  }

 private:
  void require_f32(const char* what) const {
    if (dtype() != DType::F32)
      throw Error(std::string(what) + ": this weight source trains in " + to_string(dtype()) +
                  ", not fp32; use acquire_params / gradient_buffer with dtype()");
  }
};

}  // namespace strata
