// Every decision the ZeRO engine makes before it allocates anything, made once, in one
// pure function: resolve(options, groups, world, device) -> ResolvedLayout.
//
// The engine builds itself from the result; the planner (plan.hpp), the simulator and
// `strata bench step` call the same function, so none of them guesses what the engine
// will do: which tier holds each state, which optimizer sub-groups speculate (and have a
// second set of states), where the activation checkpoints live, whether accumulating
// gradients stay on the device between micro-steps, which groups the GPU optimizer steps,
// and how much device memory is left for prefetching. Each decision that depends on the
// budgets carries its reason (ResolvedLayout::decisions), and describe() prints them in
// one form for every caller.
//
// A configuration that cannot run fails here, with the numbers: ConfigError for options
// that contradict each other, OutOfBudget for budgets too small (resolve throws both;
// try_resolve reports the second in `unfit` and keeps the layout as asked, so that the
// planner can still count what it would need).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/runtime/engine/engine_options.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

namespace strata {

// What resolve needs to know of the device the engine runs on.
struct DeviceTraits {
  // Host code can read and write device memory (cpu, sim); false on cuda, where the
  // optimizer over device-resident states runs on a stream (the GPU optimizer).
  bool host_addressable = true;
  std::string backend = "cpu";  // named in errors
};

struct ResolvedLayout {
  // The options as the engine runs them: parameters on the device below stage 3, the
  // checkpoints' home, optimizer_on_stream where the device needs it, and the NVMe
  // capacity sized from the layout when none was given.
  EngineOptions options;
  EngineAblation ablation;
  int world = 1;
  // The final layout: every group's tensors, with the speculative sub-groups' Next sets
  // and the checkpoints in their home.
  ShardLayout layout;

  // The optimizer. gpu_optimizer: some groups' states are in device memory the host
  // cannot address (or optimizer_on_stream), stepped on the optimizer stream.
  bool gpu_optimizer = false;
  Tier optimizer_compute_tier = Tier::Pinned;  // where CPU Adam reads the states
  Tier optimizer_host_tier = Tier::Pinned;     // where host code reads and writes them (init, checkpoints)
  // Speculative stage-3 CPU updates run on the optimizer lane (EngineAblation::speculation_lane).
  bool lane = false;
  // Speculation asked for, sub-groups left without a Next set because the budgets have
  // no room for one (they step after the backward pass).
  uint64_t speculation_fallback_sub_groups = 0;
  // The checkpoints were asked for in pinned memory and go to NVMe: the pinned budget has
  // no room for them beside the states.
  bool checkpoints_moved_to_nvme = false;
  // Accumulating gradient shards stay on the device between micro-steps (their bytes
  // come out of the prefetch room).
  bool keep_grads_on_device = false;
  uint64_t kept_grad_bytes = 0;
  // Device bytes the gathered parameters may use beyond the homes and the working set.
  uint64_t prefetch_room = 0;
  // Stage 3, one rank, the parameter shards at home on the device, no qwZ: the model reads
  // each shard in place, with nothing gathered (EngineAblation::params_in_place).
  bool params_in_place = false;
  // Stages 2 and 3, one rank, no qgZ: each micro-step's gradient is accumulated straight
  // from the model's buffer, with no reduce-scatter (EngineAblation::grads_in_place).
  bool grads_in_place = false;

  // Empty when the configuration fits; else why not, with the numbers (try_resolve).
  std::string unfit;

  // The same text from every caller (bench step and plan print it; a test compares them).
  std::string describe() const;
};

ResolvedLayout resolve(const EngineOptions& options, const EngineAblation& ablation,
                       const std::vector<GroupSize>& groups, int world, const DeviceTraits& device);
// As resolve, but budgets too small are reported in `unfit` rather than thrown; the
// layout is then the one asked for (every sub-group speculative where speculation is on).
ResolvedLayout try_resolve(const EngineOptions& options, const EngineAblation& ablation,
                           const std::vector<GroupSize>& groups, int world, const DeviceTraits& device);

}  // namespace strata
