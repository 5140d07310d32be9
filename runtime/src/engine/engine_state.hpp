// What the engine's parts share: each group's sizes and store tensors (from the resolved
// layout, fixed at start-up), its sub-groups, and EngineCore, the references every part
// works through (device, communicators, store, statistics). The parts own the rest of
// their state: the Gatherer a group's gathered buffer, the GradientReducer its gradient
// buffers, the speculation the lane's records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/core/trace.hpp"
#include "strata/offload/cpu_adam.hpp"
#include "strata/offload/tiered_store.hpp"
#include "strata/runtime/engine/engine_options.hpp"
#include "strata/runtime/engine/resolve.hpp"

namespace strata::engine {

// One optimizer sub-group of a group's shard (shard_layout.hpp's SubGroup) and its tensors.
struct SubGroupState {
  uint64_t offset = 0;  // elements into the rank's shard
  uint64_t n = 0;       // elements
  // fp32, home the group's optimizer tier. master is 0 where the group's parameter shard
  // is its master weights (GroupState::master_in_shard).
  TensorId master = 0, exp_avg = 0, exp_avg_sq = 0;
  TensorId grad = 0;  // the reduced, accumulated gradient, of the layout's gradient type
  // Speculative sub-groups: the Next set, swapped with the one above when a speculative
  // step is committed.
  TensorId next_master = 0, next_exp_avg = 0, next_exp_avg_sq = 0;
  bool has_next = false;    // a speculative sub-group (SubGroup::speculative)
  bool speculated = false;  // this step's update sits in the Next set, not yet validated
  double grad_sumsq = 0;    // squared norm of the accumulated gradient (written on the reduce stream)
};

struct GroupState {
  GroupSpec spec;
  uint64_t padded = 0;  // elements, as the layout pads
  uint64_t shard = 0;   // elements per rank
  bool persistent = false;
  // Not trained (GroupLayout::frozen): param_shard / gathered only; every gradient id is
  // 0 and sub_groups is empty.
  bool frozen = false;
  Tier optimizer_home = Tier::Device;  // its states' home (offload_optimizer.ratio may split groups)
  bool optimizer_on_device = false;    // stepped by the GPU optimizer
  // The parameter shard is the master weights (GroupLayout::master_in_shard): its
  // sub-groups have no master of their own and are stepped in their range of
  // param_shard; a speculative step writes next_param_shard, swapped in at the commit.
  bool master_in_shard = false;
  // Tensors, of the working type unless noted (shard_layout.hpp's StateRole).
  TensorId gathered = 0;          // [padded] stage 3: scratch gather buffer; else the replicated parameters
  TensorId param_shard = 0;       // [shard] stage 3: working parameters, home offload_param
  TensorId param_secondary = 0;   // [padded / hpz] stage 3 with hpZ: this rank's secondary partition; 0 without
  TensorId quantized = 0;         // stage 3 with qwZ: bytes, the shard quantized then every rank's; 0 without
  TensorId next_param_shard = 0;  // [shard] fp32, master_in_shard and speculative
  TensorId grad_full = 0;         // [padded] the model's gradient of one micro-batch
  bool grad_full_scratch = true;  // false: held across backward in a device home (first_gradient_held)
  TensorId grad_accumulated = 0;  // [padded] stage 1: accumulated gradient (reduced type), home device
  TensorId grad_reduced = 0;      // [shard] stages 2, 3: reduce-scatter output, scratch
  TensorId quantized_reduce = 0;  // stages 2, 3 with qgZ: bytes (qgz_scratch_bytes), scratch; 0 without
  std::vector<SubGroupState> sub_groups;
};

// A sub-group to step, with its group.
struct Update {
  GroupState* group;
  SubGroupState* sub;
};

// The references and constants every part uses. The engine owns what they point to.
struct EngineCore {
  Device& device;
  coll::Communicator& comm;       // device buffers
  coll::Communicator& host_comm;  // host scalars (norms)
  const ResolvedLayout& resolved;
  const EngineOptions& opts;      // resolved.options
  TieredStore& store;
  CpuAdam& adam;
  Stream& reduce_stream;          // gradient accumulation, norms, host<->device copies of the engine
  std::vector<GroupState>& groups;
  EngineStats& stats;
  DType work_t = DType::F32, grad_t = DType::F32;  // the working and reduced-gradient types
  uint64_t wb = 4, gb = 4;                          // their bytes
  int world = 1, rank = 0;  // of `comm`: the ranks the states are sharded over
  // MiCS: the ranks holding the same shard in the other groups, across which each reduced
  // gradient is all-reduced; nullptr otherwise. data_parallel: every rank whose gradient
  // is summed (world x the replicas), which the averaging divides by.
  coll::Communicator* replicas = nullptr;
  int data_parallel = 1;
  // hpZ: the consecutive ranks that share secondary partitions, and this rank's index
  // among them (which slice of a gathered group its secondary keeps); nullptr otherwise.
  coll::Communicator* secondary = nullptr;
  int secondary_rank = 0;
  // qgZ in two hops (qgz_hierarchical): this rank's node, and the ranks with its index in
  // every node; nullptr otherwise (one all-to-all over comm).
  coll::Communicator* qgz_node = nullptr;
  coll::Communicator* qgz_cross = nullptr;

  // An exposed wait of the model's thread ended now: counted, and traced.
  void waited(double since, const char* what, const GroupState* g) const;
  // A collective's ring bytes sent by this rank (EngineStats::*_collective_bytes), for a
  // whole buffer of `elems` elements of `bytes` each over `n` ranks; `all_reduce` doubles.
  static uint64_t ring_bytes(uint64_t elems, uint64_t bytes, int n, bool all_reduce) {
    const uint64_t b = elems * bytes / static_cast<uint64_t>(n) * static_cast<uint64_t>(n - 1);
    return all_reduce ? 2 * b : b;
  }
  void sent_in_shard(uint64_t elems, uint64_t bytes, bool all_reduce = false) const {
    stats.shard_collective_bytes += ring_bytes(elems, bytes, world, all_reduce);
  }
  void sent_to_replicas(uint64_t elems, uint64_t bytes) const {
    stats.replica_collective_bytes += ring_bytes(elems, bytes, replicas->size(), true);
  }
  // An all-to-all of `part` bytes to each of n ranks: n - 1 parts leave this rank.
  static uint64_t all_to_all_bytes(uint64_t part, int n) { return part * static_cast<uint64_t>(n - 1); }
  void sent_in_secondary(uint64_t elems, uint64_t bytes) const {
    stats.secondary_collective_bytes += ring_bytes(elems, bytes, secondary->size(), false);
  }
};

inline coll::ConstView view(const void* p, uint64_t n, DType t) { return coll::ConstView::elements(p, n, t); }
inline coll::MutView view_mut(void* p, uint64_t n, DType t) { return coll::MutView::elements(p, n, t); }
inline const void* at(const void* p, uint64_t elems, uint64_t elem_bytes) {
  return static_cast<const std::byte*>(p) + elems * elem_bytes;
}
inline void* at(void* p, uint64_t elems, uint64_t elem_bytes) { return static_cast<std::byte*>(p) + elems * elem_bytes; }
inline HalfKind half_kind(DType t) {
  return t == DType::BF16 ? HalfKind::Bf16 : t == DType::F16 ? HalfKind::Fp16 : HalfKind::None;
}

}  // namespace strata::engine
