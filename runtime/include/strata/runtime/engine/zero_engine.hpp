// The ZeRO engine: shards parameters, gradients and optimizer states across ranks
// (stages 1, 2 and 3) and keeps every shard in a tier of the TieredStore, moving it
// ahead of need (DESIGN.md, "One ZeRO-3 training step").
//
// Per parameter group (a transformer block, the embeddings, ...), numel elements are
// padded to a multiple of world size and alignment and cut into equal shards; rank r
// owns shard r. The layout is decided in one place, shard_layout.hpp, which the planner
// reads too. Per shard the engine keeps, as TieredStore tensors:
//   - the fp32 master weights and Adam moments, in sub-groups of at most
//     sub_group_size elements, home = offload_optimizer's tier;
//   - the gradient shard, in the same sub-groups and tier (accumulated over
//     gradient_accumulation_steps micro-batches);
//   - stage 3: the working parameter shard, home = offload_param's tier, gathered into
//     a full device buffer when the model asks for it; in fp32 with both homes the same
//     (CPU Adam), it is the master weights itself (GroupLayout::master_in_shard);
//   - stages 1 and 2: the full working parameters, replicated on the device.
// Stage 1 keeps full gradients on the device and all-reduces them at the step; stages 2
// and 3 reduce-scatter each micro-batch's gradient into the shards as soon as it is ready.
//
// Initialisation never materialises a full group on any rank: each rank fills its own
// shard from (seed, group, global element index), so the initial model is the same for
// every world size.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/trace.hpp"
#include "strata/model/weight_source.hpp"
#include "strata/offload/cpu_adam.hpp"
#include "strata/offload/tiered_store.hpp"
#include "strata/runtime/train/config.hpp"
#include "strata/runtime/engine/loss_scaler.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

