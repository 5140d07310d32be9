// Tests of the tiered store: moves among the three tiers, eviction order, budgets,
// write-back, clear errors, and a multi-threaded random stress that verifies every byte.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/offload/fault_injection.hpp"
#include "strata/offload/tiered_store.hpp"

#include <fcntl.h>
#include <unistd.h>

using namespace strata;
namespace fs = std::filesystem;

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Contents of tensor `id` at `version`: a word stream no other (id, version) produces.
void fill(void* p, uint64_t bytes, uint64_t id, uint64_t version) {
  auto* c = static_cast<unsigned char*>(p);
  uint64_t seed = splitmix(id * 1000003 + version);
  for (uint64_t i = 0; i < bytes; i += 8) {
    uint64_t w = splitmix(seed + i);
    std::memcpy(c + i, &w, std::min<uint64_t>(8, bytes - i));
  }
}

// Index of the first wrong byte, or -1.
int64_t first_mismatch(const void* p, uint64_t bytes, uint64_t id, uint64_t version) {
  auto* c = static_cast<const unsigned char*>(p);
  uint64_t seed = splitmix(id * 1000003 + version);
  for (uint64_t i = 0; i < bytes; i += 8) {
    uint64_t w = splitmix(seed + i);
    uint64_t n = std::min<uint64_t>(8, bytes - i);
    if (std::memcmp(c + i, &w, n) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("strata-test-" + tag + "-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

TieredStoreOptions options(uint64_t device, uint64_t pinned, uint64_t nvme, const std::string& dir) {
  TieredStoreOptions o;
  o.device_budget = device;
  o.pinned_budget = pinned;
  if (nvme) {
    o.nvme.paths = {dir};
    o.nvme.capacity = nvme;
    o.nvme.checksums = true;
    o.nvme.aio.queue_depth = 16;
    o.nvme.aio.block_size = 64 << 10;
  }
  return o;
}

void write_version(TieredStore& s, TensorId id, Tier t, uint64_t version) {
  Acquired a = s.acquire_for_overwrite(id, t);
  a.ready.wait();
  fill(a.data, s.spec(id).bytes, id, version);
  s.release(id, t, Access::Write);
}

void expect_version(TieredStore& s, TensorId id, Tier t, uint64_t version) {
  Acquired a = s.acquire(id, t);
  a.ready.wait();
  EXPECT_EQ(first_mismatch(a.data, s.spec(id).bytes, id, version), -1)
      << "tensor " << id << " in tier " << to_string(t) << " at version " << version;
  s.release(id, t);
}

}  // namespace

TEST(TieredStore, MovesAmongMemoryTiers) {
  auto dev = make_device({});
  TieredStore s(*dev, options(1 << 20, 1 << 20, 0, ""));
  TensorId a = s.add({.name = "a", .bytes = 100'000, .home = Tier::Pinned});
  write_version(s, a, Tier::Pinned, 1);
  expect_version(s, a, Tier::Device, 1);
  EXPECT_TRUE(s.is_valid(a, Tier::Device));
  // Write on the device: the pinned (home) copy is now out of date until written back.
  write_version(s, a, Tier::Device, 2);
  EXPECT_FALSE(s.is_valid(a, Tier::Pinned));
  s.drop(a, Tier::Device).wait();  // only copy: written home first
  EXPECT_FALSE(s.is_valid(a, Tier::Device));
  EXPECT_TRUE(s.is_valid(a, Tier::Pinned));
  expect_version(s, a, Tier::Pinned, 2);
  EXPECT_THROW(s.drop(a, Tier::Pinned), Error);  // the home copy cannot go
  EXPECT_THROW(s.fetch(a, Tier::Nvme), ConfigError);  // no NVMe tier configured
}

TEST(TieredStore, MovesThroughNvme) {
  TempDir dir("nvme");
  auto dev = make_device({});
  TieredStore s(*dev, options(1 << 20, 1 << 20, 8 << 20, dir.path));
  TensorId a = s.add({.name = "a", .bytes = 300'001, .home = Tier::Nvme});
  TensorId b = s.add({.name = "b", .bytes = 5000, .home = Tier::Device});
  write_version(s, a, Tier::Device, 7);  // device copy is the only valid one
  write_version(s, b, Tier::Device, 3);
  s.flush(a).wait();  // device -> pinned -> nvme
  EXPECT_TRUE(s.is_valid(a, Tier::Nvme));
  s.drop(a, Tier::Device).wait();
  s.drop(a, Tier::Pinned).wait();
  EXPECT_FALSE(s.is_valid(a, Tier::Pinned));
  expect_version(s, a, Tier::Device, 7);  // nvme -> pinned -> device
  s.fetch(b, Tier::Nvme).wait();           // a cache copy of a device tensor on NVMe
  EXPECT_TRUE(s.is_valid(b, Tier::Nvme));
  StoreStats st = s.stats();
  EXPECT_GT(st.bytes_moved[2][1], 0u);  // nvme -> pinned happened
  EXPECT_GT(st.bytes_moved[1][2], 0u);  // pinned -> nvme happened
}

TEST(TieredStore, EvictsLeastRecentlyUsedWithoutSchedule) {
  auto dev = make_device({});
  // Device holds three 64 KiB tensors.
  TieredStore s(*dev, options(3 * 64 << 10, 1 << 20, 0, ""));
  std::vector<TensorId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(s.add({.name = "t" + std::to_string(i), .bytes = 64 << 10, .home = Tier::Pinned}));
    write_version(s, ids.back(), Tier::Pinned, 1);
  }
  for (int i = 0; i < 3; ++i) s.fetch(ids[i], Tier::Device).wait();
  s.fetch(ids[0], Tier::Device).wait();  // touch 0: 1 is now least recently used
  s.fetch(ids[3], Tier::Device).wait();
  EXPECT_TRUE(s.is_valid(ids[0], Tier::Device));
  EXPECT_FALSE(s.is_valid(ids[1], Tier::Device));
  EXPECT_TRUE(s.is_valid(ids[2], Tier::Device));
  EXPECT_TRUE(s.is_valid(ids[3], Tier::Device));
  EXPECT_EQ(s.stats().evictions, 1u);
}

TEST(TieredStore, EvictsFurthestNextUseWithSchedule) {
  auto dev = make_device({});
  TieredStore s(*dev, options(3 * 64 << 10, 1 << 20, 0, ""));
  std::vector<TensorId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(s.add({.name = "t" + std::to_string(i), .bytes = 64 << 10, .home = Tier::Pinned}));
    write_version(s, ids.back(), Tier::Pinned, 1);
  }
  // Order of use: 0 1 2 3 0 1 2 3 ... At position 3 (about to use 3), the next uses are
  // 0 at +1, 1 at +2, 2 at +3: tensor 2 is needed furthest away, although it is the
  // most recently used.
  s.set_schedule({ids[0], ids[1], ids[2], ids[3]});
  for (int i = 0; i < 3; ++i) {
    s.set_position(i);
    s.fetch(ids[i], Tier::Device).wait();
  }
  s.set_position(3);
  s.fetch(ids[3], Tier::Device).wait();
  EXPECT_TRUE(s.is_valid(ids[0], Tier::Device));
  EXPECT_TRUE(s.is_valid(ids[1], Tier::Device));
  EXPECT_FALSE(s.is_valid(ids[2], Tier::Device));
}

TEST(TieredStore, EvictingTheOnlyCopyWritesItHome) {
  TempDir dir("wb");
  auto dev = make_device({});
  TieredStore s(*dev, options(128 << 10, 1 << 20, 4 << 20, dir.path));
  TensorId a = s.add({.name = "a", .bytes = 100 << 10, .home = Tier::Nvme});
  TensorId b = s.add({.name = "b", .bytes = 100 << 10, .home = Tier::Nvme});
  write_version(s, a, Tier::Device, 11);  // device holds a's only valid copy
  write_version(s, b, Tier::Device, 12);  // needs a's room: a is written home first
  EXPECT_FALSE(s.is_valid(a, Tier::Device));
  EXPECT_GE(s.stats().writebacks, 1u);
  expect_version(s, a, Tier::Pinned, 11);
  s.drop(a, Tier::Pinned).wait();
  expect_version(s, a, Tier::Device, 11);  // and from NVMe again
}

// prefetch() is a hint: it takes room the tier has, or frees copies that hold nothing new
// (a valid copy is elsewhere); it never writes the only copy home to make room, and
// refuses instead, leaving the tiers as they were. fetch() in its place writes it home.
TEST(TieredStore, PrefetchNeverWritesHomeToMakeRoom) {
  TempDir dir("hint");
  auto dev = make_device({});
  // Pinned holds two 100 KiB tensors (rounded to the pool's grain).
  TieredStore s(*dev, options(1 << 20, 256 << 10, 4 << 20, dir.path));
  TensorId kept = s.add({.name = "kept grad", .bytes = 100 << 10, .home = Tier::Nvme});
  TensorId clean = s.add({.name = "clean", .bytes = 100 << 10, .home = Tier::Nvme});
  TensorId want = s.add({.name = "states", .bytes = 100 << 10, .home = Tier::Nvme});
  for (TensorId id : {clean, want}) {
    write_version(s, id, Tier::Pinned, 3);
    s.drop(id, Tier::Pinned).wait();  // written home: valid on NVMe only
  }
  write_version(s, kept, Tier::Pinned, 7);  // the only valid copy is in pinned memory
  ASSERT_FALSE(s.is_valid(kept, Tier::Nvme));
  s.fetch(clean, Tier::Pinned).wait();  // a cache copy: its home holds the same bytes
  const StoreStats before = s.stats();
  // Room for `want` means evicting one of them: the clean copy goes, nothing is written.
  ASSERT_TRUE(s.prefetch(want, Tier::Pinned));
  expect_version(s, want, Tier::Pinned, 3);
  EXPECT_FALSE(s.is_valid(clean, Tier::Pinned));
  EXPECT_TRUE(s.is_valid(kept, Tier::Pinned));
  StoreStats after = s.stats();
  EXPECT_EQ(after.writebacks, before.writebacks);
  EXPECT_EQ(after.bytes_moved[1][2], before.bytes_moved[1][2]) << "a hint wrote to NVMe";
  // With `want` in use, only the kept gradient could make room, by going home first: the
  // hint refuses and leaves everything as it was.
  Acquired in_use = s.acquire(want, Tier::Pinned);
  in_use.ready.wait();
  EXPECT_FALSE(s.prefetch(clean, Tier::Pinned));
  EXPECT_FALSE(s.is_valid(clean, Tier::Pinned));
  EXPECT_TRUE(s.is_valid(kept, Tier::Pinned));
  after = s.stats();
  EXPECT_EQ(after.writebacks, before.writebacks);
  EXPECT_EQ(after.bytes_moved[1][2], before.bytes_moved[1][2]) << "a refused hint wrote to NVMe";
  EXPECT_EQ(after.tiers[1].used, before.tiers[1].used) << "a refused hint kept room";
  // A hint for a copy already there succeeds without moving anything.
  EXPECT_TRUE(s.prefetch(want, Tier::Pinned));
  EXPECT_EQ(s.stats().moves, after.moves);
  // Once the kept gradient is dead it is freed unwritten, and the hint finds its room.
  s.discard_contents(kept);
  EXPECT_TRUE(s.prefetch(clean, Tier::Pinned));
  s.release(want, Tier::Pinned);
  expect_version(s, clean, Tier::Pinned, 3);
  expect_version(s, want, Tier::Pinned, 3);
  EXPECT_EQ(s.stats().bytes_moved[1][2], after.bytes_moved[1][2]) << "dead contents were written to NVMe";
}

// Room::FreeOnly (the plain step's prefetch of states during backward): only room the tier
// has free. Where the default hint would free a clean cache copy, it refuses and the copy
// stays; with room free it places the tensor as the default does.
TEST(TieredStore, PrefetchIntoFreeRoomOnlyEvictsNothing) {
  TempDir dir("hint-free");
  auto dev = make_device({});
  TieredStore s(*dev, options(1 << 20, 256 << 10, 4 << 20, dir.path));  // pinned: two tensors
  constexpr auto kFree = TieredStore::Room::FreeOnly;
  std::vector<TensorId> ids;
  for (const char* name : {"a", "b", "c"}) {
    ids.push_back(s.add({.name = name, .bytes = 100 << 10, .home = Tier::Nvme}));
    write_version(s, ids.back(), Tier::Pinned, ids.size());
    s.drop(ids.back(), Tier::Pinned).wait();  // valid on NVMe only
  }
  ASSERT_TRUE(s.prefetch(ids[0], Tier::Pinned, kFree));
  ASSERT_TRUE(s.prefetch(ids[1], Tier::Pinned, kFree));
  expect_version(s, ids[0], Tier::Pinned, 1);
  expect_version(s, ids[1], Tier::Pinned, 2);
  const StoreStats before = s.stats();
  EXPECT_FALSE(s.prefetch(ids[2], Tier::Pinned, kFree));
  EXPECT_TRUE(s.is_valid(ids[0], Tier::Pinned));
  EXPECT_TRUE(s.is_valid(ids[1], Tier::Pinned));
  EXPECT_FALSE(s.is_valid(ids[2], Tier::Pinned));
  EXPECT_EQ(s.stats().evictions, before.evictions);
  EXPECT_EQ(s.stats().tiers[1].used, before.tiers[1].used) << "a refused hint kept room";
  // The default hint makes its room from a clean copy.
  EXPECT_TRUE(s.prefetch(ids[2], Tier::Pinned));
  EXPECT_EQ(s.stats().evictions, before.evictions + 1);
  expect_version(s, ids[2], Tier::Pinned, 3);
}

// Dead contents (an optimizer step's gradient) are not written anywhere: every cache copy
// is freed, nothing moves towards NVMe, the home stays reserved and the tensor is filled
// again by acquire_for_overwrite. Acquired, it is refused.
TEST(TieredStore, DiscardedContentsAreNeverWrittenHome) {
  TempDir dir("dead");
  auto dev = make_device({});
  TieredStore s(*dev, options(1 << 20, 1 << 20, 4 << 20, dir.path));
  TensorId g = s.add({.name = "grad", .bytes = 100 << 10, .home = Tier::Nvme});
  write_version(s, g, Tier::Device, 1);
  s.drop(g, Tier::Device).wait();  // the only copy, on its way home: now in pinned memory
  ASSERT_TRUE(s.is_valid(g, Tier::Pinned));
  ASSERT_FALSE(s.is_valid(g, Tier::Nvme));
  const StoreStats before = s.stats();
  Acquired a = s.acquire(g, Tier::Pinned);
  a.ready.wait();
  EXPECT_THROW(s.discard_contents(g), Error);  // still acquired
  s.release(g, Tier::Pinned);
  s.discard_contents(g);
  EXPECT_FALSE(s.is_valid(g, Tier::Pinned));
  EXPECT_FALSE(s.is_valid(g, Tier::Device));
  const StoreStats after = s.stats();
  EXPECT_EQ(after.bytes_moved[1][2], before.bytes_moved[1][2]) << "dead contents were written to NVMe";
  EXPECT_EQ(after.tiers[1].used, 0u) << "the pinned copy was kept";
  EXPECT_EQ(after.tiers[2].used, before.tiers[2].used) << "the home reservation changed";
  write_version(s, g, Tier::Device, 2);  // filled again, and it travels home as before
  s.flush(g).wait();
  s.drop(g, Tier::Device).wait();
  s.drop(g, Tier::Pinned).wait();
  expect_version(s, g, Tier::Device, 2);
  EXPECT_GT(s.stats().bytes_moved[1][2], after.bytes_moved[1][2]);
}

TEST(TieredStore, NoRoomErrorNamesTensorTierBudgetAndHolders) {
  auto dev = make_device({});
  TieredStore s(*dev, options(128 << 10, 1 << 20, 0, ""));
  TensorId a = s.add({.name = "layer0.w", .bytes = 100 << 10, .home = Tier::Pinned});
  TensorId b = s.add({.name = "layer1.w", .bytes = 100 << 10, .home = Tier::Pinned});
  Acquired held = s.acquire(a, Tier::Device);
  held.ready.wait();
  try {
    s.acquire(b, Tier::Device);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("layer1.w"), std::string::npos) << m;
    EXPECT_NE(m.find("device tier"), std::string::npos) << m;
    EXPECT_NE(m.find("128.00 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("layer0.w"), std::string::npos) << m;
    EXPECT_NE(m.find("acquired"), std::string::npos) << m;
  }
  s.release(a, Tier::Device);
  EXPECT_NO_THROW(s.acquire(b, Tier::Device).ready.wait());
  s.release(b, Tier::Device);
  EXPECT_THROW(s.release(b, Tier::Device), Error);  // double release
}

TEST(TieredStore, ImpossiblePlansAreRefusedBeforeAnyData) {
  TempDir dir("plan");
  auto dev = make_device({});
  TieredStoreOptions o = options(1 << 20, 256 << 10, 4 << 20, dir.path);
  std::vector<TensorSpec> specs{{.name = "big", .bytes = 300 << 10, .home = Tier::Nvme}};
  try {
    TieredStore::check_plan(specs, o);
    FAIL() << "expected OutOfBudget";
  } catch (const OutOfBudget& e) {
    EXPECT_NE(std::string(e.what()).find("'big'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pinned budget"), std::string::npos) << e.what();
  }
  specs = {{.name = "x", .bytes = 3 << 20, .home = Tier::Device}};
  EXPECT_THROW(TieredStore::check_plan(specs, o), OutOfBudget);
  specs = {{.name = "y", .bytes = 100, .home = Tier::Nvme}};
  EXPECT_THROW(TieredStore::check_plan(specs, options(1 << 20, 1 << 20, 0, "")), OutOfBudget);
  EXPECT_NO_THROW(TieredStore::check_plan(specs, o));

  TieredStore s(*dev, o);
  EXPECT_THROW(s.add({.name = "big", .bytes = 300 << 10, .home = Tier::Nvme}), OutOfBudget);
  EXPECT_THROW(s.add({.name = "huge", .bytes = 2 << 20, .home = Tier::Device}), OutOfBudget);
  // Home copies fill the device; the next one is refused at add(), not on first use.
  s.add({.name = "d0", .bytes = 600 << 10, .home = Tier::Device});
  EXPECT_THROW(s.add({.name = "d1", .bytes = 600 << 10, .home = Tier::Device}), OutOfBudget);
  EXPECT_EQ(s.stats().moves, 0u);
}

// 10,000+ random asynchronous moves among all three tiers from several threads, every
// byte verified, budgets never exceeded.
TEST(TieredStore, RandomMovesFromManyThreadsKeepEveryByte) {
  TempDir dir("stress");
  auto dev = make_device({});
  const uint64_t kDevice = 2 << 20, kPinned = 3 << 20, kNvme = 3 << 20;
  TieredStore s(*dev, options(kDevice, kPinned, kNvme, dir.path));
  std::mt19937_64 rng(20261122);
  const int kTensors = 40;
  std::vector<TensorId> ids;
  std::vector<uint64_t> version(kTensors, 1);
  std::vector<Tier> home(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    // Mostly NVMe homes (ZeRO-Infinity's layout), a few in memory.
    home[i] = i % 8 == 0 ? Tier::Device : i % 8 == 1 ? Tier::Pinned : Tier::Nvme;
    uint64_t bytes = 4096 + rng() % (96 << 10) + (i % 3 == 0 ? 3 : 0);  // some odd sizes
    ids.push_back(s.add({.name = "t" + std::to_string(i), .bytes = bytes, .home = home[i],
                         .owner = i % 2 ? "params" : "optimizer"}));
    write_version(s, ids[i], home[i] == Tier::Nvme ? Tier::Pinned : home[i], 1);
  }
  std::vector<std::shared_mutex> locks(kTensors);
  std::atomic<int> verified{0}, ops{0}, no_room{0};
  std::atomic<bool> failed{false};
  const int kOps = 60000;
  auto worker = [&](int seed) {
    std::mt19937_64 r(seed);
    const Tier mem[2] = {Tier::Device, Tier::Pinned};
    while (ops.fetch_add(1) < kOps && !failed) {
      int i = static_cast<int>(r() % kTensors);
      TensorId id = ids[i];
      int op = static_cast<int>(r() % 10);
      try {
        if (op < 4) {  // read and verify in a memory tier
          std::shared_lock<std::shared_mutex> l(locks[i]);
          Tier t = mem[r() % 2];
          Acquired a = s.acquire(id, t);
          a.ready.wait();
          if (first_mismatch(a.data, s.spec(id).bytes, id, version[i]) != -1) failed = true;
          s.release(id, t);
          ++verified;
        } else if (op < 6) {  // prefetch without pinning, anywhere
          std::shared_lock<std::shared_mutex> l(locks[i]);
          Tier t = static_cast<Tier>(r() % 3);
          s.fetch(id, t).wait();
        } else if (op < 8) {  // drop a cache copy (written home first if it is the only one)
          std::unique_lock<std::shared_mutex> l(locks[i]);
          Tier t = static_cast<Tier>(r() % 3);
          if (t != home[i]) s.drop(id, t).wait();
        } else {  // write a new version in a memory tier
          std::unique_lock<std::shared_mutex> l(locks[i]);
          Tier t = mem[r() % 2];
          Acquired a = s.acquire_for_overwrite(id, t);
          a.ready.wait();
          fill(a.data, s.spec(id).bytes, id, version[i] + 1);
          s.release(id, t, Access::Write);
          ++version[i];
        }
      } catch (const OutOfBudget&) {
        ++no_room;  // every tier full of acquired copies at once: allowed, counted
      } catch (const std::exception& e) {
        ADD_FAILURE() << "op " << op << " on tensor " << i << ": " << e.what();
        failed = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, 100 + t);
  for (auto& t : threads) t.join();
  s.quiesce();
  ASSERT_FALSE(failed) << "a read returned wrong bytes";
  // Every tensor, from every tier, holds its last version.
  for (int i = 0; i < kTensors; ++i) {
    expect_version(s, ids[i], Tier::Device, version[i]);
    s.drop(ids[i], Tier::Pinned == home[i] ? Tier::Device : Tier::Pinned).wait();
    s.flush(ids[i]).wait();
    if (home[i] != Tier::Nvme) s.fetch(ids[i], Tier::Nvme).wait();
    for (Tier t : {Tier::Device, Tier::Pinned})
      if (t != home[i]) s.drop(ids[i], t).wait();
    expect_version(s, ids[i], Tier::Pinned, version[i]);
  }
  StoreStats st = s.stats();
  EXPECT_GE(st.moves, 10000u) << "too few moves to call this a stress test";
  EXPECT_GT(verified.load(), 3000);
  EXPECT_LT(no_room.load(), kOps / 100);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_GT(st.writebacks, 0u);
  const uint64_t budgets[3] = {kDevice, kPinned, kNvme};
  for (int t = 0; t < 3; ++t) {
    EXPECT_LE(st.tiers[t].peak, budgets[t]) << to_string(static_cast<Tier>(t));
    EXPECT_GT(st.tiers[t].peak, budgets[t] / 2) << "the stress never filled " << to_string(static_cast<Tier>(t));
    uint64_t sum = 0;
    for (auto& [owner, n] : st.tiers[t].by_owner) sum += n;
    EXPECT_EQ(sum, st.tiers[t].used);
  }
  EXPECT_EQ(st.failed_moves, 0u);
}

// ---------------------------------------------------------------------------------------
// Faults under the I/O engine: clear errors, no stale data, nothing saved is lost.

namespace {
struct FaultyStore {
  TempDir dir{"faults"};
  std::unique_ptr<Device> dev = make_device({});
  std::shared_ptr<FaultPlan> plan = std::make_shared<FaultPlan>();
  std::unique_ptr<TieredStore> store;
  FaultyStore() {
    TieredStoreOptions o = options(1 << 20, 1 << 20, 8 << 20, dir.path);
    o.nvme.faults = plan;
    store = std::make_unique<TieredStore>(*dev, o);
  }
  // A tensor whose only valid copy is on NVMe.
  TensorId on_nvme(const std::string& name, uint64_t bytes, uint64_t version) {
    TensorId id = store->add({.name = name, .bytes = bytes, .home = Tier::Nvme});
    write_version(*store, id, Tier::Pinned, version);
    store->drop(id, Tier::Pinned).wait();
    EXPECT_TRUE(store->is_valid(id, Tier::Nvme));
    EXPECT_FALSE(store->is_valid(id, Tier::Pinned));
    return id;
  }
};
}  // namespace

TEST(TieredStoreFaults, ReadErrorFailsTheAcquireAndNeverLooksValid) {
  FaultyStore f;
  TensorId a = f.on_nvme("a", 200'000, 5);
  f.plan->fail_nth(FaultTarget::Reads, 0, EIO);
  Acquired got = f.store->acquire(a, Tier::Device);
  try {
    got.ready.wait();
    FAIL() << "a failed read was handed back as good data";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_NE(std::string(e.what()).find(f.store->nvme()->files()[0]), std::string::npos) << e.what();
  }
  f.store->release(a, Tier::Device);
  f.store->quiesce();
  EXPECT_FALSE(f.store->is_valid(a, Tier::Device));
  EXPECT_FALSE(f.store->is_valid(a, Tier::Pinned));
  EXPECT_TRUE(f.store->is_valid(a, Tier::Nvme));  // what was saved is still there
  EXPECT_GE(f.store->stats().failed_moves, 1u);
  expect_version(*f.store, a, Tier::Device, 5);  // the fault has passed: a retry works
}

TEST(TieredStoreFaults, FullDiskOnWriteBackKeepsTheData) {
  FaultyStore f;
  TensorId a = f.store->add({.name = "grads", .bytes = 150'000, .home = Tier::Nvme});
  write_version(*f.store, a, Tier::Pinned, 9);  // the only valid copy is in pinned memory
  f.plan->fail_nth(FaultTarget::Writes, 0, ENOSPC);
  try {
    f.store->drop(a, Tier::Pinned).wait();
    FAIL() << "expected the write-back to fail";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_NE(std::string(e.what()).find("disk is full"), std::string::npos) << e.what();
  }
  f.store->quiesce();
  EXPECT_TRUE(f.store->is_valid(a, Tier::Pinned));  // not freed: it is the only copy
  EXPECT_FALSE(f.store->is_valid(a, Tier::Nvme));
  expect_version(*f.store, a, Tier::Pinned, 9);
  f.store->drop(a, Tier::Pinned).wait();  // space again: the write-back goes through
  expect_version(*f.store, a, Tier::Device, 9);
}

TEST(TieredStoreFaults, ShortTransfersAreCompletedTransparently) {
  FaultyStore f;
  f.plan->short_nth(FaultTarget::Writes, 0, 0.5).short_nth(FaultTarget::Reads, 0, 0.25);
  TensorId a = f.on_nvme("a", 256 << 10, 3);
  expect_version(*f.store, a, Tier::Device, 3);
  EXPECT_GE(f.plan->injected(), 2u);
  EXPECT_EQ(f.store->stats().failed_moves, 0u);
}

TEST(TieredStoreFaults, CorruptedSwapFileIsDetected) {
  FaultyStore f;
  TensorId a = f.on_nvme("a", 64 << 10, 4);
  // Scribble over the swap file behind the store's back.
  const std::string file = f.store->nvme()->files()[0];
  int fd = ::open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  std::vector<char> junk(1 << 20, 0x5a);
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  ::fsync(fd);
  ::close(fd);
  Acquired got = f.store->acquire(a, Tier::Pinned);
  EXPECT_THROW(got.ready.wait(), CorruptionError);
  f.store->release(a, Tier::Pinned);
  f.store->quiesce();
  EXPECT_FALSE(f.store->is_valid(a, Tier::Pinned));
}

TEST(TieredStore, ScratchTensorsTakeRoomOnlyWhileFilled) {
  auto dev = make_device({});
  TieredStore s(*dev, options(256 << 10, 1 << 20, 0, ""));
  TensorId a = s.add({.name = "gathered", .bytes = 200 << 10, .home = Tier::Device, .scratch = true});
  EXPECT_EQ(s.usage(Tier::Device).used, 0u);
  EXPECT_THROW(s.acquire(a, Tier::Device), Error);  // nothing to read yet
  write_version(s, a, Tier::Device, 1);
  EXPECT_GE(s.usage(Tier::Device).used, 200u << 10);
  expect_version(s, a, Tier::Pinned, 1);
  s.discard(a);
  EXPECT_EQ(s.usage(Tier::Device).used, 0u);
  EXPECT_EQ(s.usage(Tier::Pinned).used, 0u);
  // Room for another scratch buffer of the same size now.
  TensorId b = s.add({.name = "grads", .bytes = 200 << 10, .home = Tier::Device, .scratch = true});
  write_version(s, b, Tier::Device, 2);
  EXPECT_THROW(write_version(s, a, Tier::Device, 3), OutOfBudget);
}

// A holder whose reads run beside the caller (the engine's optimizer lane) releases a copy
// behind the work that reads it (release with Access::Read and that work's event) instead
// of keeping its pin. The copy can then be evicted at once, and nothing writes its memory
// until the work is done: the next tensor placed there is handed out with a ready event
// that waits for it. Work writing a copy it was handed (Access::Write and an event) keeps
// the copy from eviction until it is done; a placement that needs that room waits on the
// store's own queue, not on the holder.
TEST(TieredStore, ACopyReleasedBehindItsReaderIsNotOverwrittenUntilTheReadEnds) {
  auto dev = make_device({});
  // The device tier holds one 64 KiB tensor.
  TieredStore s(*dev, options(64 << 10, 1 << 20, 0, ""));
  TensorId a = s.add({.name = "a", .bytes = 64 << 10, .home = Tier::Pinned});
  TensorId b = s.add({.name = "b", .bytes = 64 << 10, .home = Tier::Pinned});
  write_version(s, a, Tier::Pinned, 1);
  write_version(s, b, Tier::Pinned, 2);
  for (int trial = 0; trial < 3; ++trial) {
    Acquired got = s.acquire(a, Tier::Device);
    got.ready.wait();
    auto [reading, read_done] = HostEvent::make();
    s.release(a, Tier::Device, Access::Read, reading);
    const std::vector<unsigned char> before(static_cast<unsigned char*>(got.data),
                                            static_cast<unsigned char*>(got.data) + (64 << 10));
    // b needs a's room: a's copy goes (its home copy is valid), its memory is b's next.
    const Event b_ready = s.fetch(b, Tier::Device);
    EXPECT_FALSE(s.is_valid(a, Tier::Device)) << "trial " << trial;
    EXPECT_FALSE(b_ready.ready()) << "b was copied over a's memory while a was still read (trial " << trial << ")";
    EXPECT_EQ(std::memcmp(got.data, before.data(), before.size()), 0) << "a's memory changed under its reader";
    read_done->complete(nullptr);
    b_ready.wait();
    expect_version(s, b, Tier::Device, 2);
    EXPECT_EQ(s.stats().evictions_behind_readers, static_cast<uint64_t>(trial + 1));
    s.drop(b, Tier::Device).wait();
  }
  // Written behind the caller: not evicted while the write runs; a placement waits for it.
  Acquired w = s.acquire_for_overwrite(a, Tier::Device);
  w.ready.wait();
  fill(w.data, 64 << 10, a, 3);
  auto [writing, write_done] = HostEvent::make();
  s.release(a, Tier::Device, Access::Write, writing);
  std::thread finisher([done = write_done] { done->complete(nullptr); });
  s.fetch(b, Tier::Device).wait();  // waits for the write, then writes a home and takes its room
  finisher.join();
  expect_version(s, a, Tier::Pinned, 3);
  expect_version(s, b, Tier::Device, 2);
}
