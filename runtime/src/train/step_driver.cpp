#include "strata/runtime/train/step_driver.hpp"

#include <span>

#include "strata/collectives/communicator.hpp"
#include "strata/core/clock.hpp"
#include "strata/core/error.hpp"

namespace strata {

StepResult run_step(ZeroEngine& engine, int micro_batches, const MicroBatchFn& micro, coll::Communicator* comm) {
  STRATA_CHECK(micro_batches >= 1, "a step needs at least one micro-batch");
  StepResult r;
  r.before = engine.stats();
  const double t0 = steady_seconds();
  double loss = 0;
  for (int m = 0; m < micro_batches; ++m) {
    engine.begin_micro_step();
    loss += micro(m, static_cast<float>(engine.loss_scale()));
  }
  // Before step(): the loss is known whether or not the step is then skipped.
  int ranks = 1;
  if (comm) {
    comm->all_reduce(std::span<double>(&loss, 1)).wait();
    ranks = comm->size();
  }
  r.loss = loss / static_cast<double>(ranks * micro_batches);
  r.stepped = engine.step();
  r.seconds = steady_seconds() - t0;
  r.after = engine.stats();
  return r;
}

TokenBatches::TokenBatches(const GptModel& model, int micro_batches, Fill fill)
    : micro_batches(micro_batches),
      inputs(static_cast<size_t>(model.options().micro_batch) * model.shape().seq_len),
      targets(inputs.size()),
      fill(std::move(fill)) {}

StepResult run_step(ZeroEngine& engine, GptModel& model, WeightSource& source, TokenBatches& batches,
                    coll::Communicator* comm) {
  return run_step(
      engine, batches.micro_batches,
      [&](int m, float loss_scale) {
        if (batches.fill) batches.fill(m, batches.inputs.data(), batches.targets.data());
        return model.forward_backward(source, batches.inputs.data(), batches.targets.data(), loss_scale);
      },
      comm);
}

}  // namespace strata
