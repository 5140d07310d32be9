#include "strata/runtime/engine/shard_layout.hpp"

#include <algorithm>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace {

const char* suffix(StateRole r) {
  switch (r) {
    case StateRole::GatherBuffer: return ".params.full";
    case StateRole::ParamShard: return ".params.shard";
    case StateRole::ParamSecondary: return ".params.secondary";
    case StateRole::QuantizedGather: return ".params.quantized";
    case StateRole::ReplicatedParams: return ".params";
    case StateRole::GradFull: return ".grad.full";
    case StateRole::GradAccumulated: return ".grad_acc";
    case StateRole::GradReduced: return ".grad.reduced";
    case StateRole::QuantizedReduce: return ".grad.quantized";
    case StateRole::Master: return ".master";
    case StateRole::ExpAvg: return ".exp_avg";
    case StateRole::ExpAvgSq: return ".exp_avg_sq";
    case StateRole::Grad: return ".grad";
    case StateRole::MasterNext: return ".master.next";
    case StateRole::ExpAvgNext: return ".exp_avg.next";
    case StateRole::ExpAvgSqNext: return ".exp_avg_sq.next";
    case StateRole::ActivationCheckpoint: return "";
  }
  return "";
}

// The store's accounting group: what `strata train` prints per tier and the planner's
// TierNeed fields.
const char* owner(StateRole r) {
  switch (r) {
    case StateRole::GatherBuffer:
    case StateRole::QuantizedGather: return "gathered";
    case StateRole::ParamShard:
    case StateRole::ParamSecondary:
    case StateRole::ReplicatedParams: return "params";
    case StateRole::Master:
    case StateRole::ExpAvg:
    case StateRole::ExpAvgSq:
    case StateRole::MasterNext:
    case StateRole::ExpAvgNext:
    case StateRole::ExpAvgSqNext: return "optimizer";
    case StateRole::GradFull:
    case StateRole::GradAccumulated:
    case StateRole::GradReduced:
    case StateRole::QuantizedReduce:
    case StateRole::Grad: return "gradients";
    case StateRole::ActivationCheckpoint: return "activations";
  }
  return "";
}

DType role_dtype(StateRole r, const ShardStrategy& st) {
  switch (r) {
    case StateRole::GatherBuffer:
    case StateRole::ParamShard:
    case StateRole::ParamSecondary:
    case StateRole::ReplicatedParams:
    case StateRole::GradFull:
    case StateRole::GradReduced: return st.working;
    case StateRole::GradAccumulated:
    case StateRole::Grad: return st.grads;
    case StateRole::Master:
    case StateRole::ExpAvg:
    case StateRole::ExpAvgSq:
    case StateRole::MasterNext:
    case StateRole::ExpAvgNext:
    case StateRole::ExpAvgSqNext:
    case StateRole::ActivationCheckpoint: return DType::F32;
    case StateRole::QuantizedGather:
    case StateRole::QuantizedReduce: return DType::U8;
  }
  return DType::F32;
}

