#include "strata/runtime/engine/engine_options.hpp"

#include <algorithm>

namespace strata {

EngineOptions EngineOptions::from_config(const Config& c) {
  EngineOptions o;
  o.precision = c.precision();
  o.fp16 = c.fp16;
  o.stage = c.zero.stage;
  o.param_home = home_tier(c.zero.offload_param.device);
  o.optimizer_home = home_tier(c.zero.offload_optimizer.device);
  o.optimizer = c.optimizer;
  o.gradient_clipping = c.gradient_clipping;
  o.gradient_accumulation_steps = c.gradient_accumulation_steps;
  o.prefetch_bucket_elems = c.zero.stage3_prefetch_bucket_size;
  o.max_live_elems = c.zero.stage3_max_live_parameters;
  o.persistence_threshold_elems = c.zero.stage3_param_persistence_threshold;
  o.max_reuse_distance_elems = c.zero.stage3_max_reuse_distance;
  o.sub_group_elems = c.zero.sub_group_size;
  o.hpz_partition_size = static_cast<int>(c.zero.zero_hpz_partition_size);
  o.quantized_weights_block = c.zero.zero_quantized_weights ? c.strata.quantized_weights_block : 0;
  o.quantized_gradients_block = c.zero.zero_quantized_gradients ? c.strata.quantized_gradients_block : 0;
  o.ranks_per_node = c.strata.ranks_per_node;
  o.seed = c.strata.seed;
  o.store.device_budget = c.strata.device_budget;
  o.store.pinned_budget = c.strata.pinned_budget;
  std::vector<std::string> paths = c.zero.offload_optimizer.nvme_path;
  for (const auto& p : c.zero.offload_param.nvme_path)
    if (std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
  if (o.param_home == Tier::Nvme || o.optimizer_home == Tier::Nvme) {
    o.store.nvme.paths = paths;
    o.store.nvme.capacity = c.strata.nvme_budget;  // 0: sized by the engine from the plan
  }
  o.store.nvme.aio = c.aio;
  o.store.nvme.checksums = c.strata.checksums;
  o.out_of_range = c.strata.out_of_range;
  o.trace_path = c.strata.trace;
  o.speculative = c.strata.speculative_optimizer;
  o.optimizer_ratio = c.zero.offload_optimizer.ratio;
  o.cpu_checkpointing = c.activation_checkpointing.cpu_checkpointing;
  o.first_gradient_held = c.strata.model.tied();
  return o;
}

ShardStrategy EngineOptions::shard_strategy(int world) const {
  ShardStrategy s;
  s.world = world;
  s.stage = stage;
  s.param_home = param_home;
  s.optimizer_home = optimizer_home;
  s.rules.align_elems = shard_align_elems;
  s.rules.sub_group_elems = sub_group_elems;
  s.rules.persistence_threshold_elems = persistence_threshold_elems;
  s.working = precision;
  s.grads = grads_dtype(precision, gradient_accumulation_steps);
  s.device_states_staged = optimizer_home == Tier::Device && optimizer_on_stream;
  s.optimizer_ratio = optimizer_ratio;
  s.checkpoints = checkpoints;
  s.first_gradient_held = first_gradient_held;
  s.hpz = hpz_partition_size;
  s.quantized_block = static_cast<uint64_t>(quantized_weights_block);
  s.quantized_gradients_block = static_cast<uint64_t>(quantized_gradients_block);
  s.gradient_nodes = gradient_nodes;
  s.quantized_scratch = quantized_scratch_bytes;
  return s;
}

}  // namespace strata
