// The ZeRO engine: shards parameters, gradients and optimizer states across ranks
// (stages 1, 2 and 3) and keeps every shard in a tier of the TieredStore, moving it
// ahead of need (docs/architecture.md, "The engine in parts").
//
// Per parameter group (a transformer block, the embeddings, ...), numel elements are
// padded to a multiple of world size and alignment and cut into equal shards; rank r
// owns shard r. Every decision is made once, by resolve() (resolve.hpp), before anything
// is allocated: the layout (shard_layout.hpp) of every tensor, the tiers, the speculative
// sub-groups, the checkpoints' home. Per shard the engine keeps, as TieredStore tensors:
//   - the fp32 master weights and Adam moments, in sub-groups of at most
//     sub_group_size elements, home = offload_optimizer's tier;
//   - the gradient shard, in the same sub-groups and tier (accumulated over
//     gradient_accumulation_steps micro-batches);
//   - stage 3: the working parameter shard, home = offload_param's tier, gathered into
//     a full device buffer when the model asks for it; in fp32 with both homes the same
//     (CPU Adam), it is the master weights itself (GroupLayout::master_in_shard);
//   - stages 1 and 2: the full working parameters, replicated on the device.
//
// The engine is a few parts wired from the resolved layout (runtime/src/engine/):
//   Gatherer         the model's parameters: gather, prefetch, acquire, release;
//   GradientReducer  the model's gradients: reduce (all-reduce at the step for stage 1,
//                    reduce-scatter each micro-step for 2 and 3), accumulate, norm;
//   Steppers         the optimizer: CPU Adam and the GPU optimizer, side by side;
//   Speculation      the speculative optimizer and its lane;
//   state_io         initial shards, and the states checkpoints read and write;
//   TieredActivationStore  the activation checkpoints the model leaves with the engine.
// ZeroEngine owns them and runs the step: step() is the one place that orders them.
//
// Initialisation never materialises a full group on any rank: each rank fills its own
// shard from (seed, group, global element index), so the initial model is the same for
// every world size.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/trace.hpp"
#include "strata/model/weight_source.hpp"
#include "strata/offload/cpu_adam.hpp"
#include "strata/offload/tiered_store.hpp"
#include "strata/runtime/engine/engine_options.hpp"
#include "strata/runtime/engine/loss_scaler.hpp"
#include "strata/runtime/engine/resolve.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

namespace strata {

class TieredActivationStore;
namespace engine {
struct EngineCore;
struct GroupState;
struct Update;
class Gatherer;
class GradientReducer;
class Steppers;
class Speculation;
}  // namespace engine

// The model's groups as the layout sees them (names and sizes).
std::vector<GroupSize> group_sizes(const std::vector<GroupSpec>& groups);
// What resolve() needs to know of a device.
DeviceTraits device_traits(const Device& d);

class ZeroEngine final : public WeightSource {
 public:
  // comm serves device buffers (NCCL on cuda, MPI or self on cpu); host_comm serves
  // host scalars (norms). They may be the same communicator. The states are sharded over
  // comm's ranks. `replicas` (MiCS, zero_optimization.mics_shard_size): the ranks of the
  // other groups that hold this rank's shard; each reduced gradient is all-reduced across
  // them, and the average is over comm x replicas ranks. `hpz` (ZeRO++ hpZ,
  // EngineOptions::hpz_partition_size > 1): the consecutive ranks of comm that share a
  // secondary partition (comm's rank r is hpz's rank r % size, with its group's other
  // ranks). Throws ConfigError or OutOfBudget at start-up when the configuration cannot
  // work (resolve.hpp).
  ZeroEngine(Device& device, coll::Communicator& comm, coll::Communicator& host_comm, EngineOptions opts,
             std::vector<GroupSpec> groups, EngineAblation ablation = {}, coll::Communicator* replicas = nullptr,
             coll::Communicator* hpz = nullptr);
  ~ZeroEngine() override;

  // WeightSource
  int num_groups() const override;
  uint64_t group_numel(int g) const override;
  DType dtype() const override { return work_t_; }
  const void* acquire_params(int g) override;
  void release_params(int g) override;
  void* gradient_buffer(int g) override;
  void grads_ready(int g) override;
  // The model's device work still reading the parameters (writing the gradient) is
  // `after`: the engine's streams wait for it, and the memory is not reused before it.
  void release_params_after(int g, const Event& after) override;
  void grads_ready_after(int g, const Event& after) override;
  ActivationStore* activation_store() override;