// The tensors of one group, in the order the engine registers them.
std::vector<StateTensor> group_tensors(const GroupLayout& g, const ShardStrategy& st) {
  std::vector<StateTensor> out;
  const uint64_t qwz =
      st.quantized_block > 0 ? qwz_chunks(g.shard, st.world, st.quantized_block, st.quantized_scratch).bytes : 0;
  const uint64_t qgz =
      st.quantized_gradients_block > 0 && st.stage >= 2
          ? qgz_chunks(g.shard, st.world, st.gradient_nodes, st.quantized_gradients_block, st.quantized_scratch).bytes
          : 0;
  auto add = [&](StateRole role, uint64_t elems, Tier home, bool scratch, int sub = -1) {
    const DType t = role_dtype(role, st);
    out.push_back({role, sub, TensorSpec{g.name + suffix(role), elems * dtype_size(t), t, home, owner(role), scratch}});
  };
  const bool secondary = st.stage == 3 && st.hpz > 1 && !g.persistent;
  if (g.frozen) {  // the parameters alone: nothing is reduced or stepped
    if (st.stage == 3) {
      add(StateRole::GatherBuffer, g.padded, Tier::Device, true);
      add(StateRole::ParamShard, g.shard, st.param_home, false);
      if (secondary) add(StateRole::ParamSecondary, g.padded / st.hpz, st.param_home, false);
      if (qwz) add(StateRole::QuantizedGather, qwz, Tier::Device, true);
    } else {
      add(StateRole::ReplicatedParams, g.padded, Tier::Device, false);
    }
    return out;
  }
  if (st.stage == 3) {
    add(StateRole::GatherBuffer, g.padded, Tier::Device, true);
    add(StateRole::ParamShard, g.shard, st.param_home, false);
    if (secondary) add(StateRole::ParamSecondary, g.padded / st.hpz, st.param_home, false);
    if (qwz) add(StateRole::QuantizedGather, qwz, Tier::Device, true);
    add(StateRole::GradReduced, g.shard, Tier::Device, true);
    if (qgz) add(StateRole::QuantizedReduce, qgz, Tier::Device, true);
  } else {
    add(StateRole::ReplicatedParams, g.padded, Tier::Device, false);
    if (st.stage == 2) {
      add(StateRole::GradReduced, g.shard, Tier::Device, true);
      if (qgz) add(StateRole::QuantizedReduce, qgz, Tier::Device, true);
    } else
      add(StateRole::GradAccumulated, g.padded, Tier::Device, false);
  }
  add(StateRole::GradFull, g.padded, Tier::Device, true);
  // Where the parameter shard is the master weights, a speculative group's next master
  // weights are a whole shard too, which becomes the parameter shard at the commit.
  if (g.master_in_shard && g.sub_groups.front().speculative) add(StateRole::MasterNext, g.shard, g.optimizer_home, false);
  for (size_t i = 0; i < g.sub_groups.size(); ++i) {
    for (StateRole r : {StateRole::Master, StateRole::ExpAvg, StateRole::ExpAvgSq, StateRole::Grad})
      if (r != StateRole::Master || !g.master_in_shard)
        add(r, g.sub_groups[i].n, g.optimizer_home, false, static_cast<int>(i));
    if (g.sub_groups[i].speculative)
      for (StateRole r : {StateRole::MasterNext, StateRole::ExpAvgNext, StateRole::ExpAvgSqNext})
        if (r != StateRole::MasterNext || !g.master_in_shard)
          add(r, g.sub_groups[i].n, g.optimizer_home, false, static_cast<int>(i));
  }
  return out;
}

}  // namespace

DType grads_dtype(DType working, int gradient_accumulation_steps) {
  return gradient_accumulation_steps > 1 ? DType::F32 : working;
}

DType ShardLayout::dtype(StateRole role) const { return role_dtype(role, strategy); }

uint64_t ShardLayout::nvme_capacity() const {
  const uint64_t homes = need[int(Tier::Nvme)].homes();
  return tier_allocation_bytes(homes + homes / 8 + (64ull << 20));
}

std::vector<TensorSpec> ShardLayout::tensor_specs() const {
  std::vector<TensorSpec> specs;
  for (const GroupLayout& g : groups)
    for (const StateTensor& t : g.tensors) specs.push_back(t.spec);
  for (const StateTensor& t : checkpoints) specs.push_back(t.spec);
  return specs;
}

