// TieredStore's moves between tiers (tiered_store_records.hpp): choosing a source and a
// staging tier, starting copies and NVMe I/O, and finishing them as they complete.
#include <algorithm>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/offload/tiered_store.hpp"
#include "tiered_store_records.hpp"

namespace strata {

// ---------------------------------------------------------------------------------------
// Moves

Event TieredStore::idle(const Slot& s) {
  return when_done(when_all({s.reuse, s.ready, s.last_read, s.filling ? s.filling->ev : Event()}));
}

Tier TieredStore::staging_tier(Tier from, Tier to) const {
  // NVMe I/O goes through pinned memory: O_DIRECT needs aligned host buffers that are
  // registered with the ring, and a GPU's memory cannot be the target of a read.
  if ((from == Tier::Nvme && to == Tier::Device) || (from == Tier::Device && to == Tier::Nvme))
    return Tier::Pinned;
  return to;
}

void TieredStore::wait_unlocked(std::unique_lock<std::mutex>& lock, const Event& e) {
  lock.unlock();
  try {
    e.wait();
  } catch (...) {
    // The failure reaches the state through settle()/finish_move and the caller through
    // the move's own event.
  }
  lock.lock();
  reap_locked();
}

void TieredStore::settle(Record& r, Tier t) {
  Slot& s = r.at(t);
  if (s.state != Slot::State::Filling || !s.filling->ev.ready()) return;
  std::shared_ptr<Move> m = s.filling;  // a copy: finish_move resets s.filling
  finish_move(m, m->ev.result());
}

bool TieredStore::wait_while_filling(std::unique_lock<std::mutex>& lock, Record& r, Tier t) {
  settle(r, t);  // a fill that has landed needs no wait
  bool waited = false;
  while (r.at(t).state == Slot::State::Filling) {
    Event e = r.at(t).filling->ev;  // a copy: the slot may change while mu_ is released
    wait_unlocked(lock, e);
    settle(r, t);
    waited = true;
  }
  return waited;
}

void TieredStore::finish_move(const std::shared_ptr<Move>& m, std::exception_ptr err) {
  if (m->finished) return;
  m->finished = true;
  auto it = records_.find(m->id);
  STRATA_CHECK(it != records_.end(), "a move finished for a tensor that was removed mid-move");
  Record& r = *it->second;
  Slot& src = r.at(m->from);
  Slot& dst = r.at(m->to);
  if (!m->external) {
    STRATA_CHECK(src.sources > 0, "move source was not marked");
    --src.sources;
  }
  if (dst.filling == m) {
    dst.filling = nullptr;
    if (!err) {
      dst.state = Slot::State::Valid;
    } else {
      ++stats_.failed_moves;
      dst.state = Slot::State::Failed;
      if (m->to == r.spec.home)
        dst.state = Slot::State::Absent;  // home stays reserved, out of date
      else if (dst.pins == 0 && dst.sources == 0)
        free_slot(r, m->to);
    }
  }
  if (m->free_source) settle(r, m->from);  // a fill of the source may have landed unseen
  const bool src_idle = !m->external && src.pins == 0 && src.sources == 0 && m->from != r.spec.home;
  if (src_idle && (src.state == Slot::State::Failed || (!err && m->free_source && src.state == Slot::State::Valid)))
    free_slot(r, m->from);
  if (m->after) m->after->complete(err);
  changed_.notify_all();
}

Event TieredStore::fetch_locked(std::unique_lock<std::mutex>& lock, Record& r, Tier to, bool* refused, Room room) {
  const bool hint = refused != nullptr;
  if (!has_tier(to)) throw ConfigError("tiered store: no NVMe tier is configured; set strata.nvme_path");
  for (;;) {
    settle(r, to);
    Slot& d = r.at(to);
    if (d.state == Slot::State::Valid) return when_all({d.ready});
    if (d.state == Slot::State::Filling) return d.filling->ev;
    if (!d.allocated()) {
      if (!allocate_slot(lock, r, to, hint, room)) {  // a hint finding no room
        *refused = true;
        return Event();
      }
      continue;  // it may have unlocked: look again
    }
    // Pick the nearest source holding (or about to hold) the data.
    std::array<Tier, 2> prefs{Tier::Pinned, Tier::Nvme};
    switch (to) {
      case Tier::Device: prefs = {Tier::Pinned, Tier::Nvme}; break;
      case Tier::Pinned: prefs = {Tier::Device, Tier::Nvme}; break;
      case Tier::Nvme: prefs = {Tier::Pinned, Tier::Device}; break;
    }
    Tier from = to;
    for (Tier t : prefs) settle(r, t);
    for (Tier t : prefs)
      if (r.at(t).state == Slot::State::Valid) {
        from = t;
        break;
      }
    if (from == to)
      for (Tier t : prefs)
        if (r.at(t).state == Slot::State::Filling) {
          from = t;
          break;
        }
    if (from == to) {
      STRATA_CHECK(r.spec.scratch, "tensor '" + r.spec.name + "' has no valid copy in any tier");
      throw Error("tiered store: scratch tensor '" + r.spec.name +
                  "' holds no data; fill it with acquire_for_overwrite first");
    }
    Tier via = staging_tier(from, to);
    if (via != to) {
      // Make (or start) the pinned copy first, then move it on from there. This must not
      // loop back through source selection: a staging read that fails at once would be
      // retried forever. Its failure is this fetch's failure.
      Event staged = fetch_locked(lock, r, via, refused, room);  // may unlock
      if (hint && *refused) return Event();
      settle(r, to);
      if (d.state == Slot::State::Valid) return when_all({d.ready});
      if (d.state == Slot::State::Filling) return d.filling->ev;
      if (!d.allocated()) continue;
      settle(r, via);
      Slot::State vs = r.at(via).state;
      if (vs != Slot::State::Valid && vs != Slot::State::Filling) return staged;
      if (vs == Slot::State::Filling && to == Tier::Nvme) {
        Event e = r.at(via).filling->ev;  // the I/O engine cannot wait on a copy stream
        wait_while_filling(lock, r, via);
        if (r.at(via).state != Slot::State::Valid) return e;  // its failure is this fetch's
        continue;
      }
      return start_move(lock, r, via, to);
    }
    // The I/O engine cannot wait on a copy stream: let the source land first (a hint
    // does not wait).
    if (hint && (from == Tier::Nvme || to == Tier::Nvme) && r.at(from).state == Slot::State::Filling) {
      *refused = true;
      return Event();
    }
    if ((from == Tier::Nvme || to == Tier::Nvme) && wait_while_filling(lock, r, from)) continue;
    return start_move(lock, r, from, to);
  }
}

Event TieredStore::start_move(std::unique_lock<std::mutex>&, Record& r, Tier from, Tier to) {
  Slot& s = r.at(from);
  Slot& d = r.at(to);
  auto m = std::make_shared<Move>();
  m->id = r.id;
  m->from = from;
  m->to = to;
  const uint64_t bytes = r.spec.bytes;
  // After the source's data is in place and the destination's memory is idle.
  const Event src_ready = s.state == Slot::State::Filling ? s.filling->ev : s.ready;
  const Event after = when_all({src_ready, idle(d)});
  if (to == Tier::Device || (from == Tier::Device && to == Tier::Pinned)) {
    Stream& st = to == Tier::Device ? *to_device_ : *from_device_;
    st.wait(after);
    st.copy_async(d.ptr, s.ptr, bytes);
    m->ev = st.record();
  } else if (to == Tier::Nvme) {
    m->ev = nvme_->write(d.extent, s.ptr, bytes, after);
  } else {
    STRATA_CHECK(from == Tier::Nvme && to == Tier::Pinned, "unexpected move");
    m->ev = nvme_->read(s.extent, d.ptr, bytes, after);
  }
  s.last_read = when_all({s.last_read, when_done(m->ev)});
  d.ready = m->ev;
  d.last_read = Event();  // the move waited for them
  ++s.sources;
  d.state = Slot::State::Filling;
  d.filling = m;
  ++stats_.moves;
  stats_.bytes_moved[idx(from)][idx(to)] += bytes;
  stats_.bytes_moved_by_owner[r.spec.owner][idx(from)][idx(to)] += bytes;
  enqueue(m->ev, [this, m] { finish_move(m, m->ev.result()); });
  return m->ev;
}

// ---------------------------------------------------------------------------------------
// Completion

void TieredStore::enqueue(Event ev, std::function<void()> fn) {
  auto c = std::make_shared<Completion>();
  c->ev = std::move(ev);
  c->fn = std::move(fn);
  {
    std::lock_guard<std::mutex> lock(cq_mu_);
    completions_.push_back(std::move(c));
    ++in_flight_;
  }
  cq_cv_.notify_one();
}

void TieredStore::discard_after(TensorId id, Event after) {
  uint64_t writes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writes = rec(id).writes;  // unknown ids fail here, not on the completion thread
  }
  enqueue(after, [this, id, writes, after] {
    auto it = records_.find(id);
    if (it == records_.end()) return;
    Record& r = *it->second;
    if (r.writes != writes) return;  // refilled since: the new contents are not ours to drop
    for (Tier t : kTiers) settle(r, t);
    for (Tier t : kTiers)
      if (r.at(t).pins > 0 || r.at(t).state == Slot::State::Filling || r.at(t).sources > 0) return;  // in use again
    for (Tier t : kTiers) free_slot(r, t, after);  // `after` read it last
  });
}