namespace strata {

enum class InitKind { Normal, Zeros, Ones };

struct GroupSpec {
  std::string name;          // e.g. "block.3"
  uint64_t numel = 0;        // elements
  InitKind init = InitKind::Normal;
  float init_std = 0.02f;    // Normal
  // Elements [begin, end) of the group that use another initialiser (e.g. a layer
  // norm's gain inside a block): filled with `value`.
  struct Constant {
    uint64_t begin = 0, end = 0;
    float value = 0.0f;
  };
  std::vector<Constant> constants;
  // A part of a larger group (gpt_parts): Normal values are those of elements
  // [init_offset, init_offset + numel) of group init_group, so that the initial model is
  // the same however its groups are cut. -1: the engine's index of this group.
  int init_group = -1;
  uint64_t init_offset = 0;
};

struct EngineOptions {
  int stage = 3;
  // The working type of parameters and gradients (F32, BF16 or F16; shard_layout.hpp says
  // which tensor has which type). fp16: `fp16` configures the loss scaler.
  DType precision = DType::F32;
  Fp16Config fp16;
  Tier param_home = Tier::Device;      // stage 3: where parameter shards live
  Tier optimizer_home = Tier::Device;  // master weights, moments, gradient shards
  OptimizerConfig optimizer;
  float gradient_clipping = 0.0f;      // global norm; 0 = off
  int gradient_accumulation_steps = 1;
  uint64_t prefetch_bucket_elems = 50'000'000;   // look-ahead budget, elements
  uint64_t max_live_elems = 1'000'000'000;       // gathered parameters alive at once
  uint64_t persistence_threshold_elems = 0;      // smaller groups stay gathered
  uint64_t max_reuse_distance_elems = 0;         // keep gathered if reused this soon
  uint64_t sub_group_elems = 1'000'000'000;      // optimizer sub-group size; 0: chosen (shard_layout.hpp)
  uint64_t shard_align_elems = ShardRules::kDefaultAlignElems;  // shards are multiples of this
  bool prefetch = true;
  // Speculative optimizer (strata.speculative_optimizer): during the last micro-step's
  // backward, each sub-group is stepped into its Next set (shard_layout.hpp) as soon as
  // its gradient is reduced, assuming no clipping and finite gradients; step() validates
  // and commits, or discards and steps again (or skips). Bit-identical to the plain step.
  bool speculative = false;
  // Speculating with the states away from the optimizer's tier (on NVMe): each group's
  // first sub-group's states are fetched as its gradient completes, a group of backward
  // before the update reads them. false fetches them only when the update starts (as
  // before 2026-11-25), for measuring what the early fetch gives.
  bool early_state_fetch = true;
  // Gradient accumulation with the optimizer off the device: between micro-steps, the
  // accumulating gradient shards stay on the device where its budget has room for all of
  // them beside the plan (taken from the prefetch room), and go to the optimizer's tier
  // only in the last micro-step. Without room (or false) each micro-step sends them there
  // and brings them back: two PCIe crossings of the fp32 gradient per micro-step.
  bool keep_accumulating_grads_on_device = true;
  // Stage 3: the speculative CPU updates run on the engine's optimizer lane, a host
  // worker of their own (Device::create_host_stream), while the model's thread goes on
  // with the backward pass (on a GPU: queues the next block's kernels). Their pins are
  // released as they finish: when the next gradient is handed in, at step(), or when a
  // tier needs the room (TieredStore::set_room_maker). false steps them on the model's
  // thread between blocks (as before 2026-11-26), for measuring what the lane gives.
  // Stages 1 and 2 step on the model's thread either way.
  bool speculation_lane = true;
  // With optimizer_home Device on a device whose memory the host cannot address (cuda),
  // the optimizer runs there: Stream::adam_step on the engine's optimizer stream (the GPU
  // optimizer). optimizer_on_stream takes that path on the cpu backend as well, where
  // CpuAdam would otherwise step the device tier in place: tests check the GPU
  // optimizer's logic on cpu with it (its bits are CpuAdam's).
  bool optimizer_on_stream = false;
  // offload_optimizer.ratio (ShardStrategy::optimizer_ratio): below 1, the groups past
  // that fraction of the states keep them on the device and step there, on the optimizer
  // stream, while CPU Adam steps the rest. Needs a device the host cannot address (cuda),
  // or optimizer_on_stream.
  double optimizer_ratio = 1.0;
  // Activation checkpoints the engine holds for the model (shard_layout.hpp,
  // ShardStrategy::checkpoints; the model is built with GptOptions::checkpoints_from_source):
  // count 0, the model keeps its own. checkpoints.home Device keeps them on the device;
  // cpu_checkpointing (activation_checkpointing.cpu_checkpointing) makes it pinned memory,
  // or NVMe when the pinned budget has no room for them beside the states and an NVMe
  // path is configured.
  ShardStrategy::Checkpoints checkpoints;
  bool cpu_checkpointing = false;
  // The first group's gradient is held from the head's backward to the end of backward (a
  // GPT with a tied head; ShardStrategy::first_gradient_held): the device's working set,
  // and so the start-up minimum, count it. from_config sets it from strata.model.
  bool first_gradient_held = false;
  uint64_t seed = 1234;
  unsigned optimizer_threads = 0;      // 0: all cores
  TieredStoreOptions store;
  // Chrome trace (core/trace.hpp) written here when the engine is destroyed; "" = off.
  // While the engine lives, every component records into it (strata.trace).
  std::string trace_path;

