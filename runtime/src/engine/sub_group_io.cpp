#include "sub_group_io.hpp"

namespace strata::engine {

void fetch_update_states(EngineCore& c, const GroupState& gr, const SubGroupState& sg, Tier t) {
  if (t == gr.optimizer_home) return;
  for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq, sg.grad})
    if (id != 0) c.store.fetch(id, t);
  if (gr.master_in_shard && sg.offset == 0) c.store.fetch(gr.param_shard, t);  // the group's master weights
}

bool prefetch_update_states(EngineCore& c, const GroupState& gr, const SubGroupState& sg, Tier t, bool with_grad) {
  if (t == gr.optimizer_home || gr.optimizer_on_device) return true;
  constexpr auto kFree = TieredStore::Room::FreeOnly;
  bool placed = !gr.master_in_shard || sg.offset != 0 || c.store.prefetch(gr.param_shard, t, kFree);
  for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq, with_grad ? sg.grad : TensorId{0}})
    placed = placed && (id == 0 || c.store.prefetch(id, t, kFree));
  return placed;
}

size_t prefetch_states_in_order(EngineCore& c, Tier t, size_t from, uint64_t bytes) {
  size_t i = 0;
  uint64_t issued = 0;
  for (const GroupState& gr : c.groups)
    for (const SubGroupState& sg : gr.sub_groups) {
      if (i++ < from) continue;
      if (issued >= bytes) return i - 1;
      if (gr.frozen || gr.optimizer_on_device || t == gr.optimizer_home) continue;
      ++c.stats.early_state_fetches;
      if (!prefetch_update_states(c, gr, sg, t, false)) {  // gradients still accumulate
        ++c.stats.early_state_fetches_skipped;
        return i - 1;  // tried again at the next gradient, when room may have come
      }
      issued += state_bytes(gr, sg);
    }
  return i;
}

uint64_t state_bytes(const GroupState& gr, const SubGroupState& sg) {
  return (gr.master_in_shard ? 8ull : 12ull) * sg.n;
}

UpdateTensors acquire_for_update(EngineCore& c, SubGroupState& sg, Tier t, bool speculative) {
  UpdateTensors u;
  // master_in_shard: no master of its own (master 0); the caller points m and out[0] into
  // the group's shard and next shard.
  if (sg.master != 0) u.m = c.store.acquire(sg.master, t);
  u.a = c.store.acquire(sg.exp_avg, t);
  u.v = c.store.acquire(sg.exp_avg_sq, t);
  u.gd = c.store.acquire(sg.grad, t);
  u.out[0] = u.m, u.out[1] = u.a, u.out[2] = u.v;
  if (speculative) {
    u.out[0] = sg.next_master != 0 ? c.store.acquire_for_overwrite(sg.next_master, t) : Acquired{};
    u.out[1] = c.store.acquire_for_overwrite(sg.next_exp_avg, t);
    u.out[2] = c.store.acquire_for_overwrite(sg.next_exp_avg_sq, t);
  }
  return u;
}

double update_bytes(const EngineCore& c, const GroupState& gr, const SubGroupState& sg) {
  // The same bytes in place or out of place (the Next set is written, not read): the
  // states and gradient, and the working copy written in 16 bits, or copied in fp32 into
  // a stage-3 shard that is not the master weights itself.
  const HalfKind kind = half_kind(c.work_t);
  const bool copied = c.opts.stage == 3 && !gr.master_in_shard;
  return (24.0 + c.gb) * sg.n + (kind != HalfKind::None ? c.wb * sg.n : copied ? 8.0 * sg.n : 0.0);
}

void release_stepped(EngineCore& c, const GroupState& gr, SubGroupState& sg, Tier t, bool speculative) {
  // Away from home, each copy goes back behind the next update's work (write-back).
  auto done = [&](TensorId id, Access access) {
    if (id == 0) return;  // master_in_shard: the group's shard, released with the group
    c.store.release(id, t, access);
    if (t != gr.optimizer_home) c.store.drop(id, t);
  };
  if (speculative) {
    // The committed set is only read: dropping its copy writes nothing. The gradient is
    // kept until step() validates (it is stepped again if the speculation is undone).
    for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq}) done(id, Access::Read);
    for (TensorId id : {sg.next_master, sg.next_exp_avg, sg.next_exp_avg_sq}) done(id, Access::Write);
    c.store.release(sg.grad, t);
    sg.speculated = true;
  } else {
    for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq}) done(id, Access::Write);
    // The gradient is dead after the update: the next step's first micro-step overwrites
    // it, so no copy of it is written anywhere.
    c.store.release(sg.grad, t);
    c.store.discard_contents(sg.grad);
  }
}

void release_behind(EngineCore& c, SubGroupState& sg, Tier t, const Event& update) {
  for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq, sg.grad})
    if (id != 0) c.store.release(id, t, Access::Read, update);
  for (TensorId id : {sg.next_master, sg.next_exp_avg, sg.next_exp_avg_sq})
    if (id != 0) c.store.release(id, t, Access::Write, update);
  sg.speculated = true;  // its Next set is being written; step() validates it
}

void drop_speculated(EngineCore& c, const GroupState& gr, const SubGroupState& sg, Tier t) {
  if (t == gr.optimizer_home) return;
  // The committed set was only read: dropping its copy writes nothing. The gradient is
  // kept until step() validates (it is stepped again if the speculation is undone).
  for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq, sg.next_master, sg.next_exp_avg, sg.next_exp_avg_sq})
    if (id != 0) c.store.drop(id, t);
}

}  // namespace strata::engine
