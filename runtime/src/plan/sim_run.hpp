// The one simulation path: a model without math stepped through the step driver
// (step_driver.hpp) on a fresh sim device, with the real engine, tiered store and
// prefetcher, per-step figures collected from the device clock and the engine's stats.
// simulate_training (sim_step.hpp: a model of arbitrary groups) and simulate_plan
// (plan.hpp: the GPT, SimGpt) both run it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/runtime/plan/sim_step.hpp"
#include "strata/runtime/train/step_driver.hpp"

namespace strata {

// A model the simulator steps: its kernels take known times on the run's compute stream.
class SimModel {
 public:
  virtual ~SimModel() = default;
  // One optimizer step of `micro_batches` micro-batches, through run_step.
  virtual StepResult step(ZeroEngine& engine, WeightSource& source, int micro_batches) = 0;
  // Kernel seconds issued since the last call (the step's compute time).
  virtual double take_compute_s() = 0;
};

struct SimModelSpec {
  std::vector<GroupSpec> groups;             // the engine's groups
  std::vector<std::vector<uint64_t>> parts;  // the model's groups in parts of the engine's (PartedSource); empty: whole
  std::vector<int> schedule;                 // given to the engine; empty: it learns the first micro-step's order
  std::function<std::unique_ptr<SimModel>(Stream& compute)> make;  // the model, on the run's compute stream
};

// opts.steps optimizer steps. Where any home is NVMe (parameters, optimizer states or
// activation checkpoints) and no path is given, one placeholder path is set: sim never
// opens it. The optimizer runs one thread (its math never runs on sim).
SimRunResult run_simulation(const SimModelSpec& model, const SimRunOptions& opts);

}  // namespace strata
