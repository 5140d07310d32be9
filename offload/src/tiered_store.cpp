#include "strata/offload/tiered_store.hpp"

#include <algorithm>
#include <limits>
#include <vector>
#include <sstream>

#include "strata/core/error.hpp"

namespace strata {

namespace {
constexpr int idx(Tier t) { return static_cast<int>(t); }
constexpr std::array<Tier, 3> kTiers{Tier::Device, Tier::Pinned, Tier::Nvme};
}  // namespace

// A copy of a tensor in one tier.
struct TieredStore::Slot {
  enum class State { Absent, Filling, Valid, Failed };  // what each means: tiered_store.hpp
  State state = State::Absent;
  void* ptr = nullptr;  // Device and Pinned tiers
  Extent extent;        // NVMe tier
  int pins = 0;         // acquire() holders
  int sources = 0;      // in-flight moves reading from this copy
  std::shared_ptr<Move> filling;  // the move writing this copy, while Filling
  // Order of uses of this memory (complete on real backends by the time anyone looks;
  // on sim they carry the virtual times):
  Event ready;      // the write that put the current contents here
  Event last_read;  // moves that read this copy, joined
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

Event TieredStore::idle(const Slot& s) {
  return when_done(when_all({s.reuse, s.ready, s.last_read, s.filling ? s.filling->ev : Event()}));
}

TieredStore::TieredStore(Device& device, TieredStoreOptions opts) : device_(device), opts_(std::move(opts)) {
  if (opts_.device_budget == 0)
    throw ConfigError("tiered store: the device budget is 0; set strata.device_budget");
  if (opts_.pinned_budget == 0)
    throw ConfigError("tiered store: the pinned budget is 0; set strata.pinned_budget");
  device_pool_ = make_device_arena(device_, opts_.device_budget);
  PinnedOptions po = opts_.pinned;
  po.budget = opts_.pinned_budget;
  pinned_pool_ = make_pinned_pool(device_, po);
  if (!opts_.nvme.paths.empty()) {
    NvmeStoreOptions no = opts_.nvme;
    // The device decides whether data is real: on sim, NVMe transfers are simulated too.
    if (const SimCostModel* cost = device_.cost_model()) no.sim = *cost;
    nvme_ = std::make_unique<NvmeStore>(no);
    nvme_->register_buffer(pinned_pool_->base(), pinned_pool_->capacity());
  }
  to_device_ = device_.create_stream("copy:pinned->device");
  from_device_ = device_.create_stream("copy:device->pinned");
  for (int i = 0; i < 2; ++i) completers_.emplace_back([this] { completer_loop(); });
}

TieredStore::~TieredStore() {
  quiesce();
  {
    std::lock_guard<std::mutex> lock(cq_mu_);
    stopping_ = true;
  }
  cq_cv_.notify_all();
  for (auto& t : completers_) t.join();
  to_device_->synchronize();
  from_device_->synchronize();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, r] : records_)
    for (Tier t : kTiers) free_slot(*r, t);
  records_.clear();
}

TierPool* TieredStore::pool(Tier t) {
  switch (t) {
    case Tier::Device: return device_pool_.get();
    case Tier::Pinned: return pinned_pool_.get();
    case Tier::Nvme: return nullptr;
  }
  return nullptr;
}

bool TieredStore::has_tier(Tier t) const { return t != Tier::Nvme || nvme_ != nullptr; }

TieredStore::Record& TieredStore::rec(TensorId id) {
  auto it = records_.find(id);
  if (it == records_.end()) throw Error("tiered store: unknown tensor id " + std::to_string(id));
  return *it->second;
}

const TieredStore::Record& TieredStore::rec(TensorId id) const {
  auto it = records_.find(id);
  if (it == records_.end()) throw Error("tiered store: unknown tensor id " + std::to_string(id));
  return *it->second;
}

const TensorSpec& TieredStore::spec(TensorId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rec(id).spec;
}

// ---------------------------------------------------------------------------------------
// Registration

