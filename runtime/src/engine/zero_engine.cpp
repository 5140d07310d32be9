#include "strata/runtime/engine/zero_engine.hpp"

#include <algorithm>
#include <cmath>

#include "activation_store.hpp"
#include "engine_state.hpp"
#include "gatherer.hpp"
#include "gradient_reducer.hpp"
#include "optimizer_steppers.hpp"
#include "speculation.hpp"
#include "state_io.hpp"
#include "sub_group_io.hpp"
#include "strata/collectives/topology.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/safe_io.hpp"

namespace strata {

using engine::GroupState;
using engine::SubGroupState;
using engine::Update;

DeviceTraits device_traits(const Device& d) { return {d.host_addressable(), to_string(d.backend())}; }

std::vector<GroupSize> group_sizes(const std::vector<GroupSpec>& groups) {
  std::vector<GroupSize> sizes;
  for (const GroupSpec& g : groups) sizes.push_back({g.name, g.numel, g.frozen});
  return sizes;
}

namespace engine {
void EngineCore::waited(double since, const char* what, const GroupState* g) const {
  const double now = device.now();
  stats.exposed_wait_s += now - since;
  if (trace::Recorder* r = trace::active(); r && now > since)
    r->record("wait", g ? std::string(what) + " " + g->spec.name : std::string(what), since, now);
}
}  // namespace engine

namespace {

std::unique_ptr<CpuAdam> make_adam(const EngineOptions& o) {
  CpuAdamOptions ao;
  ao.threads = o.optimizer_threads;
  math::AdamHyperparams hp;
  hp.lr = o.optimizer.lr;
  hp.beta1 = o.optimizer.beta1;
  hp.beta2 = o.optimizer.beta2;
  hp.eps = o.optimizer.eps;
  hp.weight_decay = o.optimizer.weight_decay;
  hp.variant = o.optimizer.kind == OptimizerKind::AdamW ? AdamVariant::AdamW : AdamVariant::Adam;
  return std::make_unique<CpuAdam>(hp, ao);
}

// qgZ: the nodes its reduction crosses, from the node layout (collective over comm), into
// the options the layout is resolved from. Refused where the quantization cannot run (its
// work is host code over device buffers) or the communicator cannot be split.
EngineOptions with_gradient_nodes(EngineOptions o, coll::Communicator& comm, Device& device,
                                  coll::Communicator* replicas) {
  if (o.quantized_gradients_block <= 0) return o;
  const std::string key = "zero_optimization.zero_quantized_gradients";
  if (!device.host_addressable() || device.backend() == Backend::Sim)
    throw ConfigError(key + " runs on the cpu backend only for now (its quantization runs on the host, and the " +
                      to_string(device.backend()) +
                      " backend's gradients are not host memory): remove zero_quantized_gradients, or set "
                      "strata.backend to \"cpu\"");
  if (comm.backend() != coll::CommBackend::Mpi && comm.backend() != coll::CommBackend::Self)
    throw ConfigError(key + " splits the engine's communicator by node, and a " + to_string(comm.backend()) +
                      " one cannot be split: use the host communicator (drop strata.device_communicator = "
                      "\"staged\"), or remove zero_quantized_gradients");
  if (replicas != nullptr && replicas->size() > 1)
    throw ConfigError(key + " quantizes a reduce-scatter over every rank, and mics_shard_size reduces within groups "
                      "then all-reduces across them: remove one of them");
  o.gradient_nodes = coll::resolve_topology(comm, o.ranks_per_node).nodes;
  return o;
}

}  // namespace

ZeroEngine::ZeroEngine(Device& device, coll::Communicator& comm, coll::Communicator& host_comm, EngineOptions opts,
                       std::vector<GroupSpec> groups, EngineAblation ablation, coll::Communicator* replicas,
                       coll::Communicator* hpz)
    : device_(device), comm_(comm), host_comm_(host_comm),
      resolved_(resolve(with_gradient_nodes(std::move(opts), comm, device, replicas), ablation, group_sizes(groups),
                        comm.size(), device_traits(device))),
      opts_(resolved_.options) {
  if (comm_.rank() == 0 && resolved_.checkpoints_moved_to_nvme)
    log::info("activation_checkpointing.cpu_checkpointing: the pinned budget has no room for the " +
              std::to_string(opts_.checkpoints.count) + " checkpoints beside the states; they go to NVMe");
  const ShardLayout& L = resolved_.layout;
  if (const uint64_t fallback = resolved_.speculation_fallback_sub_groups; fallback > 0)
    log::warn("strata.speculative_optimizer: the budgets leave room for a second set of optimizer states for " +
              std::to_string(L.sub_group_count - fallback) + " of " + std::to_string(L.sub_group_count) +
              " sub-groups; the others step after the backward pass. Raise the budget of the optimizer's tier "
              "(zero_optimization.offload_optimizer.device) to speculate on all of them.");
  work_t_ = L.dtype(StateRole::GatherBuffer);
  if (opts_.precision == DType::F16) {  // fp16 always scales: with DeepSpeed's defaults unless configured
    Fp16Config f = opts_.fp16;
    f.enabled = true;
    scaler_ = LossScaler(f);
  }
  stats_.loss_scale = scaler_.scale();
  stats_.speculation_fallback_sub_groups = resolved_.speculation_fallback_sub_groups;
  stats_.grads_kept_on_device_bytes = resolved_.kept_grad_bytes;
  build_groups(std::move(groups));

  store_ = std::make_unique<TieredStore>(device_, opts_.store);
  adam_ = make_adam(opts_);
  reduce_stream_ = device_.create_stream("reduce");
  const DType grad_t = L.dtype(StateRole::Grad);
  core_.reset(new engine::EngineCore{device_, comm_, host_comm_, resolved_, opts_, *store_, *adam_, *reduce_stream_,
                                     groups_, stats_, work_t_, grad_t, dtype_size(work_t_), dtype_size(grad_t),
                                     comm_.size(), comm_.rank()});
  if (replicas != nullptr && replicas->size() > 1) {
    core_->replicas = replicas;
    core_->data_parallel = comm_.size() * replicas->size();
  } else {
    core_->data_parallel = comm_.size();
  }
  if (opts_.quantized_weights_block > 0 && (!device_.host_addressable() || device_.backend() == Backend::Sim))
    throw ConfigError(std::string("zero_optimization.zero_quantized_weights runs on the cpu backend only for now (its "
                                  "quantization runs on the host, and the ") +
                      to_string(device_.backend()) +
                      " backend's parameters are not host memory): remove zero_quantized_weights, or set "
                      "strata.backend to \"cpu\"");
  if (opts_.quantized_gradients_block > 0 && qgz_hierarchical(comm_.size(), opts_.gradient_nodes)) {
    // The same layout with_gradient_nodes resolved (collective over comm, as is the split).
    coll::NodeCommunicators nc = coll::split_by_node(comm_, coll::resolve_topology(comm_, opts_.ranks_per_node));
    qgz_node_ = std::move(nc.node);
    qgz_cross_ = std::move(nc.cross);
    core_->qgz_node = qgz_node_.get();
    core_->qgz_cross = qgz_cross_.get();
  }
  if (const int h = opts_.hpz_partition_size; h > 1) {
    if (hpz == nullptr || hpz->size() != h || hpz->rank() != comm_.rank() % h)
      throw ConfigError("zero_optimization.zero_hpz_partition_size " + std::to_string(h) +
                        ": the engine needs the communicator of this rank's " + std::to_string(h) +
                        " consecutive ranks (rank " + std::to_string(comm_.rank()) + " as its rank " +
                        std::to_string(comm_.rank() % h) + "), and " +
                        (hpz == nullptr ? std::string("none was given")
                                        : "was given one of " + std::to_string(hpz->size()) + " ranks with this rank as " +
                                              std::to_string(hpz->rank())) +
                        ": strata train splits it; an embedding trainer passes it or drops the key");
    core_->secondary = hpz;
    core_->secondary_rank = hpz->rank();
  }
  register_tensors();
  gatherer_ = std::make_unique<engine::Gatherer>(*core_);
  reducer_ = engine::GradientReducer::make(*core_);
  steppers_ = std::make_unique<engine::Steppers>(*core_);
  if (opts_.speculative) speculation_ = std::make_unique<engine::Speculation>(*core_, *gatherer_, *steppers_);
  // A trace path that cannot be written is refused now, not after the run.
  if (!opts_.trace_path.empty()) {
    check_output_path(opts_.trace_path, "strata.trace");
    check_output_writable(opts_.trace_path, "strata.trace");
  }
  engine::init_shards(*core_);
  // Last, so that a constructor that throws leaves no recorder active behind it. The
  // trace starts with training; initialisation is not in it.
  if (!opts_.trace_path.empty()) {
    trace_ = std::make_unique<trace::Recorder>(comm_.rank());
    outer_trace_ = trace::set_active(trace_.get());
  }
}

void ZeroEngine::build_groups(std::vector<GroupSpec> groups) {
  groups_.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    GroupState& gr = groups_[g];
    const GroupLayout& gl = resolved_.layout.groups[g];
    gr.spec = std::move(groups[g]);
    gr.padded = gl.padded;
    gr.shard = gl.shard;
    gr.persistent = gl.persistent;
    gr.frozen = gl.frozen;
    gr.optimizer_home = gl.optimizer_home;
    gr.optimizer_on_device = gl.optimizer_home == Tier::Device && resolved_.gpu_optimizer;
    gr.master_in_shard = gl.master_in_shard;
    for (const SubGroup& sg : gl.sub_groups) gr.sub_groups.push_back({sg.offset, sg.n});
  }
}

