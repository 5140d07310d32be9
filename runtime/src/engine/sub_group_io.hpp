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
