// What the ZeRO engine is asked to do: the model's groups (GroupSpec), the configuration
// it runs (EngineOptions), the switches that turn an optimisation off to measure what it
// gives (EngineAblation, for bench step and the planner's tests only), and what it
// reports (EngineStats). resolve.hpp turns options into decisions; zero_engine.hpp runs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/offload/tiered_store.hpp"
#include "strata/runtime/engine/loss_scaler.hpp"
#include "strata/runtime/engine/shard_layout.hpp"
#include "strata/runtime/config/config.hpp"

namespace strata {

enum class InitKind { Normal, Zeros, Ones };

// The largest magnitude of the Normal initialiser's N(0, 1) draws: Box-Muller over uniform
// draws of at least 2^-53 gives at most sqrt(-2 ln 2^-53) = 8.5717 (so init_std times this
// bounds a group's initial values).
inline constexpr double kLargestNormalDraw = 8.5717;

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
  // Not trained (a LoRA run's base weights): held and gathered like any group, in the
  // working type, but it has no gradient, master weights or moments (GroupLayout::frozen).
  bool frozen = false;
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
  // ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size): stage 3 keeps, beside each
  // parameter shard, a secondary partition of the group's parameters over
  // hpz_partition_size consecutive ranks (within a node): the group's first gather after
  // its parameters change goes over every rank, as always, and leaves this rank's
  // 1/hpz_partition_size of it in the secondary; every later gather until the parameters
  // change again (backward's, the next micro-steps') goes over those ranks alone
  // (ShardStrategy::hpz). 1: off. ZeroEngine takes the ranks' communicator.
  int hpz_partition_size = 1;
  // ZeRO++ qwZ (zero_optimization.zero_quantized_weights): stage 3's gathers from the
  // primary shards move int8 blocks of this many elements, each with an fp32 scale, and
  // dequantize on arrival (ShardStrategy::quantized_block). 0: off. A device the host can
  // address only (the cpu backend).
  int quantized_weights_block = 0;
  // ZeRO++ qgZ (zero_optimization.zero_quantized_gradients), stages 2 and 3: each
  // reduce-scatter moves int8 blocks of this many elements, each with an fp32 scale, and
  // sums what arrives in fp32; in two hops (an all-to-all within the node, then one across
  // the nodes) where the world spans several nodes of several ranks
  // (ShardStrategy::quantized_gradients_block). 0: off. A device the host can address only
  // (the cpu backend).
  int quantized_gradients_block = 0;
  // Ranks per node for qgZ's hops: 0, the launcher's (coll::resolve_topology); N, N
  // consecutive ranks a node (strata.ranks_per_node).
  int ranks_per_node = 0;
  // Set by the engine from the node layout (not by the caller): the nodes qgZ's reduction
  // crosses.
  int gradient_nodes = 1;
  // qwZ's and qgZ's scratch per group at most: a larger shard's quantized collective goes
  // in chunks through two buffers (ShardStrategy::quantized_scratch, QuantizedChunks).
  uint64_t quantized_scratch_bytes = uint64_t{64} << 20;
  uint64_t seed = 1234;
  // A master weight beyond the working type's range (fp16: 65504) where the engine rounds
  // initial or loaded masters to it (strata.out_of_range; core/value_checks.hpp).
  OutOfRange out_of_range = OutOfRange::Refuse;
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

// Optimisations that are on in every real run, each with a switch that turns it off so
// that bench step and the planner's tests can measure what it gives. Not configuration:
// strata train always runs with all of them on.
struct EngineAblation {
  // Speculating with the states away from the optimizer's tier (on NVMe): each group's
  // first sub-group's states are fetched as its gradient completes, a group of backward
  // before the update reads them. false: fetched when the update starts.
  bool early_state_fetch = true;
  // Without speculation, the same for the plain step: with the states away from the
  // optimizer's tier, they start towards it during the last micro-step's backward pass
  // (while it reads nothing else from the disk), in the order step() takes them, into the
  // room the tier has free; and step() reads further ahead than the next sub-group into
  // the room that the stepped ones leave. false: step() reads each sub-group's states
  // while the one before is stepped.
  bool plain_state_prefetch = true;
  // Gradient accumulation with the optimizer off the device: between micro-steps, the
  // accumulating gradient shards stay on the device where its budget has room for all of
  // them beside the plan (taken from the prefetch room), and go to the optimizer's tier
  // only in the last micro-step. Without room (or false) each micro-step sends them there
  // and brings them back: two PCIe crossings of the fp32 gradient per micro-step.
  bool keep_accumulating_grads_on_device = true;
  // Stage 3: the speculative CPU updates run on the engine's optimizer lane, a host
  // worker of their own (Device::create_host_stream), while the model's thread goes on
  // with the backward pass (on a GPU: queues the next block's kernels). false steps them
  // on the model's thread between blocks. Stages 1 and 2 step on the model's thread
  // either way.
  bool speculation_lane = true;
  // Stage 3 on one rank with the parameter shards at home on the device: the shard is the
  // whole group, in device memory already, and the model reads it where it is
  // (ResolvedLayout::params_in_place). false: each acquire gathers it into a buffer of its
  // own, a device-to-device copy of every group twice a micro-step.
  bool params_in_place = true;
  // Stages 2 and 3 on one rank: the reduce-scatter of a group's gradient is the gradient
  // itself, and it is accumulated into the sub-groups straight from the model's buffer
  // (ResolvedLayout::grads_in_place). false: each micro-step copies it into a reduced
  // buffer first (a one-rank reduce-scatter), the whole model's gradient a micro-step.
  bool grads_in_place = true;
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
  uint64_t reduce_scatters = 0;   // stages 2 and 3: gradient reduce-scatters started (qgZ's included)
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
  // Early fetches of optimizer states (issued as a group's gradient is complete): of a
  // group's first speculative sub-group, a group of backward before it is stepped, or
  // without speculation of every sub-group (EngineAblation::plain_state_prefetch); and of
  // those, the ones skipped because the optimizer's tier had no room then (they are
  // fetched when stepped).
  uint64_t early_state_fetches = 0;
  uint64_t early_state_fetches_skipped = 0;
  // Speculating, gradients kept for a rollback that step() let go unwritten before the
  // lane finished, because the norm already said the speculation commits (their room
  // goes to the last groups' states).
  uint64_t kept_grads_freed_early = 0;
  // Bytes of accumulating gradient shards kept on the device between micro-steps
  // (EngineAblation::keep_accumulating_grads_on_device); 0 where they go back and forth.
  uint64_t grads_kept_on_device_bytes = 0;
  // The last step's speculative updates, on the model's thread during the backward pass:
  // their time waiting for parameter shards and optimizer states (exposed, as the model
  // waits meanwhile).
  double speculation_wait_s = 0;
  // The optimizer lane (EngineAblation::speculation_lane): sub-groups it stepped.
  uint64_t lane_sub_groups = 0;
  // Bytes this rank sent in the step's collectives, summed over the run, as a ring moves
  // them (all_gather and reduce_scatter: (n-1)/n of the whole buffer; all_reduce: twice
  // that): over the ranks the states are sharded over (all of them, or a MiCS group), and
  // across the MiCS replicas. The planner predicts these.
  // hpZ (EngineOptions::hpz_partition_size): the gathers from the secondary partitions,
  // over the hpZ group's ranks; the gathers from the primary shards count in
  // shard_collective_bytes.
  uint64_t shard_collective_bytes = 0;
  uint64_t replica_collective_bytes = 0;
  uint64_t secondary_collective_bytes = 0;
  // qwZ: the largest relative error (L2 norm of the rounding over that of the values) of a
  // parameter shard this rank quantized for a gather, since start.
  double quantized_weights_error = 0;
  // qgZ: the same for the gradients this rank quantized for a reduce-scatter (both hops).
  double quantized_gradients_error = 0;
  // qgZ in two hops: bytes this rank sent in the all-to-alls within its node, and across
  // the nodes (the one-hop all-to-all counts in shard_collective_bytes).
  uint64_t node_collective_bytes = 0;
  uint64_t cross_collective_bytes = 0;
  StoreStats store;
};

}  // namespace strata