// Every tensor of the layout into the store, in the layout's order; each id to the field
// of its role.
void ZeroEngine::register_tensors() {
  const ShardLayout& L = resolved_.layout;
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupState& gr = groups_[g];
    for (const StateTensor& t : L.groups[g].tensors) {
      const TensorId id = store_->add(t.spec);
      SubGroupState* sg = t.sub_group >= 0 ? &gr.sub_groups[t.sub_group] : nullptr;
      switch (t.role) {
        case StateRole::GatherBuffer:
        case StateRole::ReplicatedParams: gr.gathered = id; break;
        case StateRole::ParamShard: gr.param_shard = id; break;
        case StateRole::ParamSecondary: gr.param_secondary = id; break;
        case StateRole::QuantizedGather: gr.quantized = id; break;
        case StateRole::GradFull:
          gr.grad_full = id;
          gr.grad_full_scratch = t.spec.scratch;  // not: a device home (ShardStrategy::first_gradient_held)
          break;
        case StateRole::GradAccumulated: gr.grad_accumulated = id; break;
        case StateRole::GradReduced: gr.grad_reduced = id; break;
        case StateRole::QuantizedReduce: gr.quantized_reduce = id; break;
        case StateRole::Master: sg->master = id; break;
        case StateRole::ExpAvg: sg->exp_avg = id; break;
        case StateRole::ExpAvgSq: sg->exp_avg_sq = id; break;
        case StateRole::Grad: sg->grad = id; break;
        case StateRole::MasterNext: (sg ? sg->next_master : gr.next_param_shard) = id; break;
        case StateRole::ExpAvgNext:
          sg->next_exp_avg = id;
          sg->has_next = true;
          break;
        case StateRole::ExpAvgSqNext: sg->next_exp_avg_sq = id; break;
        case StateRole::ActivationCheckpoint: STRATA_CHECK(false, "a checkpoint among a group's tensors"); break;
      }
    }
  }
  if (L.checkpoints.empty()) return;
  std::vector<TensorId> ids;
  for (const StateTensor& t : L.checkpoints) ids.push_back(store_->add(t.spec));
  activations_ = std::make_unique<TieredActivationStore>(
      *store_, device_, std::move(ids), opts_.checkpoints.bytes, opts_.checkpoints.home,
      [this](double since, const std::string& what) { core_->waited(since, what.c_str(), nullptr); });
}