  // The order in which the model will acquire groups in one micro-step (forward then
  // backward). Without it, the order of the first micro-step is recorded and used.
  void set_schedule(std::vector<int> order);
  // Call before each micro-batch's forward (gradient_accumulation_steps per step).
  void begin_micro_step();
  // Call after the last micro-batch's backward: reduces what is left, clips, runs the
  // optimizer over every shard and refreshes the working parameters. Returns true
  // when it stepped, false when it skipped the step because some rank's gradients were
  // not finite (an fp16 overflow): then no state changed, and the loss scaler reacted.
  bool step();
  // The scale the model's gradients must carry (GptModel::forward_backward's loss_scale):
  // the fp16 loss scale, 1 otherwise.
  double loss_scale() const { return scaler_.scale(); }
  LossScaler& loss_scaler() { return scaler_; }
  // The learning rate of the next step() and the ones after it, until set again; it
  // starts as opts.optimizer.lr. A schedule sets it before every step:
  // set_learning_rate(LrSchedule::lr_at(optimizer_steps())).
  void set_learning_rate(double lr);
  double learning_rate() const { return adam_->config().lr; }

  // Steps the optimizer took (Adam's t; the learning-rate schedule's position).
  int64_t optimizer_steps() const { return step_count_; }
  // step() calls, skipped steps included: the training loop's count, which names
  // checkpoints. Equal to optimizer_steps() unless a step was skipped.
  int64_t iterations() const { return iterations_; }
  void set_iterations(int64_t n) { iterations_ = n; }
  int micro_step() const { return micro_; }
  EngineStats stats() const;
  TieredStore& store() { return *store_; }
  // Every decision the engine runs by (resolve.hpp), and its layout: padding, shards,
  // sub-groups, tier needs.
  const ResolvedLayout& resolved() const { return resolved_; }
  const ShardLayout& layout() const { return resolved_.layout; }
  coll::Communicator& comm() { return comm_; }

  // The full working parameters of group g, gathered to host memory as fp32 (tests,
  // export); in 16-bit training these are the 16-bit values, widened.
  std::vector<float> gather_full_params(int g);
  // This rank's optimizer state for checkpoints: [master, exp_avg, exp_avg_sq] of its
  // shard of group g, each shard_numel(g) floats. A frozen group has no optimizer state:
  // its master is its working parameters widened (exactly), its moments zeros, and a write
  // takes the master rounded to the working type (exact for values read that way).
  uint64_t shard_numel(int g) const;
  const std::string& group_name(int g) const;  // GroupSpec::name
  bool group_frozen(int g) const;               // GroupSpec::frozen: no gradient, never stepped
  void read_optimizer_shard(int g, float* master, float* exp_avg, float* exp_avg_sq);
  void write_optimizer_shard(int g, const float* master, const float* exp_avg, const float* exp_avg_sq,
                             int64_t step_count);

 private:
  void build_groups(std::vector<GroupSpec> groups);
  void register_tensors();
  bool skip_step(const std::vector<engine::Update>& speculated);  // after a non-finite norm
  float unclipped_grad_scale() const;

  std::unique_ptr<trace::Recorder> trace_;  // set when the trace path is
  trace::Recorder* outer_trace_ = nullptr;  // the recorder active before this engine's

  Device& device_;
  coll::Communicator& comm_;
  coll::Communicator& host_comm_;
  // qgZ in two hops: the ranks of this rank's node, and the ranks of every node with its
  // index there (split from comm_ at start-up); null otherwise. Destroyed last.
  std::unique_ptr<coll::Communicator> qgz_node_, qgz_cross_;
  const ResolvedLayout resolved_;
  const EngineOptions& opts_;  // resolved_.options
  std::unique_ptr<TieredStore> store_;
  std::unique_ptr<CpuAdam> adam_;
  LossScaler scaler_;
  DType work_t_ = DType::F32;
  std::unique_ptr<Stream> reduce_stream_;   // gradient accumulation, norms, the engine's copies
  std::vector<engine::GroupState> groups_;
  mutable EngineStats stats_;
  std::unique_ptr<engine::EngineCore> core_;
  std::unique_ptr<TieredActivationStore> activations_;  // when the layout holds checkpoints
  std::unique_ptr<engine::Gatherer> gatherer_;
  std::unique_ptr<engine::GradientReducer> reducer_;
  std::unique_ptr<engine::Steppers> steppers_;
  // Last, so that it goes first: its lane's work uses the store and the optimizer.
  std::unique_ptr<engine::Speculation> speculation_;

  int micro_ = -1;  // index of the current micro-step; -1 before the first
  size_t prefetch_cursor_ = 0;  // the plain step's next sub-group to prefetch (EngineAblation::plain_state_prefetch)
  int64_t step_count_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace strata
