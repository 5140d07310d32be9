// TieredStore's operations on a tensor's data (tiered_store_records.hpp): fetch and
// prefetch, acquire and release, drop and flush.
#include "strata/core/error.hpp"
#include "strata/offload/tiered_store.hpp"
#include "tiered_store_records.hpp"

namespace strata {

Event TieredStore::fetch(TensorId id, Tier to) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  r.last_use = ++clock_;
  return fetch_locked(lock, r, to);
}

bool TieredStore::prefetch(TensorId id, Tier to, Room room) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  r.last_use = ++clock_;
  bool refused = false;
  fetch_locked(lock, r, to, &refused, room);
  return !refused;
}

bool TieredStore::reading_from_nvme(const std::string& except_owner) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  for (auto& [id, up] : records_) {
    Record& r = *up;
    if (r.spec.owner == except_owner) continue;
    for (Tier t : {Tier::Device, Tier::Pinned}) {
      settle(r, t);
      const Slot& s = r.at(t);
      if (s.state == Slot::State::Filling && s.filling && s.filling->from == Tier::Nvme) return true;
    }
  }
  return false;
}

Acquired TieredStore::acquire(TensorId id, Tier tier) {
  if (tier == Tier::Nvme) throw Error("tiered store: the nvme tier has no addressable memory; acquire device or pinned");
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  r.last_use = ++clock_;
  Event ev = fetch_locked(lock, r, tier);
  Slot& s = r.at(tier);
  ++s.pins;
  // The holder may write the copy (and release it as written): moves still reading the
  // old contents, and the memory's previous users, must be done first.
  return {s.ptr, when_all({ev, when_done(when_all({s.reuse, s.last_read}))})};
}

Acquired TieredStore::acquire_for_overwrite(TensorId id, Tier tier) {
  if (tier == Tier::Nvme) throw Error("tiered store: the nvme tier has no addressable memory; acquire device or pinned");
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  r.last_use = ++clock_;
  for (;;) {
    // Until one pass finds no copy being filled (each wait releases mu_).
    bool waited = false;
    for (Tier t : kTiers) waited = wait_while_filling(lock, r, t) || waited;
    if (waited) continue;
    Slot& s = r.at(tier);
    if (!s.allocated()) {
      allocate_slot(lock, r, tier);
      continue;
    }
    ++s.pins;
    ++r.writes;
    if (s.state != Slot::State::Valid) s.state = Slot::State::Absent;  // filled by the caller
    return {s.ptr, idle(s)};
  }
}

void TieredStore::release(TensorId id, Tier tier, Access access, Event after) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  Slot& s = r.at(tier);
  if (s.pins <= 0)
    throw Error("tiered store: release of '" + r.spec.name + "' in the " + to_string(tier) +
                " tier, which is not acquired (double release?)");
  settle(r, tier);
  if (access == Access::Write) {
    // Filling is allowed when the caller's own work (`after`) follows the fill in stream
    // order: the new event then supersedes the old one.
    if ((s.state == Slot::State::Filling && after.impl() == nullptr) || s.state == Slot::State::Failed)
      throw Error("tiered store: '" + r.spec.name + "' released as written in the " + to_string(tier) +
                  " tier, but its copy there never became valid (wait on acquire's event)");
    // A move still filling this copy reads from another one, which is about to go:
    // let it land first, as must moves reading the old data elsewhere.
    if (s.state == Slot::State::Filling && !s.filling->external) wait_while_filling(lock, r, tier);
    for (Tier t : kTiers)
      if (t != tier) wait_while_filling(lock, r, t);
    --s.pins;
    try {
      invalidate_others(r, tier);
    } catch (...) {
      ++s.pins;
      throw;
    }
    s.state = Slot::State::Valid;
    s.ready = after;  // the caller waited for acquire's event before writing
    if (after.impl() != nullptr) {
      auto m = std::make_shared<Move>();
      m->id = r.id;
      m->from = m->to = tier;
      m->external = true;
      m->ev = after;
      s.state = Slot::State::Filling;
      s.filling = m;
      enqueue(m->ev, [this, m] { finish_move(m, m->ev.result()); });
    }
  } else {
    --s.pins;
    // Work still reading the copy: whoever writes this memory next waits for it (idle()).
    if (after.impl() != nullptr) s.last_read = when_all({s.last_read, when_done(after)});
    if (s.pins == 0 && s.sources == 0 && tier != r.spec.home &&
        (s.state == Slot::State::Failed || (s.state == Slot::State::Absent && s.allocated())))
      free_slot(r, tier);
  }
  changed_.notify_all();
}

Event TieredStore::drop(TensorId id, Tier tier) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  if (tier == r.spec.home)
    throw Error("tiered store: cannot drop the home copy of '" + r.spec.name + "' (" + to_string(tier) + ")");
  for (;;) {
    for (Tier t : kTiers) settle(r, t);
    Slot& s = r.at(tier);
    const Tier target = staging_tier(tier, r.spec.home) != r.spec.home ? Tier::Pinned : r.spec.home;
    const bool stream_copy = tier != Tier::Nvme && target != Tier::Nvme;
    if (!stream_copy && wait_while_filling(lock, r, tier)) continue;
    if (!s.allocated()) return Event();
    if (s.pins > 0)
      throw Error("tiered store: cannot drop '" + r.spec.name + "' from the " + to_string(tier) +
                  " tier while it is acquired; release it first");
    if (s.sources > 0) {  // copies from it are in flight: let them land
      for (Tier o : kTiers)
        if (r.at(o).state == Slot::State::Filling && r.at(o).filling->from == tier) {
          wait_while_filling(lock, r, o);
          break;
        }
      continue;
    }
    bool another_copy = false;
    for (Tier o : kTiers)
      if (o != tier && r.at(o).state == Slot::State::Valid) another_copy = true;
    if (another_copy || (s.state != Slot::State::Valid && s.state != Slot::State::Filling)) {
      free_slot(r, tier);
      changed_.notify_all();
      return Event();
    }
    // The only (or about to be the only) valid copy: move it one tier down, to its home
    // or to pinned memory on the way to NVMe, and free this copy once that lands.
    // Stream copies chain behind a fill still in flight; nothing here blocks on them.
    // A fill of the destination (by another move) lands first.
    if (wait_while_filling(lock, r, target)) continue;
    Slot& dst = r.at(target);
    if (!dst.allocated()) {
      allocate_slot(lock, r, target);  // may unlock: look again
      continue;
    }
    start_move(lock, r, tier, target);
    // finish_move needs mu_, which is held until return, so these are set in time.
    auto m = r.at(target).filling;
    m->free_source = true;
    auto [done, host] = HostEvent::make();
    m->after = host;
    // The move's own event as well: on sim it carries when the copy lands.
    return when_all({m->ev, done});
  }
}

Event TieredStore::flush(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  return fetch_locked(lock, r, r.spec.home);
}

}  // namespace strata