void TieredStore::reap_locked() {
  std::vector<std::shared_ptr<Completion>> due;
  {
    std::lock_guard<std::mutex> lock(cq_mu_);
    for (auto it = completions_.begin(); it != completions_.end();) {
      if ((*it)->ev.ready()) {
        due.push_back(std::move(*it));
        it = completions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (due.empty()) return;
  for (auto& c : due) c->fn();
  {
    std::lock_guard<std::mutex> lock(cq_mu_);
    in_flight_ -= due.size();
  }
  cq_cv_.notify_all();
  changed_.notify_all();
}

void TieredStore::completer_loop() {
  for (;;) {
    std::shared_ptr<Completion> c;
    {
      std::unique_lock<std::mutex> lock(cq_mu_);
      auto untaken = [&] {
        return std::find_if(completions_.begin(), completions_.end(), [](const auto& x) { return !x->taken; });
      };
      cq_cv_.wait(lock, [&] { return stopping_ || untaken() != completions_.end(); });
      auto it = untaken();
      if (it == completions_.end()) return;  // stopping, and nothing left to wait for
      c = *it;
      c->taken = true;
    }
    c->ev.result();  // waits in real time; fn reads how it ended
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool mine = false;
      {
        std::lock_guard<std::mutex> cq(cq_mu_);
        auto it = std::find(completions_.begin(), completions_.end(), c);
        if (it != completions_.end()) {
          completions_.erase(it);
          mine = true;
        }
      }
      if (!mine) continue;  // a caller finished it first (reap_locked)
      c->fn();
      {
        std::lock_guard<std::mutex> cq(cq_mu_);
        --in_flight_;
      }
      changed_.notify_all();  // allocate_slot() waits on changed_ for in-flight moves to end
    }
    cq_cv_.notify_all();
  }
}

void TieredStore::quiesce() {
  std::unique_lock<std::mutex> lock(cq_mu_);
  cq_cv_.wait(lock, [&] { return in_flight_ == 0; });
}

}  // namespace strata
