// Simulated training steps: the real ZeroEngine, TieredStore and prefetcher on the sim
// backend (core/sim.hpp), driven by a synthetic model that has sizes and FLOPs but no
// math. This is what `strata plan --simulate` runs: a configuration's step time, how much
// transfer time is exposed, and the peak bytes per tier, in seconds of host time even
// for a trillion-parameter model (no byte is ever allocated or moved).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/model/weight_source.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata {

// One parameter group of a simulated model (a transformer block, the embeddings, ...).
struct SimGroup {
  std::string name;
  uint64_t numel = 0;          // parameters
  double forward_flops = 0;    // FLOPs of one micro-batch's forward; backward takes twice this
};

// A model without math: it calls its WeightSource exactly as a real model does, and its
// kernels are Stream::compute of the group's FLOPs on one compute stream, which its
// thread waits for (as the cpu backend's model does).
//   forward,  g = 0..G-1:  acquire_params, compute, release_params
//   backward, g = G-1..0:  acquire_params, gradient_buffer, compute (2x), release_params,
//                          grads_ready
class SyntheticModel {
 public:
  SyntheticModel(std::vector<SimGroup> groups, Stream& compute);
  const std::vector<SimGroup>& groups() const { return groups_; }
  std::vector<GroupSpec> group_specs() const;  // for the engine
  std::vector<int> schedule() const;           // the acquire order of one micro-step
  // One micro-batch, forward then backward. Returns the FLOPs it issued.
  double forward_backward(WeightSource& ws);

 private:
  double run_group(double flops);
  std::vector<SimGroup> groups_;
  Stream& compute_;
};

struct SimRunOptions {
  int steps = 3;                // optimizer steps
  int rank = 0, world = 1;      // this process plays rank `rank` of a symmetric group
  SimCostModel cost;
  // Stage, tiers, budgets, prefetch, sub-groups, accumulation, trace_path. NVMe paths are
  // never touched (one placeholder is set when a tier lives on NVMe and none is given).
  EngineOptions engine;
  bool give_schedule = true;    // else the engine learns the order from the first micro-step
};

// Simulated seconds, for one optimizer step.
struct SimStepStats {
  double time_s = 0;            // from the end of the previous step (or of start-up) to
                                // the end of this one (the engine's step() returning)
  double compute_s = 0;         // the model's kernels: FLOPs over the device's peak
  double exposed_wait_s = 0;    // the model's thread waiting for parameters and gradient
                                // buffers (the transfer time not hidden behind compute)
  double optimizer_s = 0;       // the optimizer, its waits for states included
  double optimizer_wait_s = 0;  // of which waiting for states to arrive
  double speculation_wait_s = 0;  // the speculative updates' waits during the backward pass (EngineStats)
  std::array<std::array<uint64_t, kTierCount>, kTierCount> bytes_moved{};  // [from][to]
};

struct SimRunResult {
  std::vector<SimStepStats> steps;
  std::array<TierUsage, kTierCount> tiers{};  // per tier (Tier index): budget, peak, use at the end
  EngineStats engine;                         // at the end of the run
  std::string device;                         // the sim device's description
};

// Runs opts.steps optimizer steps of `model` on a fresh sim device. Deterministic: the
// same arguments give bit-identical times. Throws what the engine throws at start-up
// (ConfigError, OutOfBudget) when the configuration cannot work.
SimRunResult simulate_training(const std::vector<SimGroup>& model, const SimRunOptions& opts);

}  // namespace strata
