// The tiered store: the memory manager that knows where every tensor is across device
// memory, pinned host memory and NVMe, moves tensors between tiers asynchronously, and
// never lets a tier exceed its budget.
//
// Model (the contract every caller of the store relies on):
//  - Every tensor has a home tier. Its home copy is reserved when the tensor is added
//    and is never evicted; copies in other tiers are caches.
//  - A copy is Absent (no valid data: not allocated, reserved but out of date, or
//    handed out for overwrite), Filling (a move or the caller's device work is writing
//    it; the slot has its event), Valid, or Failed (the move filling it failed while it
//    was acquired or being read from; it is freed once let go, or filled again by the
//    next fetch). A home copy whose fill fails goes back to Absent: its space stays
//    reserved. The copy states are Slot::State in tiered_store_records.hpp.
//    When a copy is written (release with Access::Write) every other copy becomes stale:
//    non-home copies are freed, the home copy is marked out of date until written back.
//  - Moves return events. Readers wait on events; nothing polls.
//  - When a tier is full, the store evicts cache copies that are not pinned: the one
//    needed furthest in the future when a schedule is set, the least recently used
//    otherwise. A copy that is the only valid one is first written back to its home.
//    When nothing can be evicted, OutOfBudget names the tensor, the tier, its budget
//    and the largest holders.
//  - A failed move (I/O error, checksum mismatch) fails its event and leaves the
//    destination invalid; the source copy is kept, so nothing already saved is lost.
//  - Memory is reused only after its last user: each copy remembers the write that
//    filled it and the moves that read it, a freed range keeps that as its fence
//    (memory/fence_map.hpp), and whoever writes the range next waits for the fence. On
//    the sim backend, where every event is complete in real time at once, this is what
//    keeps simulated memory reuse honest; elsewhere the fences are complete already.
//  - Completions are finished by background threads and also, before anything else,
//    by every call into the store (all that are complete by then, in submission order),
//    so that what a caller sees depends only on which events are complete, not on when
//    the background threads ran: runs on the sim backend are deterministic.
//
// Thread-safety: every member may be called from any thread. Callers must not write a
// tensor (acquire_for_overwrite, release with Access::Write) while another thread reads
// or moves the same tensor; different tensors are independent.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/event.hpp"
#include "strata/memory/fence_map.hpp"
#include "strata/memory/tier.hpp"
#include "strata/offload/nvme_store.hpp"

namespace strata {


using TensorId = uint32_t;

struct TensorSpec {
  std::string name;        // for messages and traces, e.g. "block.3.params.shard"
  uint64_t bytes = 0;      // payload bytes
  DType dtype = DType::F32;
  Tier home = Tier::Pinned;
  std::string owner = "tensors";  // accounting group, e.g. "params", "optimizer"
  // Scratch: no home copy is reserved at add(); space is taken by acquire_for_overwrite
  // and given back by discard(). For transient buffers (gathered parameters, gradients
  // before reduction) that count against the budget only while they exist.
  bool scratch = false;
};

struct TieredStoreOptions {
  uint64_t device_budget = 0;   // bytes of device memory the store may hold
  uint64_t pinned_budget = 0;   // bytes of pinned host memory
  PinnedOptions pinned;         // NUMA placement and locking (its budget is ignored)
  // NVMe tier; leave nvme.paths empty for a store without one.
  NvmeStoreOptions nvme;
};

enum class Access { Read, Write };

// A pinned copy of a tensor in a memory tier: data is usable once ready completes.
struct Acquired {
  void* data = nullptr;
  Event ready;
};

struct StoreStats {
  std::array<TierUsage, kTierCount> tiers;  // indexed by Tier
  uint64_t moves = 0;                       // moves started
  std::array<std::array<uint64_t, kTierCount>, kTierCount> bytes_moved{};  // [from][to], bytes
  // The same per accounting owner (TensorSpec::owner): what each kind of tensor moved.
  std::map<std::string, std::array<std::array<uint64_t, kTierCount>, kTierCount>> bytes_moved_by_owner;
  uint64_t evictions = 0;
  uint64_t writebacks = 0;                  // evictions that wrote the only copy home first
  // Evictions of a copy that work released behind it (release with Access::Read and an
  // event) was still reading: its memory went to the next user, who waits for that work.
  uint64_t evictions_behind_readers = 0;
  uint64_t failed_moves = 0;
};

class TieredStore {
 public:
  TieredStore(Device& device, TieredStoreOptions opts);
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // Registers a tensor and reserves its home copy (contents undefined until written).
  // Throws OutOfBudget, before any data moves, when the home tier cannot hold it even
  // after evicting every cache copy, or when the tensor is larger than a tier it must
  // pass through.
  TensorId add(const TensorSpec& spec);
  // Checks, before anything is allocated, that the tensors' home copies fit their tiers'
  // budgets; throws OutOfBudget with the totals and the fix otherwise.
  static void check_plan(const std::vector<TensorSpec>& specs, const TieredStoreOptions& opts);
  void remove(TensorId id);  // waits for moves of this tensor; frees every copy