namespace {

// Throws ConfigError for a strategy or model the layout cannot be made for.
void check_strategy(const std::vector<GroupSize>& groups, const ShardStrategy& st) {
  if (st.stage < 1 || st.stage > 3)
    throw ConfigError("zero_optimization.stage must be 1, 2 or 3, not " + std::to_string(st.stage));
  if (st.world < 1) throw ConfigError("world size must be at least 1, not " + std::to_string(st.world));
  if (groups.empty()) throw ConfigError("the model has no parameter groups");
  const uint64_t align = st.rules.align_elems;
  if (align == 0 || align % ShardRules::kDefaultAlignElems != 0)
    throw ConfigError("shard alignment of " + std::to_string(align) + " elements: give a positive multiple of " +
                      std::to_string(ShardRules::kDefaultAlignElems) + " (4 KiB of fp32, O_DIRECT's unit)");
  for (DType t : {st.working, st.grads})
    if (!is_working_dtype(t))
      throw ConfigError(std::string("shard layout: element type ") + to_string(t) + " is not f32, bf16 or fp16");
  if (st.grads != DType::F32 && st.grads != st.working)
    throw ConfigError("shard layout: reduced gradients are fp32 or the working type");
  if (!(st.optimizer_ratio >= 0.0 && st.optimizer_ratio <= 1.0))
    throw ConfigError("zero_optimization.offload_optimizer.ratio must lie in [0, 1], not " +
                      std::to_string(st.optimizer_ratio));
  const ShardStrategy::Checkpoints& cps = st.checkpoints;
  if (cps.count < 0 || (cps.count > 0 && cps.bytes == 0))
    throw ConfigError("shard layout: " + std::to_string(cps.count) + " activation checkpoints of " +
                      std::to_string(cps.bytes) + " bytes");
  if (st.quantized_block > 0 && st.stage != 3)
    throw ConfigError("zero_optimization.zero_quantized_weights quantizes stage 3's gathers, and the stage is " +
                      std::to_string(st.stage) + ": set zero_optimization.stage 3, or drop zero_quantized_weights");
  const std::string hpz = "zero_optimization.zero_hpz_partition_size " + std::to_string(st.hpz);
  if (st.quantized_gradients_block > 0 && st.stage == 1)
    throw ConfigError("zero_optimization.zero_quantized_gradients quantizes the reduce-scatters of stages 2 and 3, "
                      "and the stage is 1: set zero_optimization.stage 2 or 3, or drop zero_quantized_gradients");
  if (st.quantized_gradients_block > 0 && (st.gradient_nodes < 1 || st.world % st.gradient_nodes != 0))
    throw ConfigError("zero_optimization.zero_quantized_gradients: " + std::to_string(st.gradient_nodes) +
                      " nodes do not divide the world of " + std::to_string(st.world) +
                      " ranks: set strata.ranks_per_node to a divisor of the world");
  if (st.hpz < 1) throw ConfigError(hpz + " is below 1: give 1 (off) or the ranks of a node");
  if (st.hpz > 1 && st.stage != 3)
    throw ConfigError(hpz + " partitions stage 3's parameters, and the stage is " + std::to_string(st.stage) +
                      ": set zero_optimization.stage 3, or drop zero_hpz_partition_size");
  if (st.hpz > 1 && st.world % st.hpz != 0)
    throw ConfigError(hpz + " does not divide the " + std::to_string(st.world) +
                      " ranks: give a divisor of the world size (the ranks of a node)");
  if (st.optimizer_ratio < 1.0 && st.optimizer_home == Tier::Device)
    throw ConfigError("zero_optimization.offload_optimizer.ratio below 1 splits the optimizer between the GPU and "
                      "offload_optimizer.device, which is 'none': set the device to 'cpu' or 'nvme', or drop ratio");
}

// Each group padded and cut into shards; the ratio's split of the optimizer's homes; the
// sub-groups.
void size_groups(ShardLayout& L, const std::vector<GroupSize>& groups, ShardStrategy& st) {
  const uint64_t align = st.rules.align_elems;
  const uint64_t unit = uint64_t(st.world) * align;
  L.groups.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    GroupLayout& g = L.groups[i];
    g.name = groups[i].name;
    g.numel = groups[i].numel;
    g.frozen = groups[i].frozen;
    if (g.numel == 0) throw ConfigError("parameter group '" + g.name + "' has no elements");
    g.padded = (g.numel + unit - 1) / unit * unit;
    g.shard = g.padded / st.world;
    g.persistent = st.stage == 3 && g.numel <= st.rules.persistence_threshold_elems;
    L.max_padded = std::max(L.max_padded, g.padded);
    L.max_shard = std::max(L.max_shard, g.shard);
    L.max_numel = std::max(L.max_numel, g.numel);
    L.shard_total += g.shard;
    L.padded_total += g.padded;
    if (!g.frozen) L.trained_shard_total += g.shard;
  }
  // The ratio's split, in shard elements from the first group: a group whose start lies at
  // or past ratio x the total steps on the device. Frozen groups have no states to split.
  uint64_t before = 0;
  for (GroupLayout& g : L.groups) {
    const bool on_device = st.optimizer_ratio < 1.0 && static_cast<double>(before) >=
                                                           st.optimizer_ratio * static_cast<double>(L.trained_shard_total);
    g.optimizer_home = on_device ? Tier::Device : st.optimizer_home;
    if (!g.frozen) before += g.shard;
  }
  uint64_t sub = st.rules.sub_group_elems;
  if (sub == 0) sub = std::clamp<uint64_t>(L.max_shard / 4, uint64_t{1} << 20, uint64_t{100'000'000});
  L.sub_group = std::max(align, sub / align * align);
  st.rules.sub_group_elems = L.sub_group;
  for (GroupLayout& g : L.groups) {
    if (g.frozen) continue;  // no optimizer states: no sub-groups
    for (uint64_t off = 0; off < g.shard; off += L.sub_group) {
      const uint64_t n = std::min(L.sub_group, g.shard - off);
      g.sub_groups.push_back({off, n});
      L.max_sub_group = std::max(L.max_sub_group, n);
      ++L.sub_group_count;
    }
  }
  st.speculative_sub_groups = std::min(st.speculative_sub_groups, L.sub_group_count);
  uint64_t index = 0;  // of the sub-group in the model, first to last
  for (GroupLayout& g : L.groups)
    for (SubGroup& sg : g.sub_groups) sg.speculative = index++ >= L.sub_group_count - st.speculative_sub_groups;
}

