// TieredStore's records (tiered_store.hpp): a tensor's copies, one slot per tier, and
// the moves between them. Shared by the store's files: tiered_store.cpp (construction,
// registration, accounting), tiered_store_access.cpp (fetch, acquire, release, drop),
// tiered_store_moves.cpp (moves and their completion) and tiered_store_eviction.cpp
// (allocation and eviction).
#pragma once

#include <array>
#include <memory>

#include "strata/offload/tiered_store.hpp"

namespace strata {

constexpr int idx(Tier t) { return static_cast<int>(t); }
inline constexpr std::array<Tier, 3> kTiers{Tier::Device, Tier::Pinned, Tier::Nvme};

// A copy of a tensor in one tier.
struct TieredStore::Slot {
  enum class State { Absent, Filling, Valid, Failed };  // what each means: tiered_store.hpp
  State state = State::Absent;
  void* ptr = nullptr;  // Device and Pinned tiers
  Extent extent;        // NVMe tier
  int pins = 0;         // acquire() holders
  int sources = 0;      // in-flight moves reading from this copy
  std::shared_ptr<Move> filling;  // the move writing this copy, while Filling
  // Order of uses of this memory (on sim they carry the virtual times; on real backends
  // all but last_read are complete by the time anyone looks):
  Event ready;      // the write that put the current contents here
  Event last_read;  // moves that read this copy, and work reading it after a release, joined
  Event reuse;      // the memory's previous users are done (from the allocator)
  bool allocated() const { return ptr != nullptr || extent.valid(); }
};

struct TieredStore::Record {
  TensorId id = 0;
  TensorSpec spec;
  std::array<Slot, kTierCount> slots;
  uint64_t last_use = 0;  // LRU tick
  uint64_t writes = 0;    // acquire_for_overwrite calls: tells a refill from the old data
  Slot& at(Tier t) { return slots[idx(t)]; }
  const Slot& at(Tier t) const { return slots[idx(t)]; }
};

struct TieredStore::Move {
  TensorId id = 0;
  Tier from = Tier::Device, to = Tier::Device;
  Event ev;                    // completes when the bytes have arrived
  bool finished = false;       // finish_move ran (under mu_)
  bool free_source = false;    // drop(): free the source copy once this succeeds
  bool external = false;       // device work writing the copy in place (from == to)
  std::shared_ptr<HostEvent> after;  // completed after finish_move, when set
};

}  // namespace strata