ZeroEngine::~ZeroEngine() {
  try {
    reduce_stream_->synchronize();
  } catch (...) {
  }
  speculation_.reset();  // its lane's work first
  steppers_.reset();     // the GPU optimizer's stream
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

ActivationStore* ZeroEngine::activation_store() { return activations_.get(); }
int ZeroEngine::num_groups() const { return static_cast<int>(groups_.size()); }
uint64_t ZeroEngine::group_numel(int g) const { return groups_.at(g).spec.numel; }
uint64_t ZeroEngine::shard_numel(int g) const { return groups_.at(g).shard; }
const std::string& ZeroEngine::group_name(int g) const { return groups_.at(g).spec.name; }
bool ZeroEngine::group_frozen(int g) const { return groups_.at(g).frozen; }

void ZeroEngine::set_schedule(std::vector<int> order) { gatherer_->set_schedule(std::move(order)); }
const void* ZeroEngine::acquire_params(int g) { return gatherer_->acquire(g); }
void ZeroEngine::release_params(int g) { gatherer_->release(g, Event()); }
void ZeroEngine::release_params_after(int g, const Event& after) { gatherer_->release(g, after); }
void* ZeroEngine::gradient_buffer(int g) { return reducer_->gradient_buffer(g); }

void ZeroEngine::begin_micro_step() {
  if (micro_ + 1 >= opts_.gradient_accumulation_steps)
    throw Error("begin_micro_step: " + std::to_string(opts_.gradient_accumulation_steps) +
                " micro-steps (gradient_accumulation_steps) already ran; call step() first");
  ++micro_;
  if (activations_) activations_->reset();
  gatherer_->begin_micro_step();
}

void ZeroEngine::grads_ready(int g) { grads_ready_after(g, Event()); }

void ZeroEngine::grads_ready_after(int g, const Event& after) {
  const bool last = micro_ == opts_.gradient_accumulation_steps - 1;
  reducer_->grads_ready(g, micro_, last, after);
  if (!speculation_) {
    // Not while the backward pass reads from the disk (parameters or gradients re-read
    // each micro-step): those reads are on its critical path, the states' are not.
    // Each gradient lets one group's worth of states go.
    if (last && resolved_.ablation.plain_state_prefetch && !store_->reading_from_nvme("optimizer")) {
      uint64_t bytes = 0;
      for (const SubGroupState& sg : groups_[g].sub_groups) bytes += engine::state_bytes(groups_[g], sg);
      prefetch_cursor_ = engine::prefetch_states_in_order(*core_, resolved_.optimizer_compute_tier, prefetch_cursor_, bytes);
    }
    return;
  }
  if (last) speculation_->group_reduced(g, step_count_ + 1, unclipped_grad_scale());
  speculation_->pump();
}

void ZeroEngine::set_learning_rate(double lr) {
  STRATA_CHECK(std::isfinite(lr) && lr >= 0.0, "learning rate " + std::to_string(lr));
  if (speculation_) speculation_->finish_lane();  // its updates read the rate as they run
  adam_->set_lr(lr);
}

float ZeroEngine::unclipped_grad_scale() const {
  return static_cast<float>(1.0 / (static_cast<double>(core_->data_parallel) * opts_.gradient_accumulation_steps *
                                   scaler_.scale()));
}

bool ZeroEngine::step() {
  if (micro_ + 1 != opts_.gradient_accumulation_steps)
    throw Error("step() after " + std::to_string(micro_ + 1) + " micro-steps; gradient_accumulation_steps is " +
                std::to_string(opts_.gradient_accumulation_steps));
  for (int g = 0; g < num_groups(); ++g)
    if (gatherer_->held(g) || reducer_->outstanding(g))
      throw Error("step() while group '" + groups_[g].spec.name + "' is still acquired or awaiting its gradient");
  reducer_->finish_reduction();
  // The norm needs only the reductions: known before the lane is done, it says whether
  // the speculation commits while the lane still steps the last groups.
  const double norm = reducer_->global_norm(scaler_.scale());
  stats_.last_grad_norm = norm;
  if (speculation_) {
    speculation_->free_dead_kept_grads(norm);
    speculation_->finish_lane();  // before the validation: what it stepped is speculated like the rest
    stats_.speculation_wait_s = speculation_->take_wait();
    speculation_->end_step();  // the last group(s) are stepped below, knowing the norm
  }
  micro_ = -1;
  prefetch_cursor_ = 0;
  reducer_->end_step();
  ++iterations_;
  std::vector<Update> speculated, plain;
  for (GroupState& gr : groups_)
    for (SubGroupState& sg : gr.sub_groups) (sg.speculated ? speculated : plain).push_back({&gr, &sg});
  stats_.speculated_sub_groups = speculated.size();
  // Every rank has the same norm (all-reduced): all skip together, before any state changes.
  if (!std::isfinite(norm)) return skip_step(speculated);
  const double scale_used = scaler_.scale();
  const double coef = engine::clip_coefficient(opts_.gradient_clipping, norm);
  // Averaging, clipping and the loss scale, applied by the optimizer as it reads the gradient.
  const float grad_scale = static_cast<float>(
      coef / (static_cast<double>(core_->data_parallel) * opts_.gradient_accumulation_steps * scale_used));
  scaler_.update(false);
  stats_.loss_scale = scaler_.scale();
  ++step_count_;

  const double t_opt = device_.now();
  stats_.optimizer_wait_s = 0;
  if (speculation_) plain = speculation_->settle(speculated, std::move(plain), norm);
  steppers_->update(plain, {step_count_, grad_scale, false, &stats_.optimizer_wait_s});
  stats_.optimizer_s = device_.now() - t_opt;
  gatherer_->refresh();
  return true;
}

bool ZeroEngine::skip_step(const std::vector<Update>& speculated) {
  const double scale_used = scaler_.scale();
  ++stats_.skipped_steps;
  if (!speculated.empty()) {
    // The committed states are untouched; the working parameters go back to them.
    ++stats_.speculation_rollbacks;
    speculation_->restore_params(speculated);
  }
  scaler_.update(true);
  if (scaler_.enabled())
    log::info("fp16: gradients overflowed at loss scale " + std::to_string(scale_used) +
              "; step skipped, the scale is now " + std::to_string(scaler_.scale()));
  else
    log::warn("gradient norm is not finite; skipping this optimizer step");
  stats_.loss_scale = scaler_.scale();
  for (GroupState& gr : groups_)  // the skipped gradients are dead too: nothing writes them home
    for (SubGroupState& sg : gr.sub_groups) {
      store_->discard_contents(sg.grad);
      if (sg.speculated)
        for (TensorId id : {sg.next_master, sg.next_exp_avg, sg.next_exp_avg_sq, gr.next_param_shard})
          if (id != 0) store_->discard_contents(id);
      sg.speculated = false;
    }
  gatherer_->refresh();
  return false;
}

EngineStats ZeroEngine::stats() const {
  EngineStats s = stats_;
  s.store = store_->stats();
  return s;
}

std::vector<float> ZeroEngine::gather_full_params(int g) { return engine::gather_full_params(*core_, *gatherer_, g); }

void ZeroEngine::read_optimizer_shard(int g, float* master, float* exp_avg, float* exp_avg_sq) {
  engine::read_optimizer_shard(*core_, g, master, exp_avg, exp_avg_sq);
}

void ZeroEngine::write_optimizer_shard(int g, const float* master, const float* exp_avg, const float* exp_avg_sq,
                                       int64_t step_count) {
  engine::write_optimizer_shard(*core_, *gatherer_, g, master, exp_avg, exp_avg_sq);
  step_count_ = step_count;
}

}  // namespace strata