  // From a parsed configuration (budgets, tiers, NVMe paths, aio, ZeRO options).
  static EngineOptions from_config(const Config& c);
  // What the shard layout depends on, for a data-parallel group of `world` ranks.
  ShardStrategy shard_strategy(int world) const;
};

// Times are seconds on the device's clock (Device::now()): wall time on cpu and cuda,
// simulated time on sim.
struct EngineStats {
  double exposed_wait_s = 0;      // time the model waited for parameters and gradient
                                  // buffers, summed over the run (not hidden)
  double optimizer_s = 0;         // the last optimizer step, waits for states included
  double optimizer_wait_s = 0;    // of optimizer_s, waiting for states to arrive
  uint64_t gathers = 0;           // all_gathers started
  uint64_t prefetched = 0;        // of which ahead of need
  uint64_t trace_departures = 0;  // steps that left the recorded acquire order
  double last_grad_norm = 0;      // before clipping, of the averaged gradient (loss scale divided out)
  uint64_t skipped_steps = 0;     // steps whose gradients were not finite (fp16 overflows included)
  double loss_scale = 1;          // the scale of the next micro-steps' gradients
  // The speculative optimizer: sub-groups stepped during the backward pass in the last
  // step; steps whose speculation was committed, and steps where it was undone (clipping
  // applied, a non-finite gradient, the learning rate changed after the backward pass);
  // sub-groups without a Next set because the budgets leave no room for one (stepped
  // plainly at step()).
  uint64_t speculated_sub_groups = 0;
  uint64_t speculation_commits = 0;
  uint64_t speculation_rollbacks = 0;
  uint64_t speculation_fallback_sub_groups = 0;
  // Early fetches of a group's first speculative sub-group's states (issued as its
  // gradient is complete, a group of backward before they are stepped), and of those, the
  // ones skipped because the optimizer's tier had no room then (they are fetched when
  // stepped, as without speculation).
  uint64_t early_state_fetches = 0;
  uint64_t early_state_fetches_skipped = 0;
  // Speculating, gradients kept for a rollback that step() let go unwritten before the
  // lane finished, because the norm already said the speculation commits (their room
  // goes to the last groups' states).
  uint64_t kept_grads_freed_early = 0;
  // Bytes of accumulating gradient shards kept on the device between micro-steps
  // (EngineOptions::keep_accumulating_grads_on_device); 0 where they go back and forth.
  uint64_t grads_kept_on_device_bytes = 0;
  // The last step's speculative updates, on the model's thread during the backward pass:
  // their time waiting for parameter shards and optimizer states (exposed, as the model
  // waits meanwhile).
  double speculation_wait_s = 0;
  // The optimizer lane (EngineOptions::speculation_lane): sub-groups it stepped, and the
  // times the model's thread waited for it to release pins because a tier was full.
  uint64_t lane_sub_groups = 0;
  uint64_t lane_waits_for_room = 0;
  StoreStats store;
};

class TieredActivationStore;

class ZeroEngine final : public WeightSource {
 public:
  // comm serves device buffers (NCCL on cuda, MPI or self on cpu); host_comm serves
  // host scalars (norms). They may be the same communicator. Throws ConfigError or
  // OutOfBudget at start-up when the configuration cannot work.
  ZeroEngine(Device& device, coll::Communicator& comm, coll::Communicator& host_comm, EngineOptions opts,
             std::vector<GroupSpec> groups);
  ~ZeroEngine() override;

  // WeightSource
  int num_groups() const override;
  uint64_t group_numel(int g) const override;
  DType dtype() const override { return work_t_; }
  const void* acquire_params(int g) override;
  void release_params(int g) override;
  void* gradient_buffer(int g) override;
  void grads_ready(int g) override;
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
  void set_learning_rate(double lr) {
    STRATA_CHECK(std::isfinite(lr) && lr >= 0.0, "learning rate " + std::to_string(lr));
    lane_finish();  // its updates read the rate as they run
    adam_->set_lr(lr);
  }
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
  // Every size the engine allocates by: padding, shards, sub-groups, tier needs.
  const ShardLayout& layout() const { return layout_; }
  coll::Communicator& comm() { return comm_; }

  // The full working parameters of group g, gathered to host memory as fp32 (tests,
  // export); in 16-bit training these are the 16-bit values, widened.
  std::vector<float> gather_full_params(int g);
  // This rank's optimizer state for checkpoints: [master, exp_avg, exp_avg_sq] of its
  // shard of group g, each shard_numel(g) floats.
  uint64_t shard_numel(int g) const;
  const std::string& group_name(int g) const;  // GroupSpec::name
  void read_optimizer_shard(int g, float* master, float* exp_avg, float* exp_avg_sq);
  void write_optimizer_shard(int g, const float* master, const float* exp_avg, const float* exp_avg_sq,
                             int64_t step_count);