// Each group's tensors, and the homes' bytes per tier and purpose.
void place_tensors(ShardLayout& L, const ShardStrategy& st) {
  for (GroupLayout& g : L.groups) {
    // The shard is the master weights (GroupLayout::master_in_shard): fp32 stage 3, one home
    // for both, stepped by CPU Adam (the GPU optimizer's groups keep their own masters), and
    // every sub-group speculative or none (its next master weights are one shard).
    bool mixed = false;
    for (const SubGroup& sg : g.sub_groups) mixed = mixed || sg.speculative != g.sub_groups.front().speculative;
    const bool gpu_stepped = g.optimizer_home == Tier::Device && (st.device_states_staged || st.optimizer_ratio < 1.0);
    g.master_in_shard = !g.frozen && st.stage == 3 && st.working == DType::F32 && g.optimizer_home == st.param_home &&
                        !gpu_stepped && !mixed;
    g.tensors = group_tensors(g, st);
    // A gradient held from the head's backward to the end of backward lives on the device
    // for good (its bytes are there through every block's backward anyway): beside the
    // homes, not between the buffers that come and go.
    if (st.first_gradient_held && &g == &L.groups.front() && L.groups.size() >= 2)
      for (StateTensor& t : g.tensors)
        if (t.role == StateRole::GradFull) t.spec.scratch = false;
    for (const StateTensor& t : g.tensors) {
      if (t.spec.scratch) continue;
      TierNeed& need = L.need[int(t.spec.home)];
      const uint64_t b = tier_allocation_bytes(t.spec.bytes);
      switch (t.role) {
        case StateRole::ParamShard:
        case StateRole::ParamSecondary:
        case StateRole::ReplicatedParams: need.params += b; break;
        case StateRole::GradFull:
        case StateRole::GradAccumulated:
        case StateRole::Grad: need.grads += b; break;
        default: need.optimizer += b; break;
      }
    }
    if (g.persistent) L.need[int(Tier::Device)].persistent += g.padded * L.elem_bytes(StateRole::GatherBuffer);
  }
  const ShardStrategy::Checkpoints& cps = st.checkpoints;
  for (int i = 0; i < cps.count; ++i) {
    L.checkpoints.push_back({StateRole::ActivationCheckpoint, -1,
                             TensorSpec{"checkpoint." + std::to_string(i), cps.bytes, DType::F32, cps.home,
                                        owner(StateRole::ActivationCheckpoint), false}});
    L.need[int(cps.home)].activations += tier_allocation_bytes(cps.bytes);
  }
}

