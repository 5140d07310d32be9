#include "strata/runtime/engine/zero_engine.hpp"

#include "activation_store.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>
#include <thread>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/safe_io.hpp"

namespace strata {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A standard normal value that depends only on (seed, group, element): every rank and
// every world size computes the same initial model.
float normal_at(uint64_t seed, uint64_t group, uint64_t index) {
  uint64_t h = splitmix(splitmix(seed ^ (group * 0x632be59bd9b4e019ull)) + index);
  uint64_t h2 = splitmix(h);
  double u1 = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;         // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

float init_value(const GroupSpec& s, uint64_t seed, uint64_t group, uint64_t index) {
  if (index >= s.numel) return 0.0f;  // padding
  for (const auto& c : s.constants)
    if (index >= c.begin && index < c.end) return c.value;
  switch (s.init) {
    case InitKind::Zeros: return 0.0f;
    case InitKind::Ones: return 1.0f;
    case InitKind::Normal:
      if (s.init_group >= 0) return s.init_std * normal_at(seed, static_cast<uint64_t>(s.init_group), s.init_offset + index);
      return s.init_std * normal_at(seed, group, index);
  }
  return 0.0f;
}

// out[i] = init_value(s, seed, group, base + i) for i < n, on up to `threads` threads (0:
// every core). Each value depends on its index alone, so the split changes no bit; a 1.1B
// model's initial states took 100 s per engine on one thread (on an H200's host).
void fill_initial(float* out, uint64_t n, const GroupSpec& s, uint64_t seed, uint64_t group, uint64_t base,
                  unsigned threads) {
  const uint64_t per = uint64_t{1} << 20;  // below this, one thread
  unsigned t = threads ? threads : std::max(1u, std::thread::hardware_concurrency());
  t = static_cast<unsigned>(std::min<uint64_t>(t, (n + per - 1) / per));
  auto part = [&](uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; ++i) out[i] = init_value(s, seed, group, base + i);
  };
  if (t <= 1) return part(0, n);
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < t; ++k) pool.emplace_back(part, n * k / t, n * (k + 1) / t);
  part(0, n / t);
  for (std::thread& th : pool) th.join();
}

coll::ConstView view(const void* p, uint64_t n, DType t) { return coll::ConstView::elements(p, n, t); }
coll::MutView view_mut(void* p, uint64_t n, DType t) { return coll::MutView::elements(p, n, t); }

const void* at(const void* p, uint64_t elems, uint64_t elem_bytes) {
  return static_cast<const std::byte*>(p) + elems * elem_bytes;
}
void* at(void* p, uint64_t elems, uint64_t elem_bytes) { return static_cast<std::byte*>(p) + elems * elem_bytes; }

HalfKind half_kind(DType t) {
  return t == DType::BF16 ? HalfKind::Bf16 : t == DType::F16 ? HalfKind::Fp16 : HalfKind::None;
}

}  // namespace

struct ZeroEngine::Chunk {
  uint64_t offset = 0;  // elements into the rank's shard
  uint64_t n = 0;       // elements
  TensorId master = 0, exp_avg = 0, exp_avg_sq = 0, grad = 0;
  // Speculative sub-groups: the Next set (shard_layout.hpp), swapped with the current
  // one when a speculative step is committed.
  TensorId next_master = 0, next_exp_avg = 0, next_exp_avg_sq = 0;
  bool has_next = false;    // a speculative sub-group (SubGroup::speculative)
  bool speculated = false;  // this step's update sits in the Next set, not yet validated
  double sumsq = 0;     // squared norm of the accumulated gradient (written by reduce_stream_)
};

struct ZeroEngine::Group {
  GroupSpec spec;
  uint64_t padded = 0;   // elements, as the layout pads (shard_layout.hpp)
  uint64_t shard = 0;    // elements per rank
  bool persistent = false;
  Tier opt_home = Tier::Device;  // its optimizer states' home (offload_optimizer.ratio may split groups)
  bool opt_on_device = false;    // stepped by the GPU optimizer (update_on_device)
  // The parameter shard is the master weights (GroupLayout::master_in_shard): its chunks
  // have no master of their own (master 0) and are stepped in their range of pshard; a
  // speculative step writes next_pshard, swapped with pshard when it commits.
  bool master_in_shard = false;
  TensorId next_pshard = 0;
  // Types as the layout says (shard_layout.hpp): working (w) or reduced-gradient (g).
  TensorId full = 0;     // [padded] w: stage 3 a scratch gather buffer, else replicated params
  TensorId pshard = 0;   // stage 3: [shard] w working parameters, home offload_param
  TensorId gfull = 0;    // [padded] w scratch: the model's gradient of one micro-batch
  bool gfull_scratch = true;  // false: held across backward, a device home (first_gradient_held)
  TensorId gacc = 0;     // stage 1: [padded] g accumulated gradient, home device
  TensorId rs_out = 0;   // stages 2, 3: [shard] w scratch, reduce-scatter output
  std::vector<Chunk> chunks;

  enum class Full { Released, Gathering, Ready };
  Full state = Full::Released;
  Event gathered;
  void* full_ptr = nullptr;
  void* grad_ptr = nullptr;
  Event grad_tail_zeroed;
  Event grad_consumed;   // the last reduction that read gfull
  Event reduced_consumed;  // the last accumulation that read rs_out
  int holders = 0;
  double gather_issued = 0;  // device clock, for the trace
  bool reduced = false;      // stage 1, speculating: this step's all-reduce already ran
};

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
  return s;
}

