// TieredStore's room (tiered_store_records.hpp): where copies are placed in a tier's
// pool, what is evicted (or written back) to make room, and freeing and invalidating
// copies.
#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/offload/tiered_store.hpp"
#include "tiered_store_records.hpp"

namespace strata {

// Scratch buffers (gathered parameters, the model's gradients, reduce-scatter outputs:
// they come and go every step) are carved from the high end of a tier's pool, homes and
// cached copies best-fit from the low end. Homes are taken first, so caches pile up above
// them and the scratch buffers below the top: what either side gives back joins the one
// free range between them, and evicting caches widens it rather than opening holes
// between buffers still in use. A working set that fits the budget in total then finds
// it in one piece (Plan.TheEnginesStartUpMinimumIsEnoughAtRunTime).
RangeAllocator::Placement TieredStore::placement(const Record& r) {
  return r.spec.scratch ? RangeAllocator::Placement::High : RangeAllocator::Placement::Low;
}

bool TieredStore::allocate_slot(std::unique_lock<std::mutex>& lock, Record& r, Tier t, bool hint, Room room) {
  const uint64_t bytes = r.spec.bytes;
  for (;;) {
    reap_locked();  // frees that are due come first, whichever thread would have made them
    Slot& s = r.at(t);
    if (s.allocated()) return true;
    if (t == Tier::Nvme) {
      Extent e = nvme_->try_allocate(bytes);
      if (e.valid()) {
        s.extent = e;
        s.reuse = nvme_fences_.covering(e.offset, e.bytes);
        return true;
      }
    } else if (void* p = pool(t)->try_allocate(bytes, r.spec.owner, &s.reuse, placement(r))) {
      s.ptr = p;
      return true;
    }
    if (!(hint && room == Room::FreeOnly) && evict_one(lock, t, r, !hint)) continue;
    if (hint) return false;
    // Nothing evictable now. Moves in flight, and work writing copies it was handed
    // (release with Access::Write and an event), unpin or complete their copies when they
    // finish: wait for one if there are any. Else no room will appear.
    bool moving;
    {
      std::lock_guard<std::mutex> cq(cq_mu_);
      moving = in_flight_ != 0;
    }
    if (!moving) throw_no_room(r, t);
    changed_.wait(lock);
  }
}

uint64_t TieredStore::next_use(TensorId id) const {
  auto it = schedule_pos_.find(id);
  if (it == schedule_pos_.end()) return std::numeric_limits<uint64_t>::max();
  const auto& pos = it->second;
  auto p = std::lower_bound(pos.begin(), pos.end(), position_);
  if (p != pos.end()) return *p - position_;
  return pos.front() + schedule_.size() - position_;  // next step
}

bool TieredStore::evict_one(std::unique_lock<std::mutex>& lock, Tier t, const Record& for_whom, bool write_back) {
  // Space reserved for a move that never started (its caller failed, or is between
  // steps with the lock released and will look again) is reclaimed first.
  for (auto& [id, up] : records_) {
    Record& r = *up;
    const Slot& s = r.at(t);
    if (&r != &for_whom && r.spec.home != t && s.allocated() && s.pins == 0 && s.sources == 0 &&
        (s.state == Slot::State::Absent || s.state == Slot::State::Failed)) {
      free_slot(r, t);
      return true;
    }
  }
  Record* victim = nullptr;
  uint64_t best_next = 0, best_tick = 0;
  const bool by_schedule = !schedule_.empty();
  for (auto& [id, up] : records_) {
    Record& r = *up;
    if (&r == &for_whom || r.spec.home == t) continue;
    for (Tier o : kTiers) settle(r, o);  // moves that landed release their sources
    const Slot& s = r.at(t);
    if (s.state != Slot::State::Valid || s.pins > 0 || s.sources > 0) continue;
    if (!write_back && !valid_elsewhere(r, t)) continue;
    uint64_t nu = by_schedule ? next_use(r.id) : 0;
    bool better = !victim || (by_schedule ? (nu > best_next || (nu == best_next && r.last_use < best_tick))
                                          : r.last_use < best_tick);
    if (better) {
      victim = &r;
      best_next = nu;
      best_tick = r.last_use;
    }
  }
  if (!victim) return false;
  if (valid_elsewhere(*victim, t)) {
    if (still_read(victim->at(t))) ++stats_.evictions_behind_readers;
    free_slot(*victim, t);
    ++stats_.evictions;
    return true;
  }
  // The only valid copy: write it home, then look again (it is clean by then).
  ++stats_.writebacks;
  TensorId vid = victim->id;
  const std::string vname = victim->spec.name;
  const Tier vhome = victim->spec.home;
  Event e = fetch_locked(lock, *victim, vhome);
  lock.unlock();
  try {
    e.wait();
  } catch (const std::exception& ex) {
    lock.lock();
    reap_locked();
    if (auto it = records_.find(vid); it != records_.end()) settle(*it->second, vhome);
    throw Error("making room in the " + std::string(to_string(t)) + " tier: writing '" + vname +
                "' back to its home tier (" + to_string(vhome) + ") failed: " + ex.what() +
                "; its data is kept in the " + to_string(t) + " tier");
  }
  lock.lock();
  reap_locked();
  if (auto it = records_.find(vid); it != records_.end()) settle(*it->second, vhome);
  return true;
}

void TieredStore::throw_no_room(const Record& r, Tier t) const {
  std::ostringstream os;
  TierUsage u = usage(t);
  os << "cannot place tensor '" << r.spec.name << "' (" << format_bytes(r.spec.bytes) << ") in the "
     << to_string(t) << " tier: budget " << format_bytes(u.budget) << ", in use " << format_bytes(u.used)
     << ", and nothing there can be evicted. Largest holders:";
  std::vector<std::pair<uint64_t, std::string>> holders;
  for (const auto& [id, up] : records_) {
    const Slot& s = up->at(t);
    if (!s.allocated()) continue;
    std::string why = up->spec.home == t ? "its home"
                      : s.state == Slot::State::Filling ? "move in flight"
                      : s.pins > 0 ? "acquired"
                      : s.sources > 0 ? "being copied" : "cached";
    holders.emplace_back(up->spec.bytes, "'" + up->spec.name + "' " + format_bytes(up->spec.bytes) + " (" + why + ")");
  }
  std::sort(holders.rbegin(), holders.rend());
  for (size_t i = 0; i < holders.size() && i < 4; ++i) os << (i ? ", " : " ") << holders[i].second;
  if (holders.empty()) os << " none";
  os << ". Raise the " << to_string(t) << " budget, release acquired tensors sooner, or lower the prefetch depth.";
  throw OutOfBudget(os.str());
}

void TieredStore::free_slot(Record& r, Tier t, Event fence) {
  Slot& s = r.at(t);
  if (s.allocated()) {
    Event after = when_done(when_all({idle(s), std::move(fence)}));
    if (s.ptr) pool(t)->free(s.ptr, after);
    if (s.extent.valid()) {
      nvme_fences_.add(s.extent.offset, s.extent.bytes, after);
      nvme_->free(s.extent);
    }
  }
  s = Slot{};
}

void TieredStore::invalidate_others(Record& r, Tier keep) {
  for (Tier t : kTiers) {
    if (t == keep) continue;
    Slot& s = r.at(t);
    if (!s.allocated()) continue;
    STRATA_CHECK(s.sources == 0, "copies reading old data must have landed before a write");
    if (s.pins > 0)
      throw Error("tiered store: '" + r.spec.name + "' was written in the " + to_string(keep) +
                  " tier while still acquired in the " + to_string(t) + " tier; release readers before writing");
    if (t == r.spec.home)
      s.state = Slot::State::Absent;  // reserved, out of date
    else
      free_slot(r, t);
  }
}

bool TieredStore::still_read(const Slot& s) const {
  detail::EventImpl* e = s.last_read.impl();
  if (e == nullptr) return false;
  const double vt = e->virtual_time();
  return vt >= 0 ? vt > device_.now() : !e->ready();
}

bool TieredStore::valid_elsewhere(const Record& r, Tier t) {
  for (Tier o : kTiers)
    if (o != t && r.at(o).state == Slot::State::Valid) return true;
  return false;
}

}  // namespace strata