  // Starts making a valid copy in `to` (no-op when there is one). Does not pin it.
  Event fetch(TensorId id, Tier to);
  // fetch() as a hint: only into room the tier has, or can make by freeing cache copies
  // that hold nothing new (a valid copy is elsewhere). It never writes a copy home to
  // make room and never waits for a move in flight: where it would have to, it places
  // nothing and returns false. Data a later step may find dead
  // (a gradient kept for a rollback) is then not written out only to be thrown away.
  // Room::FreeOnly: only into room the tier has free now; no copy is evicted for it (a
  // prefetch for work further off than what the tier's cache copies serve).
  enum class Room { MayEvictClean, FreeOnly };
  bool prefetch(TensorId id, Tier to, Room room = Room::MayEvictClean);
  // Whether a copy of a tensor whose owner (TensorSpec::owner) is not `except_owner` is
  // being read from NVMe now: work that may wait does not compete with it for the disk.
  bool reading_from_nvme(const std::string& except_owner);
  // Pins a copy in a memory tier (Device or Pinned) against eviction, fetching it if
  // needed. data is valid once ready completes (ready rethrows a failed move); ready
  // also covers moves still reading the copy, so the holder may write it after ready.
  Acquired acquire(TensorId id, Tier tier);
  // Pins space in `tier` whose contents the caller will overwrite entirely; no fetch.
  // Write it only after ready: the memory's previous users are done then.
  Acquired acquire_for_overwrite(TensorId id, Tier tier);
  // Unpins. Access::Write: this copy now holds the only valid data. `after`, when given,
  // is the event of the work still using the copy once it is unpinned (work the holder
  // queued, on a device or a host stream, and does not wait for):
  //  - Access::Write: the work that writes it. Until it completes the copy counts as being
  //    filled: moves from it wait for it, and it is not evicted.
  //  - Access::Read: the work that reads it. The copy may be evicted, dropped or replaced
  //    at once, but its memory is not written (by a move into it, or by whoever is given
  //    it next) until that work is done, as for a move reading from it. So a holder whose
  //    reads run beside the caller need not keep its pins, and the store never waits on
  //    anyone but its own queue to make room.
  void release(TensorId id, Tier tier, Access access = Access::Read, Event after = {});
  // Frees the copy in a non-home tier. When it is the only valid copy it first moves one
  // tier down: to its home, or to pinned memory on the way to an NVMe home (drop that
  // one in turn to reach NVMe). A copy still being filled by a stream copy or by device
  // work is moved behind it without blocking. The event completes when the copy is gone.
  Event drop(TensorId id, Tier tier);
  // Writes the tensor home if the home copy is out of date.
  Event flush(TensorId id);
  // Frees every copy; the contents are gone (a scratch tensor can be filled again).
  void discard(TensorId id);
  // discard() once `after` completes (the last device work reading the tensor).
  void discard_after(TensorId id, Event after);
  // The contents are dead: the caller overwrites the whole tensor (acquire_for_overwrite)
  // before anyone reads it again. Every copy but the home reservation is freed without
  // being written anywhere (no write-back of data nobody reads); the home copy stays
  // reserved and counts as current, its bytes undefined. A scratch tensor: discard().
  void discard_contents(TensorId id);

  // Eviction order: the tensors in the order they will be used (one step), and where in
  // it the run now is. Without a schedule, least recently used goes first.
  void set_schedule(std::vector<TensorId> order);
  void set_position(size_t pos);

  bool is_valid(TensorId id, Tier tier) const;  // a completed, valid copy exists there
  const TensorSpec& spec(TensorId id) const;
  StoreStats stats() const;
  TierUsage usage(Tier t) const;
  bool has_tier(Tier t) const;
  NvmeStore* nvme() { return nvme_.get(); }
  TierPool* pool(Tier t);

