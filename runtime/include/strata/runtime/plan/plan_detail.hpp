// The planner's internals shared by the analytic plan and the simulation driver
// (runtime/src/plan/plan.cpp, plan_simulate.cpp): the engine's layout of a GPT and each
// group's kernel time, so that both count the same groups, shards and seconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/runtime/plan/plan.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

namespace strata::plan {

// The engine's layout of a GPT under a strategy (shard_layout.hpp): the same function the
// engine calls, over the GPT's groups.
// gpu: the cluster's GPUs step states kept on them (the GPU optimizer, offload_optimizer none).
ShardLayout gpt_shard_layout(const GptShape& shape, const Strategy& st, int world, bool gpu = false);
// The parts the engine would gather (gpt_parts with the strategy's bucket and tile factor);
// gpt_shard_layout's groups are these parts, in order.
std::vector<std::vector<uint64_t>> plan_parts(const GptShape& shape, const Strategy& st);

// Kernel seconds of one micro-step, per group.
struct GroupTimes {
  double forward_s = 0;   // group 0: the embedding lookup
  double backward_s = 0;  // blocks: with the recompute when checkpointing
  double head_s = 0;      // the head's forward and backward: group 0 (tied) or the final group (untied)
};
std::vector<GroupTimes> group_times(const GptShape& shape, const ClusterSpec& c, const Strategy& st);

}  // namespace strata::plan
