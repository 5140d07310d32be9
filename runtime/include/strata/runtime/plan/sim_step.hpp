// Simulated training steps: the real ZeroEngine, TieredStore and prefetcher on the sim
// backend (core/sim.hpp), driven by a synthetic model that has sizes and FLOPs but no
// math: a configuration's step time, how much transfer time is exposed, and the peak
// bytes per tier, in seconds of host time even for a trillion-parameter model (no byte is
// ever allocated or moved). `strata plan --simulate` runs the same path with the GPT's
// own order (plan.hpp's simulate_plan).
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

struct SimRunOptions {
  int steps = 3;                // optimizer steps
  int rank = 0, world = 1;      // this process plays rank `rank` of a symmetric group
  SimCostModel cost;
  // Stage, tiers, budgets, prefetch, sub-groups, accumulation, trace_path. NVMe paths are
  // never touched (one placeholder is set when a home is on NVMe, activation checkpoints
  // included, and none is given).
  EngineOptions engine;
  EngineAblation ablation;      // all on; tests turn one off to measure what it gives
  bool give_schedule = true;    // else the engine learns the order from the first micro-step
  // Layouts that keep collectives inside a node (docs/multinode.md), each sub-group a sim
  // communicator of its own at its own bandwidth (0: cost.collective_bandwidth):
  // shard_ranks, the ranks the states are sharded over (0: world; fewer: MiCS groups,
  // whose replicas all-reduce across world / shard_ranks ranks at replica_bandwidth);
  // engine.hpz_partition_size > 1, hpZ's groups at secondary_bandwidth.
  int shard_ranks = 0;
  double replica_bandwidth = 0, secondary_bandwidth = 0;
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

// Runs opts.steps optimizer steps of `model` on a fresh sim device: each micro-batch
// acquires, computes with and releases groups 0..G-1 forward (FLOPs forward_flops), then
// G-1..0 backward with its gradient buffer (twice the FLOPs), gradients handed back after
// each group. Deterministic: the
// same arguments give bit-identical times. Throws what the engine throws at start-up
// (ConfigError, OutOfBudget) when the configuration cannot work.
SimRunResult simulate_training(const std::vector<SimGroup>& model, const SimRunOptions& opts);

}  // namespace strata