ZeroEngine::ZeroEngine(Device& device, coll::Communicator& comm, coll::Communicator& host_comm, EngineOptions opts,
                       std::vector<GroupSpec> groups)
    : device_(device), comm_(comm), host_comm_(host_comm), opts_(std::move(opts)) {
  world_ = comm_.size();
  rank_ = comm_.rank();
  // The stage, the groups and the rules are checked by make_shard_layout, below, before
  // anything is allocated.
  if (opts_.gradient_accumulation_steps < 1)
    throw ConfigError("gradient_accumulation_steps must be at least 1");
  if (opts_.stage < 3) opts_.param_home = Tier::Device;  // stages 1 and 2 replicate parameters
  opt_compute_tier_ = opts_.optimizer_home == Tier::Device ? Tier::Device : Tier::Pinned;
  // States in device memory the host cannot address: the GPU optimizer steps them there,
  // and host code (initialisation, checkpoints, restores) goes through pinned copies.
  const bool split = opts_.optimizer_ratio < 1.0;
  if (split && device_.host_addressable() && !opts_.optimizer_on_stream)
    throw ConfigError(
        "zero_optimization.offload_optimizer.ratio below 1 steps part of the optimizer on the GPU, and the " +
        std::string(to_string(device_.backend())) +
        " backend has none: drop ratio (1, the default, steps all of it with CPU Adam) or use strata.backend cuda");
  if ((opt_compute_tier_ == Tier::Device || split) && !device_.host_addressable()) opts_.optimizer_on_stream = true;
  gpu_optimizer_ = (opt_compute_tier_ == Tier::Device || split) && opts_.optimizer_on_stream;
  opt_host_tier_ = gpu_optimizer_ ? Tier::Pinned : opt_compute_tier_;

  if (opts_.cpu_checkpointing) {
    if (opts_.checkpoints.count == 0)
      throw ConfigError(
          "activation_checkpointing.cpu_checkpointing moves the model's activation checkpoints off the device, and "
          "this engine holds none: strata train holds them when activation_checkpointing.enabled is true; a trainer "
          "embedding Strata through its C API keeps its own activations (drop cpu_checkpointing there)");
    if (opts_.checkpoints.home == Tier::Device) opts_.checkpoints.home = Tier::Pinned;
  }

  // The layout (shard_layout.hpp) decides every size; the engine allocates from it.
  std::vector<GroupSize> sizes;
  for (const GroupSpec& g : groups) sizes.push_back({g.name, g.numel});
  layout_ = make_shard_layout(sizes, opts_.shard_strategy(world_));
  // cpu_checkpointing: pinned memory while it has room for the checkpoints beside the
  // states and their staging, NVMe otherwise (where there is an NVMe tier).
  if (opts_.checkpoints.count > 0 && opts_.checkpoints.home == Tier::Pinned && !opts_.store.nvme.paths.empty() &&
      layout_.need[int(Tier::Pinned)].homes() + layout_.pinned_staging > opts_.store.pinned_budget) {
    opts_.checkpoints.home = Tier::Nvme;
    layout_ = make_shard_layout(sizes, opts_.shard_strategy(world_));
    if (rank_ == 0)
      log::info("activation_checkpointing.cpu_checkpointing: the pinned budget has no room for the " +
                std::to_string(opts_.checkpoints.count) + " checkpoints beside the states; they go to NVMe");
  }
  work_t_ = layout_.dtype(StateRole::GatherBuffer);
  grad_t_ = layout_.dtype(StateRole::Grad);
  wb_ = dtype_size(work_t_);
  gb_ = dtype_size(grad_t_);
  if (opts_.precision == DType::F16) {  // fp16 always scales: with DeepSpeed's defaults unless configured
    Fp16Config f = opts_.fp16;
    f.enabled = true;
    scaler_ = LossScaler(f);
  }
  stats_.loss_scale = scaler_.scale();
  groups_.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& gr = groups_[g];
    const GroupLayout& gl = layout_.groups[g];
    gr.spec = std::move(groups[g]);
    gr.padded = gl.padded;
    gr.shard = gl.shard;
    gr.persistent = gl.persistent;
    gr.opt_home = gl.optimizer_home;
    gr.opt_on_device = gl.optimizer_home == Tier::Device && gpu_optimizer_;
    for (const SubGroup& sg : gl.sub_groups) gr.chunks.push_back({sg.offset, sg.n});
  }

  // Stage 3 gathers a group whole (a block in parts is a group per part, gpt_parts): a cap
  // on gathered elements below the largest group cannot be kept, so it is refused rather
  // than broken.
  if (opts_.stage == 3 && opts_.max_live_elems < layout_.max_numel) {
    const auto largest = std::max_element(groups_.begin(), groups_.end(), [](const Group& a, const Group& b) {
      return a.spec.numel < b.spec.numel;
    });
    throw ConfigError("zero_optimization.stage3_max_live_parameters = " + std::to_string(opts_.max_live_elems) +
                      " is smaller than the largest parameter group, '" + largest->spec.name + "' (" +
                      std::to_string(layout_.max_numel) +
                      " elements), which stage 3 gathers whole: give at least " +
                      std::to_string(layout_.max_numel) +
                      " (a block's share falls with a smaller stage3_prefetch_bucket_size and strata.tile_factor)");
  }
  // Check the plan before anything is allocated: every home copy must fit its tier,
  // and the device must hold one group's working set on top.
  if (!opts_.store.nvme.paths.empty() && opts_.store.nvme.capacity == 0) {
    opts_.store.nvme.capacity = layout_.nvme_capacity();
    opts_.store.nvme.capacity_automatic = true;
  }
  const uint64_t device_home = layout_.need[int(Tier::Device)].homes();
  const uint64_t working = layout_.device_working;
  if (device_home + working > opts_.store.device_budget) {
    std::ostringstream os;
    os << "the device budget of " << format_bytes(opts_.store.device_budget) << " is too small: the model needs "
       << format_bytes(device_home) << " resident on the device";
    if (opts_.stage < 3) os << " (stages 1 and 2 keep all parameters there)";
    if (layout_.strategy.first_gradient_held && groups_.size() >= 2)
      os << " (with the gradient of '" << groups_[0].spec.name
         << "', held there from the tied head's backward to the end of backward)";
    const auto largest = std::max_element(groups_.begin(), groups_.end(), [](const Group& a, const Group& b) {
      return a.spec.numel < b.spec.numel;
    });
    os << " plus " << format_bytes(working) << " for the groups in use (the largest, '" << largest->spec.name << "', "
       << layout_.max_padded << " elements padded)";
    if (const uint64_t a = layout_.need[int(Tier::Device)].activations; a > 0)
      os << "; the resident bytes include " << opts_.checkpoints.count << " activation checkpoints ("
         << format_bytes(a) << ", activation_checkpointing.cpu_checkpointing moves them off the device)";
    os << ". Raise strata.device_budget to at least " << format_bytes(device_home + working)
       << (opts_.stage < 3 ? ", or use zero_optimization.stage 3 with offload_param" : ", or offload more") << ".";
    throw OutOfBudget(os.str());
  }
  const uint64_t pinned_working = layout_.pinned_staging;
  const uint64_t pinned_home = layout_.need[int(Tier::Pinned)].homes();
  if (const uint64_t a = layout_.need[int(Tier::Pinned)].activations;
      a > 0 && pinned_home + pinned_working > opts_.store.pinned_budget)
    throw OutOfBudget("the pinned budget of " + format_bytes(opts_.store.pinned_budget) + " is too small: " +
                      format_bytes(pinned_home - a) + " of states and " + format_bytes(a) + " of activation checkpoints (" +
                      std::to_string(opts_.checkpoints.count) +
                      ", activation_checkpointing.cpu_checkpointing) live there, and the optimizer needs " +
                      format_bytes(pinned_working) + " of staging. Raise strata.pinned_budget to at least " +
                      format_bytes(pinned_home + pinned_working) +
                      ", or give an NVMe path (offload_param or offload_optimizer on nvme) for the checkpoints to go "
                      "to, or drop cpu_checkpointing.");
  if (pinned_home + pinned_working > opts_.store.pinned_budget)
    throw OutOfBudget("the pinned budget of " + format_bytes(opts_.store.pinned_budget) + " is too small: " +
                      format_bytes(pinned_home) + " of states live there and the optimizer needs " +
                      format_bytes(pinned_working) + " of staging for its sub-groups (sub_group_size " +
                      std::to_string(layout_.max_sub_group) + " elements). Raise strata.pinned_budget to at least " +
                      format_bytes(pinned_home + pinned_working) + " or lower sub_group_size.");
  TieredStore::check_plan(layout_.tensor_specs(), opts_.store);  // NVMe capacity and staging
  if (opts_.speculative) {
    // A Next set for as many sub-groups as the budgets leave room for, counted from the
    // model's end (the backward pass reaches them first); the others step plainly at
    // step(). The plain layout fits (checked above), so 0 always does.
    auto layout_with = [&](uint64_t k) {
      ShardStrategy st = opts_.shard_strategy(world_);
      st.speculative_sub_groups = k;
      return make_shard_layout(sizes, st);
    };
    auto fits = [&](uint64_t k) {
      const ShardLayout L = layout_with(k);
      if (L.need[int(Tier::Device)].homes() + L.device_working > opts_.store.device_budget) return false;
      if (L.need[int(Tier::Pinned)].homes() + L.pinned_staging > opts_.store.pinned_budget) return false;
      TieredStoreOptions so = opts_.store;
      if (so.nvme.capacity_automatic) so.nvme.capacity = L.nvme_capacity();
      try {
        TieredStore::check_plan(L.tensor_specs(), so);
      } catch (const OutOfBudget&) {
        return false;
      }
      return true;
    };
    uint64_t lo = layout_.sub_group_count;
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
    layout_ = layout_with(lo);
    if (opts_.store.nvme.capacity_automatic) opts_.store.nvme.capacity = layout_.nvme_capacity();
    stats_.speculation_fallback_sub_groups = layout_.sub_group_count - lo;
    if (lo < layout_.sub_group_count)
      log::warn("strata.speculative_optimizer: the budgets leave room for a second set of optimizer states for " +
                std::to_string(lo) + " of " + std::to_string(layout_.sub_group_count) +
                " sub-groups; the others step after the backward pass. Raise the budget of the optimizer's tier "
                "(zero_optimization.offload_optimizer.device) to speculate on all of them.");
  }
  prefetch_room_ =
      opts_.store.device_budget - layout_.need[int(Tier::Device)].homes() - layout_.device_working;
  // Accumulating gradients kept on the device between micro-steps: only where the room
  // beyond the plan holds all of them and still two of the largest gathered groups for
  // prefetching; that room is theirs then (the same decision on every rank: sizes only).
  if (opts_.keep_accumulating_grads_on_device && opts_.gradient_accumulation_steps > 1 && opts_.stage >= 2) {
    uint64_t grads = 0;
    for (const GroupLayout& g : layout_.groups)
      if (g.optimizer_home != Tier::Device)
        for (const SubGroup& sg : g.sub_groups) grads += tier_allocation_bytes(sg.n * gb_);
    if (grads > 0 && prefetch_room_ >= grads + 2 * layout_.max_padded * wb_) {
      keep_grads_ = true;
      prefetch_room_ -= grads;
      stats_.grads_kept_on_device_bytes = grads;
    }
  }

  store_ = std::make_unique<TieredStore>(device_, opts_.store);
  CpuAdamOptions ao;
  ao.threads = opts_.optimizer_threads;
  math::AdamHyperparams hp;
  hp.lr = opts_.optimizer.lr;
  hp.beta1 = opts_.optimizer.beta1;
  hp.beta2 = opts_.optimizer.beta2;
  hp.eps = opts_.optimizer.eps;
  hp.weight_decay = opts_.optimizer.weight_decay;
  hp.variant = opts_.optimizer.kind == OptimizerKind::AdamW ? AdamVariant::AdamW : AdamVariant::Adam;
  adam_ = std::make_unique<CpuAdam>(hp, ao);
  reduce_stream_ = device_.create_stream("reduce");
  if (gpu_optimizer_) opt_stream_ = device_.create_stream("optimizer");
  owner_ = std::this_thread::get_id();
  if (opts_.speculative && opts_.speculation_lane && opts_.stage == 3) {
    lane_ = device_.create_host_stream("optimizer lane");
    store_->set_room_maker([this] { return lane_make_room(); });
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& gr = groups_[g];
    gr.master_in_shard = layout_.groups[g].master_in_shard;  // the final layout's (speculation)
    for (const StateTensor& t : layout_.groups[g].tensors) {
      const TensorId id = store_->add(t.spec);
      switch (t.role) {
        case StateRole::GatherBuffer:
        case StateRole::ReplicatedParams: gr.full = id; break;
        case StateRole::ParamShard: gr.pshard = id; break;
        case StateRole::GradFull:
          gr.gfull = id;
          gr.gfull_scratch = t.spec.scratch;  // not: a device home (ShardStrategy::first_gradient_held)
          break;
        case StateRole::GradAccumulated: gr.gacc = id; break;
        case StateRole::GradReduced: gr.rs_out = id; break;
        case StateRole::Master: gr.chunks[t.sub_group].master = id; break;
        case StateRole::ExpAvg: gr.chunks[t.sub_group].exp_avg = id; break;
        case StateRole::ExpAvgSq: gr.chunks[t.sub_group].exp_avg_sq = id; break;
        case StateRole::Grad: gr.chunks[t.sub_group].grad = id; break;
        case StateRole::MasterNext:
          (t.sub_group < 0 ? gr.next_pshard : gr.chunks[t.sub_group].next_master) = id;
          break;
        case StateRole::ExpAvgNext:
          gr.chunks[t.sub_group].next_exp_avg = id;
          gr.chunks[t.sub_group].has_next = true;
          break;
        case StateRole::ExpAvgSqNext: gr.chunks[t.sub_group].next_exp_avg_sq = id; break;
        case StateRole::ActivationCheckpoint: STRATA_CHECK(false, "a checkpoint among a group's tensors"); break;
      }
    }
  }
  if (!layout_.checkpoints.empty()) {
    std::vector<TensorId> ids;
    for (const StateTensor& t : layout_.checkpoints) ids.push_back(store_->add(t.spec));
    checkpoints_ = std::make_unique<TieredActivationStore>(
        *store_, device_, std::move(ids), opts_.checkpoints.bytes, opts_.checkpoints.home,
        [this](double since, const std::string& what) { waited(since, what.c_str(), nullptr); });
  }
  // A trace path that cannot be written is refused now, not after the run.
  if (!opts_.trace_path.empty()) {
    check_output_path(opts_.trace_path, "strata.trace");
    check_output_writable(opts_.trace_path, "strata.trace");
  }
  init_shards();
  // Last, so that a constructor that throws leaves no recorder active behind it. The
  // trace starts with training; initialisation is not in it.
  if (!opts_.trace_path.empty()) {
    trace_ = std::make_unique<trace::Recorder>(rank_);
    outer_trace_ = trace::set_active(trace_.get());
  }
}

