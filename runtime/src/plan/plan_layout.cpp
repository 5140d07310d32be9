// The planner's view of the engine's layout (plan_detail.hpp): the options and groups
// strata train would give the engine for a strategy, their resolution, and each group's
// kernel time.
#include <algorithm>
#include <cmath>

#include "strata/core/error.hpp"
#include "strata/model/attention_plan.hpp"
#include "strata/runtime/plan/plan_detail.hpp"
#include "strata/runtime/train/train.hpp"

namespace strata::plan {

std::vector<std::vector<uint64_t>> plan_parts(const GptShape& shape, const Strategy& st) {
  return gpt_parts(shape, st.part_elems > 0 ? st.part_elems : UINT64_MAX, st.tile_factor, st.tile_size);
}

namespace {

// The engine's options for a plan, as strata train would set them for this strategy on
// this cluster: the device budget is the HBM less what the runtime cannot use and less
// the activations the model holds itself (the checkpoints are the engine's); the pinned
// budget is the node's pinned memory per rank. NVMe, where the strategy offloads there,
// is named "(simulated nvme)" and sized from the layout: the planner and the simulator
// count its bytes and never open a file.
EngineOptions plan_engine_options(const Plan& p, const Strategy& st, const std::vector<GroupSize>& sizes) {
  const GptShape& s = p.shape;
  const ClusterSpec& cl = p.cluster;
  EngineOptions e;
  e.stage = st.stage;
  e.param_home = home_tier(st.offload_param);
  e.optimizer_home = home_tier(st.offload_optimizer);
  // The cluster's GPUs step states kept on them (the GPU optimizer); the simulator's
  // device is host-addressable, so the choice is made here rather than from the device.
  e.optimizer_on_stream = !cl.cpu_backend && (e.optimizer_home == Tier::Device || st.optimizer_ratio < 1.0);
  e.optimizer_ratio = st.optimizer_ratio;
  e.gradient_accumulation_steps = st.grad_accum;
  uint64_t max_numel = 0;
  for (const GroupSize& g : sizes) max_numel = std::max(max_numel, g.numel);
  e.prefetch_bucket_elems = std::max<uint64_t>(1, uint64_t(st.prefetch_groups) * max_numel);
  e.max_live_elems = uint64_t{1} << 62;
  e.persistence_threshold_elems = 0;
  e.max_reuse_distance_elems = 0;
  e.sub_group_elems = st.sub_group_elems;
  e.shard_align_elems = st.shard_align_elems;
  e.precision = st.precision;
  e.prefetch = st.prefetch_groups > 0;
  e.speculative = st.speculative;
  if (st.checkpointing) {
    e.checkpoints = {checkpoint_count(s), static_cast<uint64_t>(checkpoint_bytes(s, st.micro_batch)),
                     home_tier(st.checkpoints)};
    e.cpu_checkpointing = e.checkpoints.home != Tier::Device;
  }
  e.first_gradient_held = s.tied();
  e.hpz_partition_size = st.hpz;
  e.quantized_weights_block = st.qwz ? st.quantized_block : 0;
  e.quantized_gradients_block = st.qgz ? st.quantized_block : 0;
  e.ranks_per_node = cl.gpus_per_node;
  e.gradient_nodes = cl.nodes;  // what the engine resolves from the node layout
  const double dev_budget = cl.hbm - cl.device_reserve - p.model_activations;
  e.store.device_budget = dev_budget > 0 ? static_cast<uint64_t>(dev_budget) : 0;
  e.store.pinned_budget = static_cast<uint64_t>(cl.pinned_per_rank());
  if (e.optimizer_home == Tier::Nvme || (e.stage == 3 && e.param_home == Tier::Nvme) ||
      e.checkpoints.home == Tier::Nvme)
    e.store.nvme.paths = {"(simulated nvme)"};
  return e;
}

// The activations the model holds itself on a device (not the engine's checkpoints).
double model_activation_bytes(const GptShape& s, const ClusterSpec& cl, const Strategy& st) {
  double a = activation_bytes(s, st.micro_batch, st.checkpointing, st.precision);
  // On a GPU the cuda model's attention also holds its scratch of [T, T] scores
  // (strata/model/attention_plan.hpp; up to 256 MiB, whatever the batch).
  if (!cl.cpu_backend) a += double(attention_gemm_scratch_bytes(s.seq_len, s.heads, st.precision));
  return a;
}

}  // namespace

PlanGroups plan_groups(const GptShape& shape, const Strategy& st) {
  const std::vector<std::vector<uint64_t>> parts = plan_parts(shape, st);
  std::vector<int> model_of;
  for (size_t g = 0; g < parts.size(); ++g)
    for (size_t k = 0; k < parts[g].size(); ++k) model_of.push_back(static_cast<int>(g));
  PlanGroups out;
  const std::vector<GroupSpec> specs = gpt_group_specs(shape, parts);
  STRATA_CHECK(specs.size() == model_of.size(), "the planner's parts and groups disagree");
  for (size_t k = 0; k < specs.size(); ++k) {
    const uint64_t n = specs[k].numel;
    const auto frozen = static_cast<uint64_t>(std::llround(st.frozen_fraction * static_cast<double>(n)));
    if (frozen > 0) {
      out.sizes.push_back({specs[k].name + " (frozen)", frozen, true});
      out.model_of.push_back(model_of[k]);
    }
    if (frozen < n) {
      out.sizes.push_back({specs[k].name, n - frozen, false});
      out.model_of.push_back(model_of[k]);
    }
  }
  return out;
}

int shard_ranks(int world, const Strategy& st) { return st.mics_shard_size > 0 ? st.mics_shard_size : world; }

ResolvedLayout resolve_plan(Plan& p, const Strategy& st) {
  const std::vector<GroupSize> sizes = plan_groups(p.shape, st).sizes;
  p.model_activations = model_activation_bytes(p.shape, p.cluster, st);
  p.engine = plan_engine_options(p, st, sizes);
  p.resolved = try_resolve(p.engine, p.ablation, sizes, shard_ranks(p.world, st), DeviceTraits{});
  p.engine = p.resolved.options;  // as the engine runs them (the simulator starts from these)
  // The strategy as planned says where the checkpoints went (plan --search's rows name it).
  if (p.resolved.checkpoints_moved_to_nvme) p.strategy.checkpoints = OffloadDevice::Nvme;
  return p.resolved;
}

std::vector<GroupTimes> group_times(const GptShape& s, const ClusterSpec& c, const Strategy& st) {
  // Matmul FLOPs at the matmul rate, element-wise passes at device memory bandwidth:
  // about 80 d bytes per token per block forward (layer norms, GELU, residuals, bias
  // adds, read and written in fp32), twice that backward.
  const double T = double(st.micro_batch) * s.seq_len;
  const double flops = c.gpu_flops * c.matmul_efficiency;
  const double ew = 80.0 * s.d_model * T / c.hbm_bandwidth;
  const double lookup = 2.0 * 4 * s.d_model * T / c.hbm_bandwidth;  // embedding rows in, sum out
  const std::vector<GptGroup> groups = gpt_groups(s);
  std::vector<GroupTimes> out(groups.size());
  const int n = static_cast<int>(groups.size());
  for (int g = 0; g < n; ++g) {
    const double mm = groups[g].forward_flops_per_token * T / flops;
    GroupTimes& t = out[g];
    if (g == 0) {
      // Embeddings: the lookup forward, its scatter backward; a tied head's matmul runs
      // when group 0 is acquired the second time (forward 1x, backward 2x; 0 untied).
      t.forward_s = lookup;
      t.head_s = 3 * mm;
      t.backward_s = lookup;
    } else if (g == n - 1) {
      t.forward_s = ew / 8;   // final layer norm: about 10 d bytes per token
      t.backward_s = ew / 4;
      t.head_s = 3 * mm;      // an untied head (Llama's lm_head) is in this group; 0 when tied
    } else {
      t.forward_s = mm + ew;
      t.backward_s = 2 * (mm + ew) + (st.checkpointing ? mm + ew : 0.0);
    }
  }
  return out;
}

}  // namespace strata::plan