 private:
  struct Chunk;
  struct Group;

  void init_shards();
  void start_gather(int g, bool ahead);
  void wait_gathered(Group& gr);
  void prefetch_after(size_t pos);
  void drop_full(Group& gr);
  uint64_t reuse_distance(int g, size_t pos) const;
  void reduce_group(int g);
  // Adds the reduced gradient of this rank's shard (`reduced`, of type t) into the
  // group's sub-groups; the first micro-step overwrites them.
  void accumulate_chunks(Group& gr, const void* reduced, DType t, Event reduced_ready, bool first, bool last);
  void adopt_schedule(std::vector<int> order);
  void all_reduce_stage1(Group& gr);  // the step's all-reduce of a stage-1 group's gradient
  void refresh_params();
  double global_grad_norm();
  struct Update {
    Group* gr;
    Chunk* c;
  };
  // Steps the sub-groups in `items` (in order, fetching the next one's states while one is
  // updated): in place, or into their Next sets when speculative.
  void update(const std::vector<Update>& items, float grad_scale, bool speculative);
  // The GPU optimizer's share: queued on opt_stream_, then waited for and released.
  struct DeviceUpdate {
    Group* gr;
    std::vector<Chunk*> chunks;
    Event done;
    bool speculative;
    double t0;
  };
  std::vector<DeviceUpdate> launch_on_device(const std::vector<Update>& items, float grad_scale, bool speculative);
  void finish_on_device(std::vector<DeviceUpdate>& pending);
  void update_on_host(const std::vector<Update>& items, float grad_scale, bool speculative);  // CPU Adam
  // One host update's tensors in the optimizer's tier: its states and gradient starting
  // towards tier t (a hint), pinned there with the arrays the step writes (out: the states
  // themselves, or the Next set when speculative), and the bytes the step moves.
  struct UpdateTensors {
    Acquired m, a, v, gd, out[3];
  };
  void fetch_update_states(const Group& gr, const Chunk& c, Tier t);
  UpdateTensors acquire_for_update(Chunk& c, Tier t, bool speculative);
  double update_bytes(const Group& gr, const Chunk& c) const;
  // Unpins a stepped sub-group's states and gradient in tier t (dropped towards their home
  // when t is not it); speculative: the Next set was written, the gradient is kept.
  void release_stepped(const Group& gr, Chunk& c, Tier t, bool speculative);
  void speculate_group(int g);  // steps group g's speculative sub-groups into their Next sets
  // step(), the norm known and the lane not yet done: where the speculation commits, lets
  // go the gradients kept for a rollback (unwritten) of the sub-groups the lane is done with.
  void free_dead_kept_grads(double norm);
  double clip_coefficient(double norm) const;  // gradient_clipping's factor, 1 when off or not needed
  bool speculation_commits(double norm) const;  // step() keeps the speculative results
  void prefetch_first_states(const Group& gr);  // its first speculative sub-group's states, towards the optimizer
  float unclipped_grad_scale() const;
  // After a skipped step: the working parameters of speculated sub-groups back to their
  // committed master weights.
  void restore_params(const std::vector<Update>& items);
  void waited(double since, const char* what, const Group* gr);  // an exposed wait ended now

  // The optimizer lane (EngineOptions::speculation_lane). Speculative host sub-groups
  // wait in lane_backlog_ and run at most kLaneDepth at a time; the model's thread
  // acquires their tensors (the store is used from the model's thread only), queues the
  // update on lane_, and releases the tensors once it is done.
  struct LaneItem {
    Update u;
    int64_t t;         // Adam's step number
    float grad_scale;  // unclipped
    bool whole;        // every sub-group of the group is in this speculation
  };
  struct LaneRecord {
    Group* gr;
    Chunk* c;  // null: the group's parameter shard, once its sub-groups are done
    Event done;
  };
  static constexpr size_t kLaneDepth = 8;
  void lane_pump();                  // releases what is done; starts what may start
  void lane_submit(const LaneItem& it);
  void lane_close_group();           // the open group's parameter shard goes when the lane gets there
  void lane_retire_one();            // waits for the oldest record and releases its tensors
  void lane_finish();                // completes the group begun, waits for all; the rest stays plain
  bool lane_make_room();             // TieredStore's room maker


