// Where a model keeps its activation checkpoints between forward and backward, when its
// weight source holds them (WeightSource::activation_store(), GptOptions::checkpoints_from_source).
// With activation checkpointing a GPT keeps, per micro-batch, the input of every block
// and the final residual: checkpoints 0..L, each [micro_batch x seq_len, d_model] fp32.
// The store decides where they live between uses: on the device throughout, or moved to
// pinned host memory (or NVMe) after forward and brought back ahead of backward
// (activation_checkpointing.cpu_checkpointing). The model knows nothing of tiers; it
// calls, per micro-batch:
//   forward:  begin_write(0); then for each block l: begin_write(l + 1) for its output,
//             the block, end_forward(l, keep); after the head, end_forward(L, false)
//   backward: for l = L-1 .. 0: read(l), the block's recompute and backward, finish(l)
// Buffers are device memory of the source's backend (host memory on the cpu backend).
#pragma once

#include <cstdint>

namespace strata {

class ActivationStore {
 public:
  virtual ~ActivationStore() = default;
  virtual int count() const = 0;         // checkpoints per micro-batch (layers + 1)
  virtual uint64_t bytes() const = 0;    // bytes of each

  // A device buffer for checkpoint i, to be overwritten; ready when this returns. Valid
  // until end_forward(i).
  virtual void* begin_write(int i) = 0;
  // The model wrote checkpoint i and is done reading it in forward (its device work has
  // finished). keep: backward will read it; otherwise its contents are dead.
  virtual void end_forward(int i, bool keep) = 0;
  // Backward: checkpoint i on the device, ready to read when this returns (it waits for
  // a transfer still in flight). Valid until finish(i).
  virtual const void* read(int i) = 0;
  // Backward is done with checkpoint i (its device work has finished): contents dead.
  virtual void finish(int i) = 0;
};

}  // namespace strata