  // Waits until every move started so far has finished (errors are not rethrown here;
  // they were delivered through the moves' events).
  void quiesce();

 private:
  struct Slot;
  struct Record;
  struct Move;

  // When a copy's memory is idle: its previous users, its fill and its readers are done.
  // Whoever writes the copy, or reuses its memory once it is freed, waits for this.
  static Event idle(const Slot& s);
  // Whether r has a valid copy in a tier other than t (its copy in t holds nothing new).
  static bool valid_elsewhere(const Record& r, Tier t);
  // Whether work released behind the copy (or a move) may still be reading it now.
  bool still_read(const Slot& s) const;
  Record& rec(TensorId id);
  const Record& rec(TensorId id) const;
  // With `refused` given, prefetch()'s rules: where they place nothing, *refused is set.
  Event fetch_locked(std::unique_lock<std::mutex>& lock, Record& r, Tier to, bool* refused = nullptr,
                     Room room = Room::MayEvictClean);
  Event start_move(std::unique_lock<std::mutex>& lock, Record& r, Tier from, Tier to);
  // hint: prefetch()'s rules; false when it found no room under them.
  bool allocate_slot(std::unique_lock<std::mutex>& lock, Record& r, Tier t, bool hint = false,
                     Room room = Room::MayEvictClean);
  static RangeAllocator::Placement placement(const Record& r);
  // write_back false: only copies with a valid copy elsewhere are evicted.
  bool evict_one(std::unique_lock<std::mutex>& lock, Tier t, const Record& for_whom, bool write_back = true);
  [[noreturn]] void throw_no_room(const Record& r, Tier t) const;
  // fence: work on the copy's memory beyond what the slot knows of (discard_after).
  void free_slot(Record& r, Tier t, Event fence = {});
  void discard_locked(std::unique_lock<std::mutex>& lock, Record& r);
  void invalidate_others(Record& r, Tier keep);
  void finish_move(const std::shared_ptr<Move>& m, std::exception_ptr err);
  void settle(Record& r, Tier t);
  void wait_unlocked(std::unique_lock<std::mutex>& lock, const Event& e);
  // Waits, with mu_ released, until r's copy in t is not being filled, settling each fill
  // that lands. Returns whether it waited: if so, what the caller saw before may have
  // changed and must be looked at again.
  bool wait_while_filling(std::unique_lock<std::mutex>& lock, Record& r, Tier t);
  void reap_locked();  // finishes every completion whose event is complete (mu_ held)
  // Runs fn under mu_ once ev has completed (finish_move for a move, discard_after's
  // work), from a completer thread or from the first call into the store that finds ev
  // complete, whichever comes first; in submission order among those due together.
  void enqueue(Event ev, std::function<void()> fn);
  void completer_loop();
  uint64_t next_use(TensorId id) const;
  Tier staging_tier(Tier from, Tier to) const;

  Device& device_;
  TieredStoreOptions opts_;
  std::unique_ptr<TierPool> device_pool_;
  std::unique_ptr<TierPool> pinned_pool_;
  std::unique_ptr<NvmeStore> nvme_;
  FenceMap nvme_fences_;  // fences of freed NVMe extents (guarded by mu_)
  std::unique_ptr<Stream> to_device_;    // copies pinned -> device
  std::unique_ptr<Stream> from_device_;  // copies device -> pinned

  mutable std::mutex mu_;
  std::condition_variable changed_;  // a move finished or a pin was released
  std::unordered_map<TensorId, std::unique_ptr<Record>> records_;
  TensorId next_id_ = 1;
  uint64_t clock_ = 0;  // ticks for LRU
  StoreStats stats_;
  std::vector<TensorId> schedule_;
  std::unordered_map<TensorId, std::vector<size_t>> schedule_pos_;
  size_t position_ = 0;

  // Completion: moves are finalized (source unpinned, destination marked valid or
  // failed) by these threads as their events complete.
  std::mutex cq_mu_;
  std::condition_variable cq_cv_;
  struct Completion {
    Event ev;                     // an event to wait for, then
    std::function<void()> fn;     // this to run under mu_
    bool taken = false;           // a completer thread is waiting for ev
  };
  // Not yet finished, in submission order. An entry is finished by whoever removes it
  // (under mu_, then cq_mu_): a completer once its event is complete, or reap_locked().
  std::list<std::shared_ptr<Completion>> completions_;
  uint64_t in_flight_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> completers_;
};

}  // namespace strata
