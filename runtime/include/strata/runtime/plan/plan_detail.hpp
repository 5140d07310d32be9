// The planner's internals shared by the analytic plan and the simulation driver
// (runtime/src/plan/plan.cpp, plan_layout.cpp, plan_simulate.cpp): the engine's layout of a GPT and each
// group's kernel time, so that both count the same groups, shards and seconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/runtime/plan/plan.hpp"
#include "strata/runtime/engine/resolve.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

namespace strata::plan {

// What the engine would run for the plan's strategy on its cluster (resolve.hpp, the
// function the engine calls, over the GPT's groups as strata train cuts them): sets
// p.engine and p.model_activations, and returns (and keeps in p.resolved) the resolution.
ResolvedLayout resolve_plan(Plan& p, const Strategy& st);
// The ranks the states are sharded over: a MiCS group's, or the world.
int shard_ranks(int world, const Strategy& st);
// The parts the engine would gather (gpt_parts with the strategy's bucket and tile factor);
// the resolved layout's groups are these parts, in order.
std::vector<std::vector<uint64_t>> plan_parts(const GptShape& shape, const Strategy& st);
// The engine's groups as strata train cuts them, each with the model group (index into
// plan_parts) it belongs to. With Strategy::frozen_fraction, each is split into a frozen
// group of that share of its elements (rounded) and a trained group of the rest; a part
// of no elements is left out.
struct PlanGroups {
  std::vector<GroupSize> sizes;
  std::vector<int> model_of;
};
PlanGroups plan_groups(const GptShape& shape, const Strategy& st);

// Kernel seconds of one micro-step, per group.
struct GroupTimes {
  double forward_s = 0;   // group 0: the embedding lookup
  double backward_s = 0;  // blocks: with the recompute when checkpointing
  double head_s = 0;      // the head's forward and backward: group 0 (tied) or the final group (untied)
};
std::vector<GroupTimes> group_times(const GptShape& shape, const ClusterSpec& c, const Strategy& st);

}  // namespace strata::plan
