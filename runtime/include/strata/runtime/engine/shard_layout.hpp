// How the ZeRO engine lays out model states, written once: every group's padding, shard
// and optimizer sub-groups, the tensors the engine registers with the TieredStore (name,
// bytes, dtype, home tier, purpose) and the bytes each tier must hold for which purpose.
//
// Three readers, one source:
//   - the engine (zero_engine.hpp) registers exactly the tensors listed here and checks
//     its budgets against the totals here;
//   - the planner (plan.hpp) counts its per-tier bytes from the same totals;
//   - the simulator runs the real engine, so its budgets and peaks follow too.
// A change to a rule below (the alignment, the sub-group rule, a tensor's dtype) reaches
// all three; tests/runtime/test_shard_layout.cpp checks that it does.
#pragma once

#include <algorithm>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/memory/tier.hpp"
#include "strata/offload/tiered_store.hpp"

namespace strata {

// The rules that decide the layout, apart from the model and the world.
struct ShardRules {
  // Shards are multiples of this many elements: 1024 fp32 elements are 4 KiB, so every
  // tier allocation and every NVMe transfer stays aligned for O_DIRECT with no padding
  // of its own.
  static constexpr uint64_t kDefaultAlignElems = 1024;
  uint64_t align_elems = kDefaultAlignElems;
  // Optimizer sub-group, elements (rounded down to the alignment, at least one unit).
  // 0 chooses: a quarter of the largest shard, between 1 Mi and 100 M elements, so the
  // optimizer can fetch the next sub-group while it updates this one.
  uint64_t sub_group_elems = 0;
  // Stage 3: groups of at most this many elements stay gathered on the device.
  uint64_t persistence_threshold_elems = 0;
};

struct ShardStrategy {
  int world = 1;
  int stage = 3;
  Tier param_home = Tier::Device;      // stage 3; stages 1 and 2 replicate on the device
  Tier optimizer_home = Tier::Device;  // master weights, moments, gradient sub-groups
  // Element types. `working`: the parameters the model reads and the gradients it writes,
  // in every gather and reduce-scatter (F32, BF16 or F16). `grads`: the reduced gradient
  // the optimizer reads (the sub-groups' Grad, stage 1's GradAccumulated); fp32 whenever
  // it is accumulated over micro-steps (grads_dtype below). Master weights and Adam's
  // moments are always fp32.
  DType working = DType::F32;
  DType grads = DType::F32;
  ShardRules rules;
  // The speculative optimizer (strata.speculative_optimizer): this many sub-groups,
  // counted from the model's end (the backward pass reaches the last groups first), have
  // a second set of master weights and moments in optimizer_home, which a step run
  // during the backward pass writes while the current set stays intact until the step is
  // validated (zero_engine.hpp). The engine lowers it until the budgets hold.
  uint64_t speculative_sub_groups = 0;
  // The optimizer steps states in device memory that the host cannot address (the GPU
  // optimizer, optimizer_home Device on cuda): host code (initialisation, checkpoints,
  // the speculative optimizer's restores) stages a sub-group's three fp32 states through
  // pinned memory, which pinned_staging counts.
  bool device_states_staged = false;
  // DeepSpeed's offload_optimizer.ratio (ZeRO-Offload++'s Twin-Flow): the fraction of the
  // optimizer's states, counted in shard elements from the model's first group, whose home
  // is optimizer_home (stepped by CPU Adam); the groups after it keep their states on the
  // device and step there (the GPU optimizer), at the same time. Whole groups: a group's
  // parameter shard is written by one of the two. 1: all in optimizer_home. Only with
  // optimizer_home Pinned or Nvme.
  double optimizer_ratio = 1.0;
  // Activation checkpoints the engine holds for the model (GptOptions::checkpoints_from_source,
  // model/activation_store.hpp): `count` buffers of `bytes` each (fp32 residuals, not
  // sharded). home Device: they stay on the device from forward to backward. Pinned or
  // Nvme (activation_checkpointing.cpu_checkpointing): each moves there once its block's
  // forward is done and comes back ahead of that block's backward, so the device holds a
  // few at a time (kLiveCheckpoints). count 0: the model keeps its own.
  struct Checkpoints {
    int count = 0;
    uint64_t bytes = 0;
    Tier home = Tier::Device;
  } checkpoints;
  // The first group's gradient is written first in backward, with the last group in use,
  // and held until the backward pass ends (a GPT's tied head: the head's share arrives
  // first, the embedding lookup's last). The device working set then counts it beside
  // every other group's backward, and the head's moment holding both groups.
  bool first_gradient_held = false;
  // ZeRO++ hpZ (EngineOptions::hpz_partition_size), stage 3: each group that is not
  // persistent also keeps a secondary partition, [padded / hpz] elements of the working
  // type with its parameter shard's home, that later gathers read within hpz ranks. 1: none.
  int hpz = 1;
  // ZeRO++ qwZ (EngineOptions::quantized_weights_block), stage 3: a gather from the primary
  // shards passes the quantized shard and every rank's through a scratch buffer on the
  // device (StateRole::QuantizedGather). 0: off.
  uint64_t quantized_block = 0;
  // ZeRO++ qgZ (EngineOptions::quantized_gradients_block), stages 2 and 3: each
  // reduce-scatter passes the gradient quantized per destination rank, what arrives and
  // the fp32 partial sums through a scratch buffer on the device
  // (StateRole::QuantizedReduce, qgz_scratch_bytes). gradient_nodes: the nodes the world
  // spans, where the reduction is hierarchical (qgz_hierarchical). 0: off.
  uint64_t quantized_gradients_block = 0;
  int gradient_nodes = 1;
  // qwZ's and qgZ's scratch per group at most (EngineOptions::quantized_scratch_bytes): a
  // shard whose quantized buffers would be larger goes in chunks (QuantizedChunks).
  uint64_t quantized_scratch = uint64_t{64} << 20;
};

// Bytes of n elements quantized in blocks of `block`: one int8 each and an fp32 scale per
// (possibly partial) block.
inline uint64_t quantized_bytes(uint64_t n, uint64_t block) { return n + 4 * ((n + block - 1) / block); }

// How a quantized collective of a shard of n elements goes: `elems` of each slice at a
// time (a multiple of the block, or all n), through `buffers` copies of the scratch one
// chunk needs (two where there are several chunks: the next chunk is quantized while the
// last one moves). bytes: the scratch in all, within `cap` unless one block's is larger.
// per_block: the scratch of one block of each slice (exact: the scratch is linear in
// whole blocks).
struct QuantizedChunks {
  uint64_t elems = 0;
  int buffers = 1;
  uint64_t bytes = 0;
  uint64_t count(uint64_t n) const { return elems == 0 ? 0 : (n + elems - 1) / elems; }
};
template <class Scratch>
QuantizedChunks quantized_chunks(uint64_t n, uint64_t block, uint64_t cap, Scratch scratch_of) {
  const uint64_t whole = scratch_of(n);
  if (whole <= cap || n <= block) return {n, 1, whole};
  const uint64_t k = std::max<uint64_t>(1, cap / 2 / scratch_of(block));
  const uint64_t elems = std::min(n, k * block);
  if (elems >= n) return {n, 1, whole};
  return {elems, 2, 2 * scratch_of(elems)};
}
// qwZ: this rank's shard quantized and every rank's (world + 1 parts).
inline QuantizedChunks qwz_chunks(uint64_t n, int world, uint64_t block, uint64_t cap) {
  return quantized_chunks(n, block, cap,
                          [&](uint64_t m) { return (static_cast<uint64_t>(world) + 1) * quantized_bytes(m, block); });
}

// qgZ's reduction goes in two hops (within the node, then across) where the world spans
// several nodes of several ranks each; one all-to-all over the world otherwise.
inline bool qgz_hierarchical(int world, int nodes) { return nodes > 1 && nodes < world; }
// qgZ's scratch for a shard of n elements: the world's quantized parts sent and received
// (world x quantized_bytes(n)), and the fp32 sum of n; two hops also sum one part for each
// node in fp32 and pass them, quantized again, through a second send and receive.
// The parts come first, then the fp32 sums at qgz_sums_offset (16-byte aligned whatever
// the block), then the second hop's parts.
inline uint64_t qgz_sums_offset(uint64_t n, int world, uint64_t block) {
  return (2 * static_cast<uint64_t>(world) * quantized_bytes(n, block) + 15) / 16 * 16;
}
inline uint64_t qgz_scratch_bytes(uint64_t n, int world, int nodes, uint64_t block) {
  const uint64_t q = quantized_bytes(n, block), sums = qgz_sums_offset(n, world, block);
  if (!qgz_hierarchical(world, nodes)) return sums + 4 * n;
  const uint64_t m = static_cast<uint64_t>(nodes);
  return sums + m * (4 * n + 2 * q);
}
inline QuantizedChunks qgz_chunks(uint64_t n, int world, int nodes, uint64_t block, uint64_t cap) {
  return quantized_chunks(n, block, cap, [&](uint64_t m) { return qgz_scratch_bytes(m, world, nodes, block); });
}

// Checkpoints on the device at once when they live elsewhere: in forward a block's input
// and output, and the one before still on its way out; in backward the one in use, the
// one prefetched and the one just finished.
inline constexpr int kLiveCheckpoints = 3;

// The reduced gradient's type: the working type when each step reduces one micro-batch
// (nothing is summed in it, so 16 bits lose nothing), fp32 when micro-steps are
// accumulated (DeepSpeed's default for bf16: a sum of many 16-bit terms in 16 bits loses
// the small ones).
DType grads_dtype(DType working, int gradient_accumulation_steps);

// What each tensor the engine registers is for. One value per field of the engine's
// per-group state; the engine switches on it when it assigns the store's ids.
enum class StateRole {
  GatherBuffer,    // stage 3: [padded] gathered parameters, scratch on the device
  ParamShard,      // stage 3: [shard] working parameters, home param_home
  ParamSecondary,  // stage 3 with hpZ: [padded / hpz] working parameters, home param_home
  QuantizedGather, // stage 3 with qwZ: bytes, this rank's shard and every rank's quantized, scratch on the device
  ReplicatedParams,// stages 1, 2: [padded] working parameters, home device
  GradFull,        // [padded] the model's gradient of one micro-batch, scratch on the device
  GradAccumulated, // stage 1: [padded] accumulated gradient, home device
  GradReduced,     // stages 2, 3: [shard] reduce-scatter output, scratch on the device
  QuantizedReduce, // stages 2, 3 with qgZ: bytes (qgz_scratch_bytes), scratch on the device
  Master,          // per sub-group: fp32 master weights, home optimizer_home
  ExpAvg,          // per sub-group: Adam's first moment
  ExpAvgSq,        // per sub-group: Adam's second moment
  Grad,            // per sub-group: the reduced, accumulated gradient
  MasterNext,      // speculative sub-groups: the next step's master weights (per group,
                   //   the whole shard, where GroupLayout::master_in_shard), written
  ExpAvgNext,      //   during the backward pass while Master / ExpAvg / ExpAvgSq stay
  ExpAvgSqNext,    //   the committed state; the engine swaps the two sets at commit
  ActivationCheckpoint,  // ShardStrategy::checkpoints: one per checkpoint, home checkpoints.home
};

struct StateTensor {
  StateRole role;
  int sub_group = -1;  // index into GroupLayout::sub_groups, -1 for whole-group tensors
  TensorSpec spec;     // what the engine hands TieredStore::add
};

struct SubGroup {
  uint64_t offset = 0;  // elements into the rank's shard
  uint64_t n = 0;       // elements
  bool speculative = false;  // has the Next set (ShardStrategy::speculative_sub_groups)
};

struct GroupLayout {
  std::string name;
  uint64_t numel = 0;   // the model's elements
  uint64_t padded = 0;  // elements, a multiple of world x align_elems
  // Its parameters are not trained (GroupSize::frozen): only the working parameters
  // (ParamShard / ReplicatedParams, and the GatherBuffer in stage 3) are registered; no
  // gradient tensor, no master weights, no moments, and no sub-groups, so the reducer,
  // the norm, the steppers and the speculation have nothing of it to touch.
  bool frozen = false;
  uint64_t shard = 0;   // elements per rank: padded / world
  bool persistent = false;
  Tier optimizer_home = Tier::Device;  // its sub-groups' states (ShardStrategy::optimizer_ratio)
  // Stage 3 in fp32, its states' home the parameter shard's, stepped by CPU Adam, its
  // sub-groups all speculative or none: the parameter shard is the master weights (the
  // same fp32 values, so one tensor; its sub-groups have no Master of their own, and a
  // speculative group one MasterNext of the whole shard). The optimizer steps each
  // sub-group's range of the shard in place, and no copy of the masters is written into
  // the shard or moved between tiers: per step, a shard's read and write less.
  bool master_in_shard = false;
  std::vector<SubGroup> sub_groups;
  std::vector<StateTensor> tensors;  // registered in this order
};

// Bytes one rank's tier holds for each purpose. Home copies are rounded up to the tier's
// allocation unit (kTierAlignment), as the store allocates them.
struct TierNeed {
  uint64_t params = 0, grads = 0, optimizer = 0;
  uint64_t persistent = 0;  // stage 3: gathered groups kept on the device
  uint64_t activations = 0;  // the activation checkpoints' homes (ShardStrategy::checkpoints)
  uint64_t homes() const { return params + grads + optimizer + persistent + activations; }
};

struct ShardLayout {
  ShardStrategy strategy;  // with sub_group_elems resolved
  std::vector<GroupLayout> groups;
  std::vector<StateTensor> checkpoints;  // ShardStrategy::checkpoints, registered after the groups'
  uint64_t sub_group = 0;  // elements per optimizer sub-group
  uint64_t max_padded = 0, max_shard = 0, max_numel = 0, max_sub_group = 0;  // elements
  uint64_t shard_total = 0, padded_total = 0;                                // elements
  uint64_t trained_shard_total = 0;  // elements of shard_total in groups that are not frozen
  uint64_t sub_group_count = 0;
  std::array<TierNeed, kTierCount> need{};  // indexed by Tier
  // The device's working set on top of its homes: the largest group in use (its gathered
  // parameters and gradient, the reduce-scatter output, and its parameter shard and
  // gradient sub-groups passing through), and kLiveCheckpoints checkpoints when they
  // live off the device.
  uint64_t device_working = 0;
  // Pinned staging the optimizer needs: its sub-groups' four states passing through,
  // twice (the one updated and the next one fetched), and a parameter shard; a
  // speculative step also holds the updated sub-group's Next set, and a group's next
  // shard where the shard is its master weights (master_in_shard). Checkpoints on NVMe
  // pass through it too (kLiveCheckpoints of them).
  uint64_t pinned_staging = 0;
  // NVMe swap space when sized from the layout: the homes plus an eighth for cache copies
  // plus 64 MiB, in whole 4 KiB units.
  uint64_t nvme_capacity() const;

  // Every registered tensor's spec, in registration order (TieredStore::check_plan).
  std::vector<TensorSpec> tensor_specs() const;
  // Element type and bytes per element of a role's tensors (from the strategy's types).
  DType dtype(StateRole role) const;
  uint64_t elem_bytes(StateRole role) const { return dtype_size(dtype(role)); }
};

struct GroupSize {
  std::string name;
  uint64_t numel = 0;
  bool frozen = false;  // parameters only: gathered like any group, never reduced or stepped
};

// Throws ConfigError for an empty model, an empty group, a world below 1, a stage outside
// 1..3 or an alignment that is not a positive multiple of 1024 elements.
ShardLayout make_shard_layout(const std::vector<GroupSize>& groups, ShardStrategy strategy);

}  // namespace strata
