// One optimizer step of a model under the ZeRO engine, as every caller runs it: `strata
// train`, `strata bench step` and the simulators (plan --simulate, simulate_training).
// Each micro-batch is begin_micro_step() then the model's forward and backward with the
// engine's loss scale; after the last, step(). Written once so that what is trained, what
// is benchmarked and what is simulated are the same sequence of engine calls.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "strata/model/gpt.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata {

namespace coll {
class Communicator;
}

// What one optimizer step did: the figures its callers report.
struct StepResult {
  double loss = 0;          // mean loss of the step's micro-batches (of every rank's, given a communicator)
  bool stepped = false;     // ZeroEngine::step(): false where it skipped (fp16 overflow, non-finite gradients)
  double seconds = 0;       // steady clock, from the first micro-batch to step() returning
  EngineStats before;       // the engine's running totals as the step began
  EngineStats after;        // and as it ended
  // Transfer time the step exposed: the model's waits for parameters and gradient
  // buffers, the optimizer's for states at step(), the speculative updates' during the
  // backward pass.
  double exposed_s() const {
    return after.exposed_wait_s - before.exposed_wait_s + after.optimizer_wait_s + after.speculation_wait_s;
  }
};

// One micro-batch's forward and backward, its gradients scaled by loss_scale (the
// engine's, ZeroEngine::loss_scale()); returns its loss.
using MicroBatchFn = std::function<double(int micro, float loss_scale)>;

// One optimizer step of `micro_batches` micro-batches (the engine's
// gradient_accumulation_steps). With a communicator the losses are summed over its ranks
// before step() (a collective: every rank calls run_step); the mean is over all of them.
StepResult run_step(ZeroEngine& engine, int micro_batches, const MicroBatchFn& micro, coll::Communicator* comm = nullptr);

// A step's micro-batches of tokens for a GPT: the host buffers the model reads, and what
// fills them before each micro-batch.
struct TokenBatches {
  // Writes micro-batch `micro`'s tokens (micro_batch x seq_len each).
  using Fill = std::function<void(int micro, int32_t* inputs, int32_t* targets)>;
  // Buffers of the model's micro_batch x seq_len tokens, zero until filled; without a
  // fill they stay so (the simulator's model reads no token).
  TokenBatches(const GptModel& model, int micro_batches, Fill fill = {});
  int micro_batches;
  std::vector<int32_t> inputs, targets;
  Fill fill;
};

// The GPT's step: each micro-batch's tokens filled, then model.forward_backward over source
// (the engine, or a PartedSource over it).
StepResult run_step(ZeroEngine& engine, GptModel& model, WeightSource& source, TokenBatches& batches,
                    coll::Communicator* comm = nullptr);

}  // namespace strata
