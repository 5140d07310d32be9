// The planner's internals shared by the analytic plan and the simulation driver
// (runtime/src/plan.cpp, plan_simulate.cpp): the engine's layout of a GPT and each
// group's kernel time, so that both count the same groups, shards and seconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/runtime/plan.hpp"

namespace strata::plan {

struct LayoutGroup {
  std::string name;
  uint64_t numel = 0, padded = 0, shard = 0;  // elements, as the engine pads and shards
  double forward_flops_per_token = 0;
  std::vector<uint64_t> chunks;               // optimizer sub-groups of the shard, elements
};

struct Layout {
  std::vector<LayoutGroup> groups;            // gpt_groups order: embeddings, blocks, final
  uint64_t max_padded = 0, max_shard = 0, max_numel = 0, max_chunk = 0;
  uint64_t shard_total = 0, padded_total = 0; // elements
  uint64_t sub_group = 0;                     // elements per optimizer sub-group
  uint64_t chunk_count = 0;
};
Layout layout(const GptShape& shape, const Strategy& st, int world);

// Kernel seconds of one micro-step, per group.
struct GroupTimes {
  double forward_s = 0;   // group 0: the embedding lookup
  double backward_s = 0;  // blocks: with the recompute when checkpointing
  double head_s = 0;      // group 0 only: the tied head's forward and backward
};
std::vector<GroupTimes> group_times(const GptShape& shape, const Layout& L, const ClusterSpec& c, const Strategy& st);

}  // namespace strata::plan
