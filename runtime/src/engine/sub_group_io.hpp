// A sub-group's tensors around one optimizer update, shared by CPU Adam on the model's
// thread and on the optimizer lane: its states and gradient fetched towards the tier the
// update reads them in, pinned there with the arrays it writes, and let go after.
#pragma once

#include "engine_state.hpp"

namespace strata::engine {

// One host update's tensors in tier t: the states and gradient it reads, and what it
// writes (out: the states themselves, or the Next set when speculative).
struct UpdateTensors {
  Acquired m, a, v, gd, out[3];
};

// Starts the sub-group's states and gradient towards tier t (a hint: acquire waits).
void fetch_update_states(EngineCore& c, const GroupState& gr, const SubGroupState& sg, Tier t);
// Without speculation, as each gradient completes in the last micro-step: the states of
// the sub-groups from the from-th on (counting every sub-group of every group, in the
// order step() steps them) start towards tier t as hints into the room the tier has free
// (TieredStore::Room::FreeOnly), up to `bytes` of states or the first that finds no
// room; returns the index to go on from. The states do not depend on the gradient, so
// the first groups step() takes (the model's first, whose gradients complete last) are
// read first; paced by the gradients, so that the reads share the disk with the backward
// pass rather than queue ahead of it. Counts into EngineStats::early_state_fetches.
size_t prefetch_states_in_order(EngineCore& c, Tier t, size_t from, uint64_t bytes);
// The bytes of a sub-group's fp32 states: master weights (unless the shard is them) and
// both moments.
uint64_t state_bytes(const GroupState& gr, const SubGroupState& sg);
// One sub-group's states (and, with_grad, its complete gradient) towards tier t into free
// room only; false where any found none (nothing further is worth asking for then).
bool prefetch_update_states(EngineCore& c, const GroupState& gr, const SubGroupState& sg, Tier t, bool with_grad);
UpdateTensors acquire_for_update(EngineCore& c, SubGroupState& sg, Tier t, bool speculative);
// The bytes the update moves (host_compute's cost on sim).
double update_bytes(const EngineCore& c, const GroupState& gr, const SubGroupState& sg);
// Unpins a stepped sub-group's states and gradient in tier t (dropped towards their home
// when t is not it); speculative: the Next set was written, the gradient is kept.
void release_stepped(EngineCore& c, const GroupState& gr, SubGroupState& sg, Tier t, bool speculative);
// The optimizer lane's speculative update, queued and not waited for: its tensors in tier
// t are unpinned behind `update` (the work that reads the states and gradient and writes
// the Next set), and once it is done, drop_speculated sends the copies away from home back.
void release_behind(EngineCore& c, SubGroupState& sg, Tier t, const Event& update);
void drop_speculated(EngineCore& c, const GroupState& gr, const SubGroupState& sg, Tier t);

}  // namespace strata::engine