TensorId TieredStore::add(const TensorSpec& spec) {
  if (spec.bytes == 0) throw Error("tiered store: tensor '" + spec.name + "' has 0 bytes");
  if (!has_tier(spec.home))
    throw ConfigError("tiered store: tensor '" + spec.name +
                      "' lives on nvme but no NVMe tier is configured; set strata.nvme_path");
  // A tensor whose home is NVMe reaches the device through a pinned staging copy, so
  // it must fit in the pinned tier too; refuse up front rather than on first use.
  auto check_fits = [&](Tier t, const char* why) {
    uint64_t cap = t == Tier::Nvme ? nvme_->capacity() : pool(t)->capacity();
    if (spec.bytes > cap)
      throw OutOfBudget("tensor '" + spec.name + "' (" + format_bytes(spec.bytes) + ") does not fit the " +
                        to_string(t) + " tier's budget of " + format_bytes(cap) + " " + why +
                        "; raise the " + to_string(t) + " budget or split the tensor (smaller sub_group_size)");
  };
  if (spec.scratch && spec.home == Tier::Nvme)
    throw Error("tiered store: scratch tensor '" + spec.name + "' must live in device or pinned memory");
  check_fits(spec.home, "(its home)");
  if (spec.home == Tier::Nvme) check_fits(Tier::Pinned, "(NVMe data is staged through pinned memory)");

  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  auto r = std::make_unique<Record>();
  r->id = next_id_++;
  r->spec = spec;
  Record& ref = *r;
  records_.emplace(ref.id, std::move(r));
  if (!spec.scratch) {
    try {
      allocate_slot(lock, ref, spec.home);
    } catch (...) {
      records_.erase(ref.id);
      throw;
    }
    ref.at(spec.home).state = Slot::State::Valid;  // contents undefined until written
  }
  ref.last_use = ++clock_;
  return ref.id;
}

void TieredStore::remove(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  discard_locked(lock, rec(id));
  records_.erase(id);
}

void TieredStore::discard(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  discard_locked(lock, rec(id));
}

void TieredStore::discard_contents(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  if (r.spec.scratch) return discard_locked(lock, r);
  for (Tier t : kTiers) wait_while_filling(lock, r, t);
  for (Tier t : kTiers)
    if (r.at(t).pins > 0)
      throw Error("tiered store: cannot discard the contents of '" + r.spec.name + "': it is still acquired in the " +
                  to_string(t) + " tier; release it first");
  for (Tier t : kTiers)
    if (t != r.spec.home) free_slot(r, t);
  Slot& home = r.at(r.spec.home);
  STRATA_CHECK(home.allocated(), "tiered store: a tensor without its home reservation");
  home.state = Slot::State::Valid;
  changed_.notify_all();
}

void TieredStore::discard_locked(std::unique_lock<std::mutex>& lock, Record& r) {
  // A fill that has landed needs no wait: the memory it wrote is fenced by it.
  for (Tier t : kTiers) wait_while_filling(lock, r, t);
  for (Tier t : kTiers)
    if (r.at(t).pins > 0)
      throw Error("tiered store: cannot remove or discard '" + r.spec.name + "': it is still acquired in the " +
                  to_string(t) + " tier; release it first");
  for (Tier t : kTiers) free_slot(r, t);
  changed_.notify_all();
}

void TieredStore::check_plan(const std::vector<TensorSpec>& specs, const TieredStoreOptions& opts) {
  std::array<uint64_t, kTierCount> home{};
  uint64_t largest_staged = 0;
  const std::string* largest_name = nullptr;
  for (const auto& s : specs) {
    if (s.scratch) continue;  // takes room only while filled; checked when it is
    home[idx(s.home)] += tier_allocation_bytes(s.bytes);
    if (s.home == Tier::Nvme && s.bytes > largest_staged) {
      largest_staged = s.bytes;
      largest_name = &s.name;
    }
  }
  const std::array<uint64_t, kTierCount> budget{opts.device_budget, opts.pinned_budget,
                                                opts.nvme.paths.empty() ? 0 : opts.nvme.capacity};
  std::ostringstream os;
  for (Tier t : kTiers) {
    if (home[idx(t)] > budget[idx(t)]) {
      os << "the " << to_string(t) << " tier must hold " << format_bytes(home[idx(t)])
         << " of tensors that live there, but its budget is " << format_bytes(budget[idx(t)]);
      if (t == Tier::Nvme && opts.nvme.paths.empty())
        os << " (no nvme_path is set)";
      else
        os << " (strata." << (t == Tier::Device ? "device" : t == Tier::Pinned ? "pinned" : "nvme") << "_budget)";
      os << "; ";
    }
  }
  if (largest_name && largest_staged > opts.pinned_budget)
    os << "tensor '" << *largest_name << "' (" << format_bytes(largest_staged)
       << ") lives on NVMe and is staged through pinned memory, but the pinned budget is only "
       << format_bytes(opts.pinned_budget) << "; ";
  std::string msg = os.str();
  if (!msg.empty())
    throw OutOfBudget("the plan does not fit: " + msg.substr(0, msg.size() - 2) +
                      ". Raise the budgets, offload to a lower tier, or add NVMe capacity.");
}

// ---------------------------------------------------------------------------------------
// Moves

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