// The device's working set and the pinned staging on top of the homes.
void size_working_sets(ShardLayout& L, const ShardStrategy& st) {
  const ShardStrategy::Checkpoints& cps = st.checkpoints;
  const uint64_t live_checkpoints =
      cps.home == Tier::Device ? 0 : std::min<uint64_t>(cps.count, kLiveCheckpoints) * tier_allocation_bytes(cps.bytes);

  // In working elements: the gathered parameters and the model's gradient (a group's
  // padded size each, the largest group's), the
  // reduce-scatter output and, stage 3, the parameter shard passing through (ms each);
  // the reduced gradient's sub-groups passing through (mg).
  // A group in use holds its gathered parameters (stage 3) and its gradient: `copies`
  // padded buffers. With the first group's gradient held (a tied head; a device home,
  // above), the first group in use needs only its gathered parameters, and the head holds
  // them beside the last group's two buffers.
  const uint64_t wb = L.elem_bytes(StateRole::GatherBuffer);
  const uint64_t ms = L.max_shard * L.elem_bytes(StateRole::GradReduced);
  const uint64_t mg = L.max_shard * L.elem_bytes(StateRole::Grad);
  const uint64_t copies = st.stage == 3 ? 2 : 1;
  // A frozen group in use holds its gathered parameters alone (stage 3), none in 1 and 2.
  uint64_t groups_in_use = 0;
  for (const GroupLayout& g : L.groups)
    groups_in_use = std::max(groups_in_use, (g.frozen ? copies - 1 : copies) * g.padded * wb);
  if (st.first_gradient_held && L.groups.size() >= 2) {
    const uint64_t first = st.stage == 3 ? L.groups.front().padded * wb : 0, last = L.groups.back().padded * wb;
    uint64_t rest = 0;
    for (size_t g = 1; g < L.groups.size(); ++g) rest = std::max(rest, L.groups[g].padded * wb);
    groups_in_use = std::max(copies * rest, first + copies * last);
  }
  // Stage 3: a gather's source passes through the device, the parameter shard or (hpZ)
  // the larger secondary partition, which the first gather also writes.
  const uint64_t source = st.stage == 3 && st.hpz > 1 ? std::max(ms, L.max_padded / st.hpz * wb) : ms;
  // qwZ: the group gathered on demand also holds its quantized buffer.
  const uint64_t quantized =
      st.stage == 3 && st.quantized_block > 0
          ? qwz_chunks(L.max_shard, st.world, st.quantized_block, st.quantized_scratch).bytes
          : 0;
  // qgZ: the group being reduce-scattered holds its scratch beside its output.
  const uint64_t qgz = st.stage >= 2 && st.quantized_gradients_block > 0
                           ? qgz_chunks(L.max_shard, st.world, st.gradient_nodes, st.quantized_gradients_block,
                                        st.quantized_scratch)
                                 .bytes
                           : 0;
  L.device_working = groups_in_use + (st.stage == 3 ? ms + source : ms) + mg + live_checkpoints + quantized + qgz;
  // Two sub-groups' states (master and moments fp32, the gradient) and a parameter shard.
  const uint64_t per_elem = 3 * L.elem_bytes(StateRole::Master) + L.elem_bytes(StateRole::Grad);
  const uint64_t next_set = st.speculative_sub_groups > 0 ? 3 * L.elem_bytes(StateRole::MasterNext) : 0;
  // A speculative group whose shard is its master weights holds its next shard beside it.
  bool next_shard = false;
  for (const GroupLayout& g : L.groups)
    next_shard = next_shard || (g.master_in_shard && !g.sub_groups.empty() && g.sub_groups.front().speculative);
  L.pinned_staging = st.optimizer_home != Tier::Device ? L.max_sub_group * (2 * per_elem + next_set) + ms +
                                                             (next_shard ? ms : 0)
                     : st.device_states_staged     ? 3 * L.elem_bytes(StateRole::Master) * L.max_sub_group + ms
                                                   : ms;
  if (cps.home == Tier::Nvme) L.pinned_staging += live_checkpoints;
}

}  // namespace

ShardLayout make_shard_layout(const std::vector<GroupSize>& groups, ShardStrategy st) {
  check_strategy(groups, st);
  if (st.stage < 3) st.param_home = Tier::Device;  // stages 1 and 2 replicate parameters
  ShardLayout L;
  size_groups(L, groups, st);
  L.strategy = st;
  place_tensors(L, st);
  size_working_sets(L, st);
  return L;
}

}  // namespace strata