  std::unique_ptr<trace::Recorder> trace_;  // set when opts_.trace_path is
  trace::Recorder* outer_trace_ = nullptr;  // the recorder active before this engine's

  Device& device_;
  coll::Communicator& comm_;
  coll::Communicator& host_comm_;
  EngineOptions opts_;
  ShardLayout layout_;
  std::unique_ptr<TieredStore> store_;
  std::unique_ptr<TieredActivationStore> checkpoints_;  // when opts_.checkpoints.count > 0
  std::unique_ptr<CpuAdam> adam_;
  LossScaler scaler_;
  DType work_t_ = DType::F32, grad_t_ = DType::F32;  // the layout's working and reduced-gradient types
  uint64_t wb_ = 4, gb_ = 4;                          // their bytes
  std::unique_ptr<Stream> reduce_stream_;   // gradient accumulation and norms
  Tier opt_compute_tier_ = Tier::Pinned;    // where the optimizer reads its states
  bool gpu_optimizer_ = false;              // the optimizer steps on opt_stream_ (device memory)
  Tier opt_host_tier_ = Tier::Pinned;       // where host code reads and writes the states (init, checkpoints)
  std::unique_ptr<Stream> opt_stream_;      // the GPU optimizer's stream
  std::vector<Group> groups_;
  int world_ = 1, rank_ = 0;

  std::vector<int> schedule_;    // group order of one micro-step
  std::vector<int> recording_;   // order seen in this micro-step
  bool schedule_given_ = false;
  bool departed_ = false;        // this micro-step left the schedule: on demand only
  size_t pos_ = 0;               // index of the next acquire in schedule_
  int micro_ = -1;               // index of the current micro-step; -1 before the first
  uint64_t live_full_bytes_ = 0; // gathered parameters alive, bytes (persistent ones excluded)
  uint64_t gathering_shard_bytes_ = 0;  // parameter shards on the device for gathers in flight
  uint64_t prefetch_room_ = 0;   // device bytes that gathered parameters may use
  bool keep_grads_ = false;      // accumulating gradients stay on the device between micro-steps
  int64_t step_count_ = 0;
  int64_t iterations_ = 0;
  std::vector<double> norm_parts_;  // per-chunk squared norms of the last micro-step (host)
  double spec_wait_ = 0;            // the speculative updates' waits so far in this step
  std::vector<int> spec_queue_;     // groups whose last gradients are reduced, not yet speculated
  double spec_lr_ = 0;              // the learning rate the speculated sub-groups were stepped with
  mutable EngineStats stats_;
  // The optimizer lane; last, so that it goes first (its work uses the store and adam_).
  std::unique_ptr<Stream> lane_;
  std::deque<LaneItem> lane_backlog_;
  std::deque<LaneRecord> lane_inflight_;
  size_t lane_running_ = 0;          // sub-group records in lane_inflight_
  Group* lane_open_ = nullptr;       // whose parameter shard the lane holds (lane_params_)
  Acquired lane_params_{};
  Acquired lane_masters_{};          // master_in_shard: lane_open_'s shard, read (lane_params_ its next)
  Group* lane_last_ = nullptr;       // the group of the last sub-group submitted
  bool lane_submitting_ = false;     // in lane_submit: lane_open_'s shard is in use
  std::vector<const Group*> lane_opened_;  // groups opened this step (reopened: not for overwrite)
  std::thread::id owner_;            // the model's thread, which made the engine
};

}  // namespace strata