Event TieredStore::fetch_locked(std::unique_lock<std::mutex>& lock, Record& r, Tier to, bool* refused) {
  const bool hint = refused != nullptr;
  if (!has_tier(to)) throw ConfigError("tiered store: no NVMe tier is configured; set strata.nvme_path");
  for (;;) {
    settle(r, to);
    Slot& d = r.at(to);
    if (d.state == Slot::State::Valid) return when_all({d.ready});
    if (d.state == Slot::State::Filling) return d.filling->ev;
    if (!d.allocated()) {
      if (!allocate_slot(lock, r, to, hint)) {  // a hint finding no room
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
      Event staged = fetch_locked(lock, r, via, refused);  // may unlock
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
// Allocation and eviction

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

bool TieredStore::allocate_slot(std::unique_lock<std::mutex>& lock, Record& r, Tier t, bool hint) {
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
    if (evict_one(lock, t, r, !hint)) continue;
    if (hint) return false;
    // Nothing evictable now. Moves in flight will unpin their sources when they finish;
    // wait for one if there are any. Else the room maker may release pins; else no room
    // will appear.
    bool moving;
    {
      std::lock_guard<std::mutex> cq(cq_mu_);
      moving = in_flight_ != 0;
    }
    if (moving) {
      changed_.wait(lock);
      continue;
    }
    if (!room_maker_ || making_room_) throw_no_room(r, t);
    making_room_ = true;
    const std::function<bool()> maker = room_maker_;
    lock.unlock();
    bool made = false;
    try {
      made = maker();
    } catch (...) {
      lock.lock();
      making_room_ = false;
      throw;
    }
    lock.lock();
    making_room_ = false;
    if (!made) throw_no_room(r, t);
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

void TieredStore::set_room_maker(std::function<bool()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  room_maker_ = std::move(fn);
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

// ---------------------------------------------------------------------------------------
// Public operations

Event TieredStore::fetch(TensorId id, Tier to) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  r.last_use = ++clock_;
  return fetch_locked(lock, r, to);
}

bool TieredStore::prefetch(TensorId id, Tier to) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  r.last_use = ++clock_;
  bool refused = false;
  fetch_locked(lock, r, to, &refused);
  return !refused;
}

bool TieredStore::valid_elsewhere(const Record& r, Tier t) {
  for (Tier o : kTiers)
    if (o != t && r.at(o).state == Slot::State::Valid) return true;
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

void TieredStore::release(TensorId id, Tier tier, Access access, Event written) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  Slot& s = r.at(tier);
  if (s.pins <= 0)
    throw Error("tiered store: release of '" + r.spec.name + "' in the " + to_string(tier) +
                " tier, which is not acquired (double release?)");
  settle(r, tier);
  if (access == Access::Write) {
    // Filling is allowed when the caller's own device work (`written`) follows the fill
    // in stream order: the new event then supersedes the old one.
    if ((s.state == Slot::State::Filling && written.impl() == nullptr) || s.state == Slot::State::Failed)
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
    s.ready = written;  // the caller waited for acquire's event before writing
    if (written.impl() != nullptr) {
      auto m = std::make_shared<Move>();
      m->id = r.id;
      m->from = m->to = tier;
      m->external = true;
      m->ev = written;
      s.state = Slot::State::Filling;
      s.filling = m;
      enqueue(m->ev, [this, m] { finish_move(m, m->ev.result()); });
    }
  } else {
    --s.pins;
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

void TieredStore::set_schedule(std::vector<TensorId> order) {
  std::lock_guard<std::mutex> lock(mu_);
  schedule_ = std::move(order);
  schedule_pos_.clear();
  for (size_t i = 0; i < schedule_.size(); ++i) schedule_pos_[schedule_[i]].push_back(i);
  position_ = 0;
}

void TieredStore::set_position(size_t pos) {
  std::lock_guard<std::mutex> lock(mu_);
  position_ = schedule_.empty() ? 0 : pos % schedule_.size();
}

bool TieredStore::is_valid(TensorId id, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& s = rec(id).at(tier);
  return s.state == Slot::State::Valid ||
         (s.state == Slot::State::Filling && s.filling->ev.ready() && !s.filling->ev.result());
}

TierUsage TieredStore::usage(Tier t) const {
  if (t != Tier::Nvme) return (t == Tier::Device ? device_pool_ : pinned_pool_)->usage();
  TierUsage u;
  if (!nvme_) return u;
  u.budget = nvme_->capacity();
  u.used = nvme_->used();
  u.peak = nvme_->peak();
  for (const auto& [id, r] : records_)
    if (r->at(Tier::Nvme).extent.valid()) u.by_owner[r->spec.owner] += r->at(Tier::Nvme).extent.bytes;
  return u;
}

StoreStats TieredStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StoreStats s = stats_;
  for (Tier t : kTiers) s.tiers[idx(t)] = usage(t);
  return s;
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
