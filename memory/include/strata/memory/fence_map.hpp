// Fences on freed memory: for each range of a tier, the event after which its last user
// (a copy reading it, device work writing it, an NVMe transfer) is done with it.
//
// Memory is handed back as soon as its owner is done *issuing* work on it; that work may
// still run. Whoever gets the range next must not write it before the fence, so an
// allocation returns the fence of every range it reuses, and the writer waits on it. On
// real backends the fences are nearly always complete already (a copy is freed once its
// event completes); on the sim backend, where every event is complete in real time, they
// are what keeps simulated memory reuse honest.
//
// Not thread-safe: owners lock around it, as around their RangeAllocator.
#pragma once

#include <cstdint>
#include <map>

#include "strata/core/event.hpp"

namespace strata {

class FenceMap {
 public:
  // [offset, offset+bytes) is free after `fence` (joined with what was there before).
  void add(uint64_t offset, uint64_t bytes, Event fence);
  // The fence of everything overlapping [offset, offset+bytes).
  Event covering(uint64_t offset, uint64_t bytes) const;
  size_t ranges() const { return fences_.size(); }  // disjoint ranges held

 private:
  struct Fenced {
    uint64_t end = 0;
    Event fence;
  };
  std::map<uint64_t, Fenced> fences_;  // begin -> [begin, end) and its fence; disjoint
};

}  // namespace strata
