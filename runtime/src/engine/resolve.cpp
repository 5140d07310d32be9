#include "strata/runtime/engine/resolve.hpp"

#include <algorithm>
#include <sstream>

#include "strata/core/error.hpp"

namespace strata {

namespace {

const GroupSize& largest_group(const std::vector<GroupSize>& groups) {
  return *std::max_element(groups.begin(), groups.end(),
                           [](const GroupSize& a, const GroupSize& b) { return a.numel < b.numel; });
}

// The options as the engine runs them, and the choices that follow from the options and
// the device alone (no budget involved).
void settle_options(ResolvedLayout& R, const DeviceTraits& device) {
  EngineOptions& o = R.options;
  if (o.gradient_accumulation_steps < 1) throw ConfigError("gradient_accumulation_steps must be at least 1");
  if (o.stage < 3) o.param_home = Tier::Device;  // stages 1 and 2 replicate parameters
  R.optimizer_compute_tier = o.optimizer_home == Tier::Device ? Tier::Device : Tier::Pinned;
  // States in device memory the host cannot address: the GPU optimizer steps them there,
  // and host code (initialisation, checkpoints, restores) goes through pinned copies.
  const bool split = o.optimizer_ratio < 1.0;
  if (split && device.host_addressable && !o.optimizer_on_stream)
    throw ConfigError(
        "zero_optimization.offload_optimizer.ratio below 1 steps part of the optimizer on the GPU, and the " +
        device.backend +
        " backend has none: drop ratio (1, the default, steps all of it with CPU Adam) or use strata.backend cuda");
  if ((R.optimizer_compute_tier == Tier::Device || split) && !device.host_addressable) o.optimizer_on_stream = true;
  R.gpu_optimizer = (R.optimizer_compute_tier == Tier::Device || split) && o.optimizer_on_stream;
  R.optimizer_host_tier = R.gpu_optimizer ? Tier::Pinned : R.optimizer_compute_tier;
  R.lane = o.speculative && R.ablation.speculation_lane && o.stage == 3;
  if (o.cpu_checkpointing) {
    if (o.checkpoints.count == 0)
      throw ConfigError(
          "activation_checkpointing.cpu_checkpointing moves the model's activation checkpoints off the device, and "
          "this engine holds none: strata train holds them when activation_checkpointing.enabled is true; a trainer "
          "embedding Strata through its C API keeps its own activations (drop cpu_checkpointing there)");
    if (o.checkpoints.home == Tier::Device) o.checkpoints.home = Tier::Pinned;
  }
}

std::string device_budget_message(const ResolvedLayout& R, const std::vector<GroupSize>& groups) {
  const EngineOptions& o = R.options;
  const ShardLayout& L = R.layout;
  const uint64_t home = L.need[int(Tier::Device)].homes(), working = L.device_working;
  std::ostringstream os;
  os << "the device budget of " << format_bytes(o.store.device_budget) << " is too small: the model needs "
     << format_bytes(home) << " resident on the device";
  if (o.stage < 3) os << " (stages 1 and 2 keep all parameters there)";
  if (L.strategy.first_gradient_held && groups.size() >= 2)
    os << " (with the gradient of '" << groups[0].name
       << "', held there from the tied head's backward to the end of backward)";
  os << " plus " << format_bytes(working) << " for the groups in use (the largest, '" << largest_group(groups).name
     << "', " << L.max_padded << " elements padded)";
  if (const uint64_t a = L.need[int(Tier::Device)].activations; a > 0)
    os << "; the resident bytes include " << o.checkpoints.count << " activation checkpoints (" << format_bytes(a)
       << ", activation_checkpointing.cpu_checkpointing moves them off the device)";
  os << ". Raise strata.device_budget to at least " << format_bytes(home + working)
     << (o.stage < 3 ? ", or use zero_optimization.stage 3 with offload_param" : ", or offload more") << ".";
  return os.str();
}

std::string pinned_budget_message(const ResolvedLayout& R) {
  const EngineOptions& o = R.options;
  const ShardLayout& L = R.layout;
  const uint64_t staging = L.pinned_staging, home = L.need[int(Tier::Pinned)].homes();
  const uint64_t budget = o.store.pinned_budget;
  if (const uint64_t a = L.need[int(Tier::Pinned)].activations; a > 0)
    return "the pinned budget of " + format_bytes(budget) + " is too small: " + format_bytes(home - a) +
           " of states and " + format_bytes(a) + " of activation checkpoints (" + std::to_string(o.checkpoints.count) +
           ", activation_checkpointing.cpu_checkpointing) live there, and the optimizer needs " +
           format_bytes(staging) + " of staging. Raise strata.pinned_budget to at least " +
           format_bytes(home + staging) +
           ", or give an NVMe path (offload_param or offload_optimizer on nvme) for the checkpoints to go to, or "
           "drop cpu_checkpointing.";
  return "the pinned budget of " + format_bytes(budget) + " is too small: " + format_bytes(home) +
         " of states live there and the optimizer needs " + format_bytes(staging) +
         " of staging for its sub-groups (sub_group_size " + std::to_string(L.max_sub_group) +
         " elements). Raise strata.pinned_budget to at least " + format_bytes(home + staging) +
         " or lower sub_group_size.";
}

bool device_fits(const ShardLayout& L, const TieredStoreOptions& store) {
  return L.need[int(Tier::Device)].homes() + L.device_working <= store.device_budget;
}
bool pinned_fits(const ShardLayout& L, const TieredStoreOptions& store) {
  return L.need[int(Tier::Pinned)].homes() + L.pinned_staging <= store.pinned_budget;
}

// Every budget the layout needs (the device's homes and working set, pinned homes and
// staging, NVMe capacity): throws OutOfBudget naming the first that does not hold.
void check_budgets(const ResolvedLayout& R, const std::vector<GroupSize>& groups) {
  const TieredStoreOptions& store = R.options.store;
  if (!device_fits(R.layout, store)) throw OutOfBudget(device_budget_message(R, groups));
  if (!pinned_fits(R.layout, store)) throw OutOfBudget(pinned_budget_message(R));
  TieredStore::check_plan(R.layout.tensor_specs(), store);  // NVMe capacity and staging
}

ShardLayout layout_with(const ResolvedLayout& R, const std::vector<GroupSize>& groups, uint64_t speculative) {
  ShardStrategy st = R.options.shard_strategy(R.world);
  st.speculative_sub_groups = speculative;
  return make_shard_layout(groups, st);
}

// A Next set for as many sub-groups as the budgets leave room for, counted from the
// model's end (the backward pass reaches them first); the others step plainly at step().
// The plain layout fits (checked before), so 0 always does.
void choose_speculative_sub_groups(ResolvedLayout& R, const std::vector<GroupSize>& groups) {
  auto fits = [&](uint64_t k) {
    const ShardLayout L = layout_with(R, groups, k);
    if (!device_fits(L, R.options.store) || !pinned_fits(L, R.options.store)) return false;
    TieredStoreOptions so = R.options.store;
    if (so.nvme.capacity_automatic) so.nvme.capacity = L.nvme_capacity();
    try {
      TieredStore::check_plan(L.tensor_specs(), so);
    } catch (const OutOfBudget&) {
      return false;
    }
    return true;
  };
  uint64_t lo = R.layout.sub_group_count;
  if (!fits(lo)) {
    uint64_t hi = lo - 1;
    lo = 0;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  R.layout = layout_with(R, groups, lo);
  if (R.options.store.nvme.capacity_automatic) R.options.store.nvme.capacity = R.layout.nvme_capacity();
  R.speculation_fallback_sub_groups = R.layout.sub_group_count - lo;
}

// Accumulating gradients kept on the device between micro-steps: only where the room
// beyond the plan holds all of them and still two of the largest gathered groups for
// prefetching; that room is theirs then (the same decision on every rank: sizes only).
void choose_device_room(ResolvedLayout& R) {
  const EngineOptions& o = R.options;
  const ShardLayout& L = R.layout;
  R.prefetch_room = o.store.device_budget - L.need[int(Tier::Device)].homes() - L.device_working;
  if (!R.ablation.keep_accumulating_grads_on_device || o.gradient_accumulation_steps <= 1 || o.stage < 2) return;
  const uint64_t gb = L.elem_bytes(StateRole::Grad), wb = L.elem_bytes(StateRole::GatherBuffer);
  uint64_t grads = 0;
  for (const GroupLayout& g : L.groups)
    if (g.optimizer_home != Tier::Device)
      for (const SubGroup& sg : g.sub_groups) grads += tier_allocation_bytes(sg.n * gb);
  if (grads > 0 && R.prefetch_room >= grads + 2 * L.max_padded * wb) {
    R.keep_grads_on_device = true;
    R.kept_grad_bytes = grads;
    R.prefetch_room -= grads;
  }
}

// The layout and every budget decision; OutOfBudget where the plain layout cannot fit.
void resolve_budgets(ResolvedLayout& R, const std::vector<GroupSize>& groups) {
  EngineOptions& o = R.options;
  R.layout = make_shard_layout(groups, o.shard_strategy(R.world));
  // cpu_checkpointing: pinned memory while it has room for the checkpoints beside the
  // states and their staging, NVMe otherwise (where there is an NVMe tier).
  if (o.checkpoints.count > 0 && o.checkpoints.home == Tier::Pinned && !o.store.nvme.paths.empty() &&
      !pinned_fits(R.layout, o.store)) {
    o.checkpoints.home = Tier::Nvme;
    R.checkpoints_moved_to_nvme = true;
    R.layout = make_shard_layout(groups, o.shard_strategy(R.world));
  }
  // Stage 3 gathers a group whole (a block in parts is a group per part, gpt_parts): a cap
  // on gathered elements below the largest group cannot be kept, so it is refused rather
  // than broken.
  if (o.stage == 3 && o.max_live_elems < R.layout.max_numel)
    throw ConfigError("zero_optimization.stage3_max_live_parameters = " + std::to_string(o.max_live_elems) +
                      " is smaller than the largest parameter group, '" + largest_group(groups).name + "' (" +
                      std::to_string(R.layout.max_numel) + " elements), which stage 3 gathers whole: give at least " +
                      std::to_string(R.layout.max_numel) +
                      " (a block's share falls with a smaller stage3_prefetch_bucket_size and strata.tile_factor)");
  if (!o.store.nvme.paths.empty() && o.store.nvme.capacity == 0) {
    o.store.nvme.capacity = R.layout.nvme_capacity();
    o.store.nvme.capacity_automatic = true;
  }
  check_budgets(R, groups);
  if (o.speculative) choose_speculative_sub_groups(R, groups);
  choose_device_room(R);
  o.sub_group_elems = R.layout.sub_group;  // the rule's choice, as run
}

ResolvedLayout resolve_impl(const EngineOptions& options, const EngineAblation& ablation,
                            const std::vector<GroupSize>& groups, int world, const DeviceTraits& device,
                            bool throw_unfit) {
  ResolvedLayout R;
  R.options = options;
  R.ablation = ablation;
  R.world = world;
  settle_options(R, device);
  R.params_in_place = ablation.params_in_place && R.options.stage == 3 && world == 1 &&
                      R.options.param_home == Tier::Device && R.options.quantized_weights_block == 0;
  R.grads_in_place = ablation.grads_in_place && R.options.stage >= 2 && world == 1 &&
                     R.options.quantized_gradients_block == 0;
  try {
    resolve_budgets(R, groups);
  } catch (const OutOfBudget& e) {
    if (throw_unfit) throw;
    R.unfit = e.what();
    // The layout as asked: every sub-group speculative where speculation is on.
    R.layout = layout_with(R, groups, R.options.speculative ? R.layout.sub_group_count : 0);
    if (R.options.store.nvme.capacity_automatic) R.options.store.nvme.capacity = R.layout.nvme_capacity();
    R.speculation_fallback_sub_groups = 0;
    R.prefetch_room = 0;
  }
  return R;
}

const char* tier_word(Tier t) { return to_string(t); }

}  // namespace

ResolvedLayout resolve(const EngineOptions& options, const EngineAblation& ablation,
                       const std::vector<GroupSize>& groups, int world, const DeviceTraits& device) {
  return resolve_impl(options, ablation, groups, world, device, true);
}

ResolvedLayout try_resolve(const EngineOptions& options, const EngineAblation& ablation,
                           const std::vector<GroupSize>& groups, int world, const DeviceTraits& device) {
  return resolve_impl(options, ablation, groups, world, device, false);
}

std::string ResolvedLayout::describe() const {
  const EngineOptions& o = options;
  const ShardLayout& L = layout;
  std::ostringstream os;
  os << "resolved layout: world " << world << ", stage " << o.stage << ", " << L.groups.size() << " groups, "
     << to_string(L.dtype(StateRole::GatherBuffer)) << " working, " << to_string(L.dtype(StateRole::Grad))
     << " reduced gradients" << (grads_in_place ? " (one rank: accumulated from the model's buffer, nothing to reduce)" : "")
     << "\n";
  os << "  parameters: " << (o.stage == 3 ? std::string("shards in ") + tier_word(o.param_home) : "replicated on device")
     << (params_in_place ? ", read in place (one rank: nothing to gather)" : "")
     << "; optimizer states in " << tier_word(o.optimizer_home);
  if (o.optimizer_ratio < 1.0) os << " (ratio " << o.optimizer_ratio << ", the rest on the device)";
  os << ", stepped by " << (gpu_optimizer ? (o.optimizer_ratio < 1.0 ? "CPU Adam and the GPU optimizer" : "the GPU optimizer")
                                          : "CPU Adam")
     << "\n";
  uint64_t in_shard = 0;
  for (const GroupLayout& g : L.groups) in_shard += g.master_in_shard ? 1 : 0;
  os << "  optimizer sub-groups: " << L.sub_group_count << " of at most " << L.sub_group << " elements; "
     << in_shard << " groups' parameter shard is their master weights\n";
  if (o.speculative)
    os << "  speculation: " << L.strategy.speculative_sub_groups << " of " << L.sub_group_count
       << " sub-groups have a second set"
       << (speculation_fallback_sub_groups > 0 ? " (the budgets have no room for the rest)" : "") << "; "
       << (lane ? "stepped on the optimizer lane" : "stepped on the model's thread") << "\n";
  if (o.checkpoints.count > 0)
    os << "  activation checkpoints: " << o.checkpoints.count << " of " << format_bytes(o.checkpoints.bytes) << " in "
       << tier_word(o.checkpoints.home)
       << (checkpoints_moved_to_nvme ? " (the pinned budget has no room for them beside the states)" : "") << "\n";
  if (o.gradient_accumulation_steps > 1)
    os << "  accumulating gradients: "
       << (keep_grads_on_device ? "kept on the device between micro-steps (" + format_bytes(kept_grad_bytes) + ")"
                                : std::string("to the optimizer's tier each micro-step"))
       << "\n";
  os << "  device: " << format_bytes(L.need[int(Tier::Device)].homes()) << " homes + "
     << format_bytes(L.device_working) << " working set + " << format_bytes(prefetch_room) << " prefetch room of "
     << format_bytes(o.store.device_budget) << " (" << o.store.device_budget << " B)\n";
  os << "  pinned: " << format_bytes(L.need[int(Tier::Pinned)].homes()) << " homes + "
     << format_bytes(L.pinned_staging) << " staging of " << format_bytes(o.store.pinned_budget) << " ("
     << o.store.pinned_budget << " B)\n";
  if (L.need[int(Tier::Nvme)].homes() > 0)
    os << "  nvme: " << format_bytes(L.need[int(Tier::Nvme)].homes()) << " homes in "
       << format_bytes(o.store.nvme.capacity) << "\n";
  if (!unfit.empty()) os << "  does not fit: " << unfit << "\n";
  return os.str();
}

}  // namespace strata