ZeroEngine::~ZeroEngine() {
  try {
    reduce_stream_->synchronize();
    if (opt_stream_) opt_stream_->synchronize();
    if (lane_) lane_->synchronize();
  } catch (...) {
  }
  if (store_) store_->set_room_maker(nullptr);
  if (store_) store_->quiesce();
  if (trace_) {
    trace::set_active(outer_trace_);
    try {
      trace_->write_json(opts_.trace_path);
    } catch (const std::exception& e) {
      log::error(std::string("trace not written: ") + e.what());
    }
  }
}

void ZeroEngine::waited(double since, const char* what, const Group* gr) {
  const double now = device_.now();
  stats_.exposed_wait_s += now - since;
  if (trace::Recorder* r = trace::active(); r && now > since)
    r->record("wait", gr ? std::string(what) + " " + gr->spec.name : std::string(what), since, now);
}

ActivationStore* ZeroEngine::activation_store() { return checkpoints_.get(); }

int ZeroEngine::num_groups() const { return static_cast<int>(groups_.size()); }
uint64_t ZeroEngine::group_numel(int g) const { return groups_.at(g).spec.numel; }
uint64_t ZeroEngine::shard_numel(int g) const { return groups_.at(g).shard; }
const std::string& ZeroEngine::group_name(int g) const { return groups_.at(g).spec.name; }

// ---------------------------------------------------------------------------------------
// Initialisation: each rank fills its own shards only.

void ZeroEngine::init_shards() {
  const Tier t = opt_host_tier_;
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& gr = groups_[g];
    const uint64_t base = static_cast<uint64_t>(rank_) * gr.shard;  // global index of the shard
    // The shard's initial values, computed once: the master weights and, rounded to the
    // working type, the parameters. (Allocated where the work runs: sim runs none of it.)
    std::vector<float> vals;
    device_.host_compute(4.0 * gr.shard, [&] {
      vals.resize(gr.shard);
      fill_initial(vals.data(), gr.shard, gr.spec, opts_.seed, g, base, opts_.optimizer_threads);
    });
    for (Chunk& c : gr.chunks) {
      // The master weights: the chunk's own, or (master_in_shard) the shard written below.
      Acquired m = gr.master_in_shard ? Acquired{} : store_->acquire_for_overwrite(c.master, t);
      Acquired a = store_->acquire_for_overwrite(c.exp_avg, t);
      Acquired v = store_->acquire_for_overwrite(c.exp_avg_sq, t);
      when_all({m.ready, a.ready, v.ready}).wait();
      device_.host_compute(12.0 * c.n, [&] {
        if (m.data) std::memcpy(m.data, vals.data() + c.offset, c.n * 4);
        std::memset(a.data, 0, c.n * 4);
        std::memset(v.data, 0, c.n * 4);
      });
      for (TensorId id : {c.master, c.exp_avg, c.exp_avg_sq}) {
        if (id == 0) continue;
        store_->release(id, t, Access::Write);
        if (t != gr.opt_home) store_->drop(id, t).wait();
      }
    }
    if (opts_.stage == 3) {
      Acquired p = store_->acquire_for_overwrite(gr.pshard, Tier::Pinned);
      p.ready.wait();
      // The working copy is the master weights rounded to the working type.
      device_.host_compute((4.0 + wb_) * gr.shard, [&] { convert_from_f32(p.data, work_t_, vals.data(), gr.shard); });
      store_->release(gr.pshard, Tier::Pinned, Access::Write);
      if (opts_.param_home != Tier::Pinned) {
        if (opts_.param_home == Tier::Device) store_->fetch(gr.pshard, Tier::Device).wait();
        store_->drop(gr.pshard, Tier::Pinned).wait();
      }
    } else {
      // Replicated parameters: fill this rank's slice, then gather the others.
      Acquired f = store_->acquire(gr.full, Tier::Device);
      f.ready.wait();
      std::vector<std::byte> slice(gr.shard * wb_);
      device_.host_compute((4.0 + wb_) * gr.shard,
                           [&] { convert_from_f32(slice.data(), work_t_, vals.data(), gr.shard); });
      void* mine = at(f.data, base, wb_);
      reduce_stream_->copy_async(mine, slice.data(), gr.shard * wb_);
      Event copied = reduce_stream_->record();
      comm_.all_gather(view(mine, gr.shard, work_t_), view_mut(f.data, gr.padded, work_t_), copied).wait();
      store_->release(gr.full, Tier::Device, Access::Write);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Parameters: gather ahead of need, release after use.

void ZeroEngine::set_schedule(std::vector<int> order) {
  for (int g : order)
    if (g < 0 || g >= num_groups()) throw Error("set_schedule: unknown parameter group " + std::to_string(g));
  schedule_given_ = true;
  adopt_schedule(std::move(order));
}

void ZeroEngine::adopt_schedule(std::vector<int> order) {
  schedule_ = std::move(order);
  std::vector<TensorId> tensors;
  for (int g : schedule_) tensors.push_back(opts_.stage == 3 ? groups_[g].pshard : groups_[g].full);
  store_->set_schedule(std::move(tensors));
}

void ZeroEngine::begin_micro_step() {
  if (micro_ + 1 >= opts_.gradient_accumulation_steps)
    throw Error("begin_micro_step: " + std::to_string(opts_.gradient_accumulation_steps) +
                " micro-steps (gradient_accumulation_steps) already ran; call step() first");
  ++micro_;
  if (checkpoints_) checkpoints_->reset();
  // Learn the order from the micro-step just finished, or re-learn it after a departure.
  if (!recording_.empty() && !schedule_given_ && (departed_ || schedule_.empty())) adopt_schedule(recording_);
  recording_.clear();
  departed_ = false;
  pos_ = 0;
}

void ZeroEngine::start_gather(int g, bool ahead) {
  Group& gr = groups_[g];
  if (gr.state != Group::Full::Released) return;
  Acquired ps = store_->acquire(gr.pshard, Tier::Device);
  Acquired fb = store_->acquire_for_overwrite(gr.full, Tier::Device);
  gr.full_ptr = fb.data;
  gr.gathered = comm_.all_gather(view(ps.data, gr.shard, work_t_), view_mut(fb.data, gr.padded, work_t_),
                                 when_all({ps.ready, fb.ready}));
  gr.gather_issued = device_.now();
  gr.state = Group::Full::Gathering;
  live_full_bytes_ += gr.persistent ? 0 : gr.padded * wb_;
  gathering_shard_bytes_ += gr.shard * wb_;
  ++stats_.gathers;
  if (ahead) ++stats_.prefetched;
}

void ZeroEngine::wait_gathered(Group& gr) {
  if (gr.state != Group::Full::Gathering) return;
  const double t0 = device_.now();
  Event e = gr.gathered;
  try {
    e.wait();
  } catch (...) {
    waited(t0, "wait params", &gr);
    store_->release(gr.pshard, Tier::Device);
    store_->release(gr.full, Tier::Device);
    store_->discard(gr.full);
    gr.state = Group::Full::Released;
    live_full_bytes_ -= gr.persistent ? 0 : gr.padded * wb_;
    gathering_shard_bytes_ -= gr.shard * wb_;
    throw;
  }
  waited(t0, "wait params", &gr);
  if (trace::Recorder* r = trace::active())
    r->record("gather", "all_gather " + gr.spec.name, gr.gather_issued, device_.now());
  store_->release(gr.pshard, Tier::Device);
  store_->release(gr.full, Tier::Device, Access::Write);
  gathering_shard_bytes_ -= gr.shard * wb_;
  gr.state = Group::Full::Ready;
}

uint64_t ZeroEngine::reuse_distance(int g, size_t pos) const {
  if (schedule_.empty() || departed_) return std::numeric_limits<uint64_t>::max();
  uint64_t dist = 0;
  for (size_t q = pos + 1; q < schedule_.size(); ++q) {
    if (schedule_[q] == g) return dist;
    dist += groups_[schedule_[q]].spec.numel;
  }
  return std::numeric_limits<uint64_t>::max();  // not again before the optimizer step
}

void ZeroEngine::prefetch_after(size_t pos) {
  if (!opts_.prefetch || departed_) return;
  uint64_t window = 0;
  // Every gather in flight holds its parameter shard on the device until it lands; the
  // working set holds one (the group gathered on demand), the others take prefetch room.
  const uint64_t shard_in_working = layout_.max_shard * wb_;
  for (size_t q = pos + 1; q < schedule_.size(); ++q) {
    int h = schedule_[q];
    Group& hg = groups_[h];
    window += hg.spec.numel;
    if (window > opts_.prefetch_bucket_elems) break;
    if (hg.state != Group::Full::Released) continue;
    // A persistent group's buffer is counted among the homes, but its first gather still
    // passes its shard through the device.
    const uint64_t bytes = hg.persistent ? 0 : hg.padded * wb_;
    const uint64_t shards = gathering_shard_bytes_ + hg.shard * wb_;
    const uint64_t passing = shards > shard_in_working ? shards - shard_in_working : 0;
    // Decided from sizes and the schedule alone, so every rank gathers in the same order.
    if (live_full_bytes_ + passing + bytes > prefetch_room_) break;
    if ((live_full_bytes_ + bytes) / wb_ > opts_.max_live_elems) break;
    start_gather(h, true);
  }
}

const void* ZeroEngine::acquire_params(int g) {
  if (g < 0 || g >= num_groups()) throw Error("acquire_params: unknown parameter group " + std::to_string(g));
  Group& gr = groups_[g];
  recording_.push_back(g);
  size_t here = pos_;
  if (!departed_ && !schedule_.empty()) {
    if (pos_ < schedule_.size() && schedule_[pos_] == g) {
      ++pos_;
    } else {
      // The model left the known order: fetch on demand for the rest of this
      // micro-step, and learn the new order from it.
      departed_ = true;
      ++stats_.trace_departures;
      log::debug("acquire order departed from the schedule at group " + gr.spec.name);
    }
  }
  if (!departed_ && !schedule_.empty()) store_->set_position(here);
  if (opts_.stage == 3) {
    start_gather(g, false);
    if (!departed_ && !schedule_.empty()) prefetch_after(here);
    wait_gathered(gr);
  } else {
    const double t0 = device_.now();
    Acquired f = store_->acquire(gr.full, Tier::Device);
    f.ready.wait();
    waited(t0, "wait params", &gr);
    gr.full_ptr = f.data;
  }
  ++gr.holders;
  return gr.full_ptr;
}

void ZeroEngine::drop_full(Group& gr) {
  if (gr.state != Group::Full::Ready || gr.holders > 0) return;
  store_->discard(gr.full);
  gr.state = Group::Full::Released;
  gr.full_ptr = nullptr;
  live_full_bytes_ -= gr.persistent ? 0 : gr.padded * wb_;
}

void ZeroEngine::release_params(int g) {
  Group& gr = groups_.at(g);
  if (gr.holders <= 0) throw Error("release_params: group '" + gr.spec.name + "' is not acquired");
  --gr.holders;
  if (opts_.stage < 3) {
    store_->release(gr.full, Tier::Device);
    return;
  }
  if (gr.holders > 0 || gr.persistent) return;
  // Keep the gathered parameters when they are needed again soon, room permitting.
  const size_t here = pos_ == 0 ? 0 : pos_ - 1;
  if (reuse_distance(g, here) <= opts_.max_reuse_distance_elems && live_full_bytes_ <= prefetch_room_) return;
  drop_full(gr);
}

// ---------------------------------------------------------------------------------------
// Gradients: reduce as soon as they are ready, accumulate in the shard's sub-groups.

void* ZeroEngine::gradient_buffer(int g) {
  Group& gr = groups_.at(g);
  if (gr.grad_ptr) throw Error("gradient_buffer: group '" + gr.spec.name + "' already has one outstanding");
  Acquired a = store_->acquire_for_overwrite(gr.gfull, Tier::Device);
  // The previous micro-batch's reduction may still be reading the buffer, and the memory
  // may still be in use by whoever held it before.
  const double t0 = device_.now();
  when_all({a.ready, gr.grad_consumed}).wait();
  waited(t0, "wait gradient buffer", &gr);
  gr.grad_ptr = a.data;
  // The model writes [0, numel); the padding is zeroed here.
  reduce_stream_->fill_as(at(gr.grad_ptr, gr.spec.numel, wb_), work_t_, 0.0f, gr.padded - gr.spec.numel);
  gr.grad_tail_zeroed = reduce_stream_->record();
  return gr.grad_ptr;
}

void ZeroEngine::accumulate_chunks(Group& gr, const void* reduced, DType t, Event reduced_ready, bool first,
                                   bool last) {
  const uint64_t tb = dtype_size(t);
  for (Chunk& c : gr.chunks) {
    Acquired a = first ? store_->acquire_for_overwrite(c.grad, Tier::Device) : store_->acquire(c.grad, Tier::Device);
    reduce_stream_->wait(a.ready);
    reduce_stream_->wait(reduced_ready);
    const void* src = at(reduced, c.offset, tb);
    if (first)
      reduce_stream_->convert(a.data, grad_t_, src, t, c.n);  // a copy when the types agree
    else  // later micro-steps: grad_t_ is fp32 (grads_dtype)
      reduce_stream_->accumulate(static_cast<float*>(a.data), src, t, c.n);
    if (last) {
      c.sumsq = 0;
      reduce_stream_->sum_squares_as(a.data, grad_t_, c.n, &c.sumsq);
    }
    Event done = reduce_stream_->record();
    store_->release(c.grad, Tier::Device, Access::Write, done);
    // Send it towards the optimizer's tier now, behind the accumulation, so that the
    // device holds one group's gradient at a time; or, with room for them all
    // (keep_grads_), only in the last micro-step.
    if (gr.opt_home != Tier::Device && (last || !keep_grads_)) store_->drop(c.grad, Tier::Device);
  }
}

void ZeroEngine::all_reduce_stage1(Group& gr) {
  Acquired acc = store_->acquire(gr.gacc, Tier::Device);
  Event reduced = comm_.all_reduce(view_mut(acc.data, gr.padded, grad_t_), coll::ReduceOp::Sum, acc.ready);
  accumulate_chunks(gr, at(acc.data, static_cast<uint64_t>(rank_) * gr.shard, gb_), grad_t_, reduced, true, true);
  store_->release(gr.gacc, Tier::Device, Access::Write, reduced);
  gr.reduced = true;
}

void ZeroEngine::grads_ready(int g) {
  Group& gr = groups_.at(g);
  if (!gr.grad_ptr) throw Error("grads_ready: group '" + gr.spec.name + "' has no gradient buffer");
  if (micro_ < 0) throw Error("grads_ready before begin_micro_step()");
  store_->release(gr.gfull, Tier::Device, Access::Write, gr.grad_tail_zeroed);
  const bool last = micro_ == opts_.gradient_accumulation_steps - 1;
  if (opts_.stage == 1) {
    // Full gradients stay on the device and are all-reduced at the step.
    Acquired acc = store_->acquire(gr.gacc, Tier::Device);
    reduce_stream_->wait(acc.ready);
    reduce_stream_->wait(gr.grad_tail_zeroed);
    if (micro_ == 0)
      reduce_stream_->convert(acc.data, grad_t_, gr.grad_ptr, work_t_, gr.padded);
    else
      reduce_stream_->accumulate(static_cast<float*>(acc.data), gr.grad_ptr, work_t_, gr.padded);
    Event done = reduce_stream_->record();
    store_->release(gr.gacc, Tier::Device, Access::Write, done);
    if (gr.gfull_scratch) store_->discard_after(gr.gfull, done);
    gr.grad_consumed = done;
    // Speculating: the step's all-reduce now rather than at step(), so the sub-groups
    // can be stepped during the rest of the backward pass.
    if (last && opts_.speculative) all_reduce_stage1(gr);
  } else {
    Acquired out = store_->acquire_for_overwrite(gr.rs_out, Tier::Device);
    // Written only once the previous accumulation has read the last contents.
    Event reduced = comm_.reduce_scatter(view(gr.grad_ptr, gr.padded, work_t_), view_mut(out.data, gr.shard, work_t_),
                                         coll::ReduceOp::Sum,
                                         when_all({gr.grad_tail_zeroed, gr.reduced_consumed, out.ready}));
    store_->release(gr.rs_out, Tier::Device, Access::Write, reduced);
    accumulate_chunks(gr, out.data, work_t_, reduced, micro_ == 0, last);
    gr.reduced_consumed = reduce_stream_->record();
    if (gr.gfull_scratch) store_->discard_after(gr.gfull, reduced);
    store_->discard_after(gr.rs_out, gr.reduced_consumed);
    gr.grad_consumed = reduced;
  }
  gr.grad_ptr = nullptr;
  if (last && opts_.speculative) {
    // One group behind the backward pass: the newest group's reduction is still in
    // flight, and on a GPU the model's next kernels are queued while the host steps.
    // Its states start on their way now, so that they are there when it is stepped.
    if (opts_.early_state_fetch) prefetch_first_states(gr);
    spec_queue_.push_back(g);
    while (spec_queue_.size() > 1) {
      const int q = spec_queue_.front();
      spec_queue_.erase(spec_queue_.begin());
      speculate_group(q);
    }
  }
  if (lane_) lane_pump();
}

// ---------------------------------------------------------------------------------------
// The optimizer step.

double ZeroEngine::global_grad_norm() {
  double local = 0;
  for (const Group& gr : groups_)
    for (const Chunk& c : gr.chunks) local += c.sumsq;
  double total = local;
  host_comm_.all_reduce(std::span<double>(&total, 1)).wait();
  const double scale = static_cast<double>(world_) * opts_.gradient_accumulation_steps * scaler_.scale();
  return std::sqrt(total) / scale;  // of the averaged, unscaled gradient
}

float ZeroEngine::unclipped_grad_scale() const {
  return static_cast<float>(1.0 / (static_cast<double>(world_) * opts_.gradient_accumulation_steps * scaler_.scale()));
}

bool ZeroEngine::step() {
  if (micro_ + 1 != opts_.gradient_accumulation_steps)
    throw Error("step() after " + std::to_string(micro_ + 1) + " micro-steps; gradient_accumulation_steps is " +
                std::to_string(opts_.gradient_accumulation_steps));
  for (const Group& gr : groups_)
    if (gr.holders > 0 || gr.grad_ptr)
      throw Error("step() while group '" + gr.spec.name + "' is still acquired or awaiting its gradient");
  if (opts_.stage == 1)
    for (Group& gr : groups_)
      if (!gr.reduced) all_reduce_stage1(gr);
  const double t0 = device_.now();
  reduce_stream_->synchronize();
  waited(t0, "wait gradient reduction", nullptr);
  // The norm needs only the reductions: known before the lane is done, it says whether
  // the speculation commits while the lane still steps the last groups.
  const double norm = global_grad_norm();
  stats_.last_grad_norm = norm;
  free_dead_kept_grads(norm);
  lane_finish();  // before the validation: what it stepped is speculated like the rest
  stats_.speculation_wait_s = spec_wait_;
  spec_wait_ = 0;
  micro_ = -1;
  spec_queue_.clear();  // the last group(s) are stepped below, knowing the norm
  for (Group& gr : groups_) gr.reduced = false;
  ++iterations_;
  std::vector<Update> speculated, plain;
  for (Group& gr : groups_)
    for (Chunk& c : gr.chunks) (c.speculated ? speculated : plain).push_back({&gr, &c});
  stats_.speculated_sub_groups = speculated.size();
  // Every rank has the same norm (all-reduced): all skip together, before any state changes.
  const double scale_used = scaler_.scale();
  if (!std::isfinite(norm)) {
    ++stats_.skipped_steps;
    if (!speculated.empty()) {
      // The committed states are untouched; the working parameters go back to them.
      ++stats_.speculation_rollbacks;
      restore_params(speculated);
    }
    scaler_.update(true);
    if (scaler_.enabled())
      log::info("fp16: gradients overflowed at loss scale " + std::to_string(scale_used) +
                "; step skipped, the scale is now " + std::to_string(scaler_.scale()));
    else
      log::warn("gradient norm is not finite; skipping this optimizer step");
    stats_.loss_scale = scaler_.scale();
    for (Group& gr : groups_)  // the skipped gradients are dead too: nothing writes them home
      for (Chunk& c : gr.chunks) {
        store_->discard_contents(c.grad);
        if (c.speculated)
          for (TensorId id : {c.next_master, c.next_exp_avg, c.next_exp_avg_sq, gr.next_pshard})
            if (id != 0) store_->discard_contents(id);
        c.speculated = false;
      }
    refresh_params();
    return false;
  }
  const double coef = clip_coefficient(norm);
  // Averaging, clipping and the loss scale, applied by the optimizer as it reads the gradient.
  const float grad_scale =
      static_cast<float>(coef / (static_cast<double>(world_) * opts_.gradient_accumulation_steps * scale_used));
  scaler_.update(false);
  stats_.loss_scale = scaler_.scale();
  ++step_count_;

  const double t_opt = device_.now();
  stats_.optimizer_wait_s = 0;
  if (!speculated.empty()) {
    const bool valid = speculation_commits(norm);  // the norm is finite here
    bool shards_swapped = false;
    for (const Update& u : speculated) {
      Chunk& c = *u.c;
      c.speculated = false;
      if (valid) {
        std::swap(c.master, c.next_master);
        std::swap(c.exp_avg, c.next_exp_avg);
        std::swap(c.exp_avg_sq, c.next_exp_avg_sq);
        store_->discard_contents(c.grad);
      }
      // The set not taken is dead: the next speculation overwrites it whole.
      for (TensorId id : {c.next_master, c.next_exp_avg, c.next_exp_avg_sq})
        if (id != 0) store_->discard_contents(id);
    }
    // Where the shard is the master weights, the group's next shard holds all its
    // sub-groups' new master weights (every one speculative: the layout's rule). The list
    // is in group order: each group once, at its first sub-group.
    for (size_t i = 0; i < speculated.size(); ++i) {
      Group& gr = *speculated[i].gr;
      if ((i > 0 && speculated[i - 1].gr == &gr) || !gr.master_in_shard || gr.next_pshard == 0) continue;
      if (valid) {
        std::swap(gr.pshard, gr.next_pshard);
        shards_swapped = true;
      }
      store_->discard_contents(gr.next_pshard);
    }
    // The store's eviction order names the parameter shards the next step reads.
    if (shards_swapped && !schedule_.empty()) adopt_schedule(schedule_);
    if (valid) {
      ++stats_.speculation_commits;
    } else {
      ++stats_.speculation_rollbacks;
      plain.insert(plain.begin(), speculated.begin(), speculated.end());  // stepped again, in order
      std::stable_sort(plain.begin(), plain.end(), [&](const Update& a, const Update& b) {
        return a.gr != b.gr ? a.gr < b.gr : a.c->offset < b.c->offset;
      });
    }
  }
  update(plain, grad_scale, false);
  stats_.optimizer_s = device_.now() - t_opt;
  refresh_params();
  return true;
}

double ZeroEngine::clip_coefficient(double norm) const {
  return opts_.gradient_clipping > 0 ? std::min(1.0, opts_.gradient_clipping / (norm + 1e-6)) : 1.0;
}

bool ZeroEngine::speculation_commits(double norm) const {
  // The step the speculation assumed is the step to take: a finite gradient, no clipping
  // (the same gradient scale to the bit) and the learning rate it used.
  return std::isfinite(norm) && clip_coefficient(norm) == 1.0 && adam_->config().lr == spec_lr_;
}

void ZeroEngine::free_dead_kept_grads(double norm) {
  if (!opts_.speculative) return;
  if (!speculation_commits(norm)) return;
  // The gradients kept for a rollback are dead: let them go now, unwritten, so that the
  // lane's last groups and the states of the groups stepped plainly find room without
  // writing them home first. Those the lane still reads go at the commit.
  std::vector<const Chunk*> on_lane;
  for (const LaneRecord& r : lane_inflight_)
    if (r.c) on_lane.push_back(r.c);
  for (Group& gr : groups_)
    for (Chunk& c : gr.chunks)
      if (c.speculated && std::find(on_lane.begin(), on_lane.end(), &c) == on_lane.end()) {
        store_->discard_contents(c.grad);
        ++stats_.kept_grads_freed_early;
      }
}

void ZeroEngine::prefetch_first_states(const Group& gr) {
  const Tier t = opt_compute_tier_;
  if (gr.opt_on_device || t == gr.opt_home) return;  // stepped where they live
  for (const Chunk& c : gr.chunks) {
    if (!c.has_next || c.speculated) continue;  // stepped plainly, or already
    ++stats_.early_state_fetches;
    // A hint only (update_on_host fetches them when it steps them): it takes room the
    // tier has or can free without writing anything home. Making room by writing out
    // the gradients kept for a rollback would write data that step() most often finds
    // dead (at the end of backward, with the last group's states).
    bool placed = true;
    for (TensorId id : {c.master, c.exp_avg, c.exp_avg_sq}) placed = (id == 0 || store_->prefetch(id, t)) && placed;
    if (gr.master_in_shard) placed = store_->prefetch(gr.pshard, t) && placed;  // its master weights
    if (!placed) ++stats_.early_state_fetches_skipped;
    return;  // the first one; update_on_host fetches each next one while stepping the one before
  }
}

void ZeroEngine::speculate_group(int g) {
  Group& gr = groups_.at(g);
  if (gr.holders > 0) return;  // still in use by the model: stepped at step()
  std::vector<Update> items;
  for (Chunk& c : gr.chunks)
    if (c.has_next && !c.speculated) items.push_back({&gr, &c});
  if (items.empty()) return;
  // The step the speculation assumes: t + 1, no clipping, this learning rate.
  bool first = true;
  for (const Group& o : groups_)
    for (const Chunk& c : o.chunks) first = first && !c.speculated;
  if (first) spec_lr_ = adam_->config().lr;
  if (adam_->config().lr != spec_lr_) return;
  if (lane_) {
    // The host's sub-groups go to the lane; the GPU optimizer's (offload_optimizer.ratio)
    // are stepped now, on its stream.
    std::vector<Update> on_device;
    size_t mine = 0;
    for (const Update& u : items) mine += u.gr->opt_on_device ? 0 : 1;
    for (const Update& u : items) {
      if (u.gr->opt_on_device)
        on_device.push_back(u);
      else
        lane_backlog_.push_back({u, step_count_ + 1, unclipped_grad_scale(), mine == gr.chunks.size()});
    }
    items = std::move(on_device);
    if (items.empty()) return;
  }
  const int64_t saved = step_count_;
  ++step_count_;
  try {
    update(items, unclipped_grad_scale(), true);
  } catch (...) {
    step_count_ = saved;
    throw;
  }
  step_count_ = saved;
}

// ---------------------------------------------------------------------------------------
// The optimizer lane (EngineOptions::speculation_lane).

namespace {
// Whether e has completed by the calling thread's now: in real time on cpu and cuda, in
// virtual time on sim (where every event is complete in real time).
bool done_by_now(const Event& e, const Device& d) {
  if (e.impl() && e.impl()->virtual_time() >= 0) return e.impl()->virtual_time() <= d.now();
  return e.ready();
}
}  // namespace

void ZeroEngine::lane_pump() {
  while (!lane_inflight_.empty() && done_by_now(lane_inflight_.front().done, device_)) lane_retire_one();
  while (!lane_backlog_.empty() && lane_running_ < kLaneDepth) {
    const LaneItem it = lane_backlog_.front();
    lane_backlog_.pop_front();
    lane_submit(it);
  }
}

void ZeroEngine::lane_submit(const LaneItem& it) {
  Group& gr = *it.u.gr;
  Chunk& c = *it.u.c;
  const Tier t = opt_compute_tier_;
  lane_submitting_ = true;  // the open group's shard stays while its tensors are acquired
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done_submitting{lane_submitting_};
  if (lane_open_ != &gr) {
    lane_close_group();
    // Overwritten whole only the first time: a group reopened (after its shard was let go
    // for room) keeps what the lane wrote into it. Where the shard is the master weights
    // the lane writes the group's next shard and reads the shard.
    const bool reopened = std::find(lane_opened_.begin(), lane_opened_.end(), &gr) != lane_opened_.end();
    const TensorId written = gr.master_in_shard ? gr.next_pshard : gr.pshard;
    lane_params_ = it.whole && !reopened ? store_->acquire_for_overwrite(written, t) : store_->acquire(written, t);
    lane_masters_ = gr.master_in_shard ? store_->acquire(gr.pshard, t) : Acquired{};
    lane_open_ = &gr;
    if (!reopened) lane_opened_.push_back(&gr);
    lane_->wait(lane_params_.ready);
    if (gr.master_in_shard) lane_->wait(lane_masters_.ready);
  }
  // The next one's states start on their way while this one is stepped.
  if (!lane_backlog_.empty()) fetch_update_states(*lane_backlog_.front().u.gr, *lane_backlog_.front().u.c, t);
  UpdateTensors u = acquire_for_update(c, t, true);
  if (gr.master_in_shard) {
    u.m.data = at(lane_masters_.data, c.offset, 4);
    u.out[0].data = at(lane_params_.data, c.offset, 4);
  }
  for (const Acquired* x : {&u.m, &u.a, &u.v, &u.gd, &u.out[0], &u.out[1], &u.out[2]}) lane_->wait(x->ready);
  const HalfKind kind = half_kind(work_t_);
  // The working copy goes straight into the parameter shard: in 16 bits from the fused
  // pass, in fp32 copied after it; none where the shard is the master weights (the Next
  // set becomes it at the commit).
  void* working = gr.master_in_shard ? nullptr : at(lane_params_.data, c.offset, wb_);
  const AdamGrads g{u.gd.data, grad_t_, it.grad_scale};
  lane_->host_task([this, m = u.m.data, a = u.a.data, v = u.v.data, mo = u.out[0].data, ao = u.out[1].data,
                    vo = u.out[2].data, g, step = it.t, &gr, &c, working, kind, bytes = update_bytes(gr, c)] {
    const double t0 = device_.now();
    device_.host_compute(bytes, [&] {
      adam_->step_into(step, static_cast<const float*>(m), static_cast<const float*>(a),
                       static_cast<const float*>(v), g, static_cast<float*>(mo), static_cast<float*>(ao),
                       static_cast<float*>(vo), c.n, kind == HalfKind::None ? nullptr : working, kind);
      if (kind == HalfKind::None && working) std::memcpy(working, mo, c.n * 4);
    });
    if (trace::Recorder* r = trace::active())
      r->record("optimizer lane",
                "adam (speculative, lane) " + gr.spec.name + " [" + std::to_string(c.offset) + ", " +
                    std::to_string(c.offset + c.n) + ")",
                t0, device_.now());
  });
  lane_inflight_.push_back({&gr, &c, lane_->record()});
  ++lane_running_;
  ++stats_.lane_sub_groups;
  c.speculated = true;  // its Next set is being written; step() validates it
  lane_last_ = &gr;
}

void ZeroEngine::lane_close_group() {
  if (!lane_open_) return;
  lane_inflight_.push_back({lane_open_, nullptr, lane_->record()});
  lane_open_ = nullptr;
}

void ZeroEngine::lane_retire_one() {
  LaneRecord r = lane_inflight_.front();
  lane_inflight_.pop_front();
  const double t0 = device_.now();
  r.done.wait();  // rethrows a failed update (a failed fetch of its states)
  if (const double t1 = device_.now(); t1 > t0) {
    spec_wait_ += t1 - t0;  // the model's thread waited for the lane
    if (trace::Recorder* rec = trace::active()) rec->record("wait", "wait optimizer lane", t0, t1);
  }
  const Tier t = opt_compute_tier_;
  if (r.c) {
    --lane_running_;
    // release_stepped marks the sub-group speculated, as lane_submit already did.
    release_stepped(*r.gr, *r.c, t, true);
  } else if (r.gr->master_in_shard) {
    store_->release(r.gr->next_pshard, t, Access::Write);
    store_->release(r.gr->pshard, t);
    for (TensorId id : {r.gr->next_pshard, r.gr->pshard})
      if (opts_.param_home != t) store_->drop(id, t);
  } else {
    store_->release(r.gr->pshard, t, Access::Write);
    if (opts_.param_home != t) store_->drop(r.gr->pshard, t);
  }
}

void ZeroEngine::lane_finish() {
  if (!lane_) return;
  // A group begun is completed, so that a parameter shard taken for overwrite is written
  // whole; the groups not begun are stepped plainly at step().
  while (!lane_backlog_.empty() && lane_backlog_.front().u.gr == lane_last_) {
    if (lane_running_ >= kLaneDepth) {
      lane_retire_one();
      continue;
    }
    const LaneItem it = lane_backlog_.front();
    lane_backlog_.pop_front();
    lane_submit(it);
  }
  lane_backlog_.clear();
  lane_close_group();
  while (!lane_inflight_.empty()) lane_retire_one();
  lane_last_ = nullptr;
  lane_opened_.clear();
}

bool ZeroEngine::lane_make_room() {
  // Only the model's thread touches the lane's records; another thread's placement fails
  // as it would have.
  if (std::this_thread::get_id() != owner_ || (lane_inflight_.empty() && (!lane_open_ || lane_submitting_)))
    return false;
  ++stats_.lane_waits_for_room;
  if (!lane_submitting_) lane_close_group();
  while (!lane_inflight_.empty()) lane_retire_one();
  return true;
}

// The GPU optimizer: the same update as the host's below, each sub-group one
// Stream::adam_step on the optimizer stream over its states in device memory
// (math::adam_update, so the bits are CpuAdam's). launch_on_device queues a group's
// sub-groups together and returns what finish_on_device waits for before releasing what
// they read and write; CPU Adam steps the other groups in between (offload_optimizer.ratio).
std::vector<ZeroEngine::DeviceUpdate> ZeroEngine::launch_on_device(const std::vector<Update>& items, float grad_scale,
                                                                    bool speculative) {
  const Tier t = Tier::Device;
  Stream& s = *opt_stream_;
  const math::AdamStepScalars sc = adam_->scalars(step_count_);
  const DType half_t = half_kind(work_t_) == HalfKind::None ? DType::F32 : work_t_;
  std::vector<DeviceUpdate> pending;
  for (size_t i = 0; i < items.size();) {
    Group& gr = *items[i].gr;
    size_t end = i;
    while (end < items.size() && items[end].gr == &gr) ++end;
    const bool whole = end - i == gr.chunks.size();
    // The GPU optimizer's groups have master weights of their own (the layout's rule).
    STRATA_CHECK(!gr.master_in_shard, "a group whose shard is its master weights on the GPU optimizer");
    Acquired params = opts_.stage != 3 ? store_->acquire(gr.full, t)
                      : whole          ? store_->acquire_for_overwrite(gr.pshard, t)
                                       : store_->acquire(gr.pshard, t);
    s.wait(params.ready);
    DeviceUpdate u{&gr, {}, {}, speculative, device_.now()};
    for (size_t k = i; k < end; ++k) {
      Chunk& c = *items[k].c;
      u.chunks.push_back(&c);
      Acquired m = store_->acquire(c.master, t);
      Acquired a = store_->acquire(c.exp_avg, t);
      Acquired v = store_->acquire(c.exp_avg_sq, t);
      Acquired gd = store_->acquire(c.grad, t);
      Acquired out[3] = {m, a, v};
      if (speculative) {
        out[0] = store_->acquire_for_overwrite(c.next_master, t);
        out[1] = store_->acquire_for_overwrite(c.next_exp_avg, t);
        out[2] = store_->acquire_for_overwrite(c.next_exp_avg_sq, t);
      }
      for (Acquired* x : {&m, &a, &v, &gd, &out[0], &out[1], &out[2]}) s.wait(x->ready);
      // The working copy: in the parameter shard (stage 3) or this rank's slice of the
      // replicated parameters (stages 1 and 2), both in device memory.
      void* working = opts_.stage == 3 ? at(params.data, c.offset, wb_)
                                       : at(params.data, static_cast<uint64_t>(rank_) * gr.shard + c.offset, wb_);
      AdamStepArgs args;
      args.s = sc;
      args.p_in = static_cast<const float*>(m.data);
      args.m_in = static_cast<const float*>(a.data);
      args.v_in = static_cast<const float*>(v.data);
      args.grad = gd.data;
      args.grad_t = grad_t_;
      args.grad_scale = grad_scale;
      args.p_out = static_cast<float*>(out[0].data);
      args.m_out = static_cast<float*>(out[1].data);
      args.v_out = static_cast<float*>(out[2].data);
      args.half_out = half_t == DType::F32 ? nullptr : working;
      args.half_t = half_t;
      args.n = c.n;
      s.adam_step(args);
      if (half_t == DType::F32) s.copy_async(working, out[0].data, c.n * 4);
    }
    u.done = s.record();
    pending.push_back(std::move(u));
    // A parameter shard brought to the device from a host home is sent back before the
    // next group's comes, so that the device holds one at a time.
    if (opts_.stage == 3 && opts_.param_home != t) finish_on_device(pending);
    i = end;
  }
  return pending;
}

void ZeroEngine::finish_on_device(std::vector<DeviceUpdate>& pending) {
  const Tier t = Tier::Device;
  for (DeviceUpdate& u : pending) {
    u.done.wait();
    if (trace::Recorder* r = trace::active())
      r->record("optimizer",
                std::string(u.speculative ? "adam on the device (speculative) " : "adam on the device ") +
                    u.gr->spec.name,
                u.t0, device_.now());
    for (Chunk* c : u.chunks) release_stepped(*u.gr, *c, t, u.speculative);
    const TensorId pid = opts_.stage == 3 ? u.gr->pshard : u.gr->full;
    store_->release(pid, t, Access::Write);
    if (opts_.stage == 3 && opts_.param_home != t) store_->drop(pid, t);  // towards its home
  }
  pending.clear();
}

void ZeroEngine::update(const std::vector<Update>& items, float grad_scale, bool speculative) {
  // The groups the GPU optimizer steps are queued first; CPU Adam steps the others while
  // the GPU works (offload_optimizer.ratio), and the GPU's are finished last.
  std::vector<Update> on_device, on_host;
  for (const Update& u : items) (u.gr->opt_on_device ? on_device : on_host).push_back(u);
  std::vector<DeviceUpdate> pending;
  if (!on_device.empty()) pending = launch_on_device(on_device, grad_scale, speculative);
  try {
    if (!on_host.empty()) update_on_host(on_host, grad_scale, speculative);
  } catch (...) {
    try {
      finish_on_device(pending);
    } catch (...) {
    }
    throw;
  }
  finish_on_device(pending);
}

void ZeroEngine::fetch_update_states(const Group& gr, const Chunk& c, Tier t) {
  if (t == gr.opt_home) return;
  for (TensorId id : {c.master, c.exp_avg, c.exp_avg_sq, c.grad})
    if (id != 0) store_->fetch(id, t);
  if (gr.master_in_shard && c.offset == 0) store_->fetch(gr.pshard, t);  // the group's master weights
}

ZeroEngine::UpdateTensors ZeroEngine::acquire_for_update(Chunk& c, Tier t, bool speculative) {
  UpdateTensors u;
  // master_in_shard: no master of its own (master 0); the caller points m and out[0] into
  // the group's shard and next shard.
  if (c.master != 0) u.m = store_->acquire(c.master, t);
  u.a = store_->acquire(c.exp_avg, t);
  u.v = store_->acquire(c.exp_avg_sq, t);
  u.gd = store_->acquire(c.grad, t);
  u.out[0] = u.m, u.out[1] = u.a, u.out[2] = u.v;
  if (speculative) {
    u.out[0] = c.next_master != 0 ? store_->acquire_for_overwrite(c.next_master, t) : Acquired{};
    u.out[1] = store_->acquire_for_overwrite(c.next_exp_avg, t);
    u.out[2] = store_->acquire_for_overwrite(c.next_exp_avg_sq, t);
  }
  return u;
}

double ZeroEngine::update_bytes(const Group& gr, const Chunk& c) const {
  // The same bytes in place or out of place (the Next set is written, not read): the
  // states and gradient, and the working copy written in 16 bits, or copied in fp32 into
  // a stage-3 shard that is not the master weights itself.
  const HalfKind kind = half_kind(work_t_);
  const bool copied = opts_.stage == 3 && !gr.master_in_shard;
  return (24.0 + gb_) * c.n + (kind != HalfKind::None ? wb_ * c.n : copied ? 8.0 * c.n : 0.0);
}

void ZeroEngine::update_on_host(const std::vector<Update>& items, float grad_scale, bool speculative) {
  const Tier t = opt_compute_tier_;
  double& waited_s = speculative ? spec_wait_ : stats_.optimizer_wait_s;
  // The next sub-group's states are fetched while this one is updated and the previous
  // one is written back.
  auto prefetch = [&](size_t i) {
    if (i < items.size()) fetch_update_states(*items[i].gr, *items[i].c, t);
  };
  prefetch(0);
  Group* open_group = nullptr;
  Acquired params{};
  Acquired next_params{};  // master_in_shard, speculative: the group's next shard
  std::vector<std::byte> half_copy;  // stages 1, 2 in 16 bits: a sub-group's working copy
  auto close_group = [&] {
    if (!open_group) return;
    Group& gr = *open_group;
    if (gr.master_in_shard) {
      // The shard is the master weights: stepped in place, or read beside the next shard.
      store_->release(gr.pshard, t, speculative ? Access::Read : Access::Write);
      if (speculative) store_->release(gr.next_pshard, t, Access::Write);
      if (opts_.param_home != t)
        for (TensorId id : {gr.pshard, speculative ? gr.next_pshard : TensorId{0}})
          if (id != 0) store_->drop(id, t);  // towards NVMe
    } else if (opts_.stage == 3) {
      store_->release(gr.pshard, t, Access::Write);
      if (opts_.param_home != t) store_->drop(gr.pshard, t);  // to device or towards NVMe
    } else {
      Event copied = reduce_stream_->record();
      store_->release(gr.full, Tier::Device, Access::Write, copied);
    }
    open_group = nullptr;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    Group& gr = *items[i].gr;
    Chunk& c = *items[i].c;
    if (open_group != &gr) {
      close_group();
      open_group = &gr;
      // Stage 3 overwrites the whole parameter shard when every sub-group of the group is
      // stepped here; otherwise the others' values are kept.
      size_t mine = 0;
      for (size_t j = i; j < items.size() && items[j].gr == &gr; ++j) ++mine;
      const bool whole = mine == gr.chunks.size();
      // Where the shard is the master weights it is read (and stepped in place, or into
      // the next shard when speculative).
      params = opts_.stage != 3                  ? store_->acquire(gr.full, Tier::Device)
               : whole && !gr.master_in_shard ? store_->acquire_for_overwrite(gr.pshard, t)
                                                 : store_->acquire(gr.pshard, t);
      next_params = !gr.master_in_shard || !speculative ? Acquired{}
                    : whole                             ? store_->acquire_for_overwrite(gr.next_pshard, t)
                                                        : store_->acquire(gr.next_pshard, t);
      const double t0 = device_.now();
      params.ready.wait();
      next_params.ready.wait();
      const double t1 = device_.now();
      waited_s += t1 - t0;
      if (trace::Recorder* r = trace::active(); r && t1 > t0) r->record("wait", "wait params " + gr.spec.name, t0, t1);
    }
    prefetch(i + 1);
    UpdateTensors u = acquire_for_update(c, t, speculative);
    if (gr.master_in_shard) {
      u.m.data = at(params.data, c.offset, 4);
      u.out[0].data = speculative ? at(next_params.data, c.offset, 4) : u.m.data;
    }
    Acquired &m = u.m, &a = u.a, &v = u.v, &gd = u.gd;
    Acquired* out = u.out;
    const double t0 = device_.now();
    for (Acquired* x : {&m, &a, &v, &gd, &out[0], &out[1], &out[2]}) x->ready.wait();
    const double t1 = device_.now();
    waited_s += t1 - t0;
    // One fused pass: read the weight, both moments and the (scaled) gradient, write the
    // weight and moments and, in 16 bits, the working copy; fp32 copies it after.
    const HalfKind kind = half_kind(work_t_);
    // Where the 16-bit working copy goes: the parameter shard (stage 3, host memory in
    // the optimizer's tier) or a host buffer that a stream copies into the replicated
    // parameters (stages 1 and 2, device memory).
    if (kind != HalfKind::None && opts_.stage != 3) half_copy.resize(c.n * wb_);
    void* half_out = kind == HalfKind::None ? nullptr
                     : opts_.stage == 3     ? at(params.data, c.offset, wb_)
                                            : half_copy.data();
    auto* mo = static_cast<float*>(out[0].data);
    const double bytes = update_bytes(gr, c);
    device_.host_compute(bytes, [&] {
      adam_->step_into(step_count_, static_cast<const float*>(m.data), static_cast<const float*>(a.data),
                       static_cast<const float*>(v.data), AdamGrads{gd.data, grad_t_, grad_scale}, mo,
                       static_cast<float*>(out[1].data), static_cast<float*>(out[2].data), c.n, half_out, kind);
      if (opts_.stage == 3 && kind == HalfKind::None && !gr.master_in_shard)
        std::memcpy(at(params.data, c.offset, 4), mo, c.n * 4);
    });
    if (trace::Recorder* r = trace::active()) {
      if (t1 > t0) r->record("wait", "wait optimizer states " + gr.spec.name, t0, t1);
      r->record("optimizer",
                std::string(speculative ? "adam (speculative) " : "adam ") + gr.spec.name + " [" +
                    std::to_string(c.offset) + ", " + std::to_string(c.offset + c.n) + ")",
                t1, device_.now());
    }
    if (opts_.stage != 3) {
      void* full = at(params.data, static_cast<uint64_t>(rank_) * gr.shard + c.offset, wb_);
      reduce_stream_->copy_async(full, kind == HalfKind::None ? static_cast<void*>(mo) : half_copy.data(), c.n * wb_);
      reduce_stream_->synchronize();  // the master copy may move once released
    }
    release_stepped(gr, c, t, speculative);
  }
  close_group();
}

void ZeroEngine::release_stepped(const Group& gr, Chunk& c, Tier t, bool speculative) {
  // Away from home, each copy goes back behind the next update's work (write-back).
  auto done = [&](TensorId id, Access access) {
    if (id == 0) return;  // master_in_shard: the group's shard, released with the group
    store_->release(id, t, access);
    if (t != gr.opt_home) store_->drop(id, t);
  };
  if (speculative) {
    // The committed set is only read: dropping its copy writes nothing. The gradient is
    // kept until step() validates (it is stepped again if the speculation is undone).
    for (TensorId id : {c.master, c.exp_avg, c.exp_avg_sq}) done(id, Access::Read);
    for (TensorId id : {c.next_master, c.next_exp_avg, c.next_exp_avg_sq}) done(id, Access::Write);
    store_->release(c.grad, t);
    c.speculated = true;
  } else {
    for (TensorId id : {c.master, c.exp_avg, c.exp_avg_sq}) done(id, Access::Write);
    // The gradient is dead after the update: the next step's first micro-step overwrites
    // it, so no copy of it is written anywhere (with optimizer states on NVMe this was a
    // write of 4 (or 2) bytes per parameter per step that nobody read).
    store_->release(c.grad, t);
    store_->discard_contents(c.grad);
  }
}

void ZeroEngine::restore_params(const std::vector<Update>& items) {
  const Tier t = opt_host_tier_;
  for (const Update& u : items) {
    Group& gr = *u.gr;
    Chunk& c = *u.c;
    if (gr.master_in_shard) continue;  // the speculation wrote the Next set only
    Acquired m = store_->acquire(c.master, t);
    Acquired p = opts_.stage == 3 ? store_->acquire(gr.pshard, t) : store_->acquire(gr.full, Tier::Device);
    when_all({m.ready, p.ready}).wait();
    std::vector<std::byte> working(opts_.stage == 3 ? 0 : c.n * wb_);
    device_.host_compute((4.0 + wb_) * c.n, [&] {
      if (opts_.stage == 3)
        convert_from_f32(at(p.data, c.offset, wb_), work_t_, static_cast<const float*>(m.data), c.n);
      else
        convert_from_f32(working.data(), work_t_, static_cast<const float*>(m.data), c.n);
    });
    if (opts_.stage != 3) {
      reduce_stream_->copy_async(at(p.data, static_cast<uint64_t>(rank_) * gr.shard + c.offset, wb_), working.data(),
                                 working.size());
      reduce_stream_->synchronize();
    }
    store_->release(c.master, t);
    if (t != gr.opt_home) store_->drop(c.master, t);
    if (opts_.stage == 3) {
      store_->release(gr.pshard, t, Access::Write);
      if (opts_.param_home != t) store_->drop(gr.pshard, t);
    } else {
      store_->release(gr.full, Tier::Device, Access::Write);
    }
  }
}

void ZeroEngine::refresh_params() {
  if (opts_.stage == 3) {
    // Gathered copies hold the old values.
    for (Group& gr : groups_) drop_full(gr);
    return;
  }
  // Replicated parameters: every rank updated its slice; gather the rest.
  for (Group& gr : groups_) {
    Acquired f = store_->acquire(gr.full, Tier::Device);
    const void* mine = at(f.data, static_cast<uint64_t>(rank_) * gr.shard, wb_);
    Event ev = comm_.all_gather(view(mine, gr.shard, work_t_), view_mut(f.data, gr.padded, work_t_), f.ready);
    ev.wait();
    store_->release(gr.full, Tier::Device, Access::Write);
  }
}

EngineStats ZeroEngine::stats() const {
  EngineStats s = stats_;
  s.store = store_->stats();
  return s;
}

// ---------------------------------------------------------------------------------------
// Whole-group and shard access for tests, export and checkpoints.

std::vector<float> ZeroEngine::gather_full_params(int g) {
  Group& gr = groups_.at(g);
  std::vector<float> out(gr.spec.numel);
  // The full parameters are device memory, which host code may not address (cuda): a
  // stream copies them out on every backend, then they are widened on the host.
  const auto copy_out = [&](const void* src) {
    std::vector<std::byte> raw(gr.spec.numel * wb_);
    reduce_stream_->copy_async(raw.data(), src, raw.size());
    reduce_stream_->synchronize();
    convert_to_f32(out.data(), raw.data(), work_t_, gr.spec.numel);
  };
  if (opts_.stage == 3) {
    const bool was_ready = gr.state != Group::Full::Released;
    start_gather(g, false);
    wait_gathered(gr);
    copy_out(gr.full_ptr);
    if (!was_ready && !gr.persistent) drop_full(gr);
  } else {
    Acquired f = store_->acquire(gr.full, Tier::Device);
    f.ready.wait();
    copy_out(f.data);
    store_->release(gr.full, Tier::Device);
  }
  return out;
}

void ZeroEngine::read_optimizer_shard(int g, float* master, float* exp_avg, float* exp_avg_sq) {
  Group& gr = groups_.at(g);
  const Tier t = opt_host_tier_;
  if (gr.master_in_shard) {  // the parameter shard is the master weights
    Acquired p = store_->acquire(gr.pshard, t);
    p.ready.wait();
    device_.host_compute(8.0 * gr.shard, [&] { std::memcpy(master, p.data, gr.shard * 4); });
    store_->release(gr.pshard, t);
    if (t != opts_.param_home) store_->drop(gr.pshard, t).wait();
  }
  for (Chunk& c : gr.chunks) {
    TensorId ids[3] = {c.master, c.exp_avg, c.exp_avg_sq};
    float* outs[3] = {master, exp_avg, exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (ids[k] == 0) continue;  // master_in_shard: read above
      Acquired a = store_->acquire(ids[k], t);
      a.ready.wait();
      device_.host_compute(8.0 * c.n, [&] { std::memcpy(outs[k] + c.offset, a.data, c.n * 4); });
      store_->release(ids[k], t);
      if (t != gr.opt_home) store_->drop(ids[k], t).wait();
    }
  }
}

void ZeroEngine::write_optimizer_shard(int g, const float* master, const float* exp_avg, const float* exp_avg_sq,
                                       int64_t step_count) {
  Group& gr = groups_.at(g);
  const Tier t = opt_host_tier_;
  for (Chunk& c : gr.chunks) {
    TensorId ids[3] = {c.master, c.exp_avg, c.exp_avg_sq};
    const float* ins[3] = {master, exp_avg, exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (ids[k] == 0) continue;  // master_in_shard: the parameter shard, written below
      Acquired a = store_->acquire_for_overwrite(ids[k], t);
      a.ready.wait();
      device_.host_compute(8.0 * c.n, [&] { std::memcpy(a.data, ins[k] + c.offset, c.n * 4); });
      store_->release(ids[k], t, Access::Write);
      if (t != gr.opt_home) store_->drop(ids[k], t).wait();
    }
  }
  // The working parameters follow the master weights (or are them: master_in_shard).
  if (opts_.stage == 3) {
    Acquired p = store_->acquire_for_overwrite(gr.pshard, Tier::Pinned);
    p.ready.wait();
    device_.host_compute((4.0 + wb_) * gr.shard, [&] { convert_from_f32(p.data, work_t_, master, gr.shard); });
    store_->release(gr.pshard, Tier::Pinned, Access::Write);
    if (opts_.param_home != Tier::Pinned) store_->drop(gr.pshard, Tier::Pinned).wait();
    drop_full(gr);
  } else {
    Acquired f = store_->acquire(gr.full, Tier::Device);
    f.ready.wait();
    std::vector<std::byte> working(gr.shard * wb_);
    convert_from_f32(working.data(), work_t_, master, gr.shard);
    void* mine = at(f.data, static_cast<uint64_t>(rank_) * gr.shard, wb_);
    reduce_stream_->copy_async(mine, working.data(), working.size());
    Event copied = reduce_stream_->record();
    comm_.all_gather(view(mine, gr.shard, work_t_), view_mut(f.data, gr.padded, work_t_), copied).wait();
    store_->release(gr.full, Tier::Device, Access::Write);
  }
  step_count_ = step_count;
}

}  // namespace strata
