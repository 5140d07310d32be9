#include <gtest/gtest.h>

#include <random>

#include "strata/memory/range_allocator.hpp"

using namespace strata;

TEST(RangeAllocator, AlignsAndRefusesWhenFull) {
  RangeAllocator r(64 * 1024, 4096);
  auto a = r.allocate(1);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a % 4096, 0u);
  EXPECT_EQ(r.used(), 4096u);
  auto b = r.allocate(60 * 1024);
  ASSERT_TRUE(b);
  EXPECT_FALSE(r.allocate(1));  // full
  r.free(*a);
  EXPECT_TRUE(r.allocate(4096));
}

TEST(RangeAllocator, CoalescesFreedNeighbours) {
  RangeAllocator r(16 * 4096, 4096);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 16; ++i) offs.push_back(*r.allocate(4096));
  EXPECT_FALSE(r.allocate(4096));
  for (int i : {5, 7, 6}) r.free(offs[i]);  // 5,6,7 coalesce into one 12 KiB range
  EXPECT_EQ(r.largest_free(), 3 * 4096u);
  auto big = r.allocate(3 * 4096);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, offs[5]);
}

TEST(RangeAllocator, RandomNeverOverlapsOrExceeds) {
  const uint64_t cap = 1 << 22;
  RangeAllocator r(cap, 512);
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int it = 0; it < 20000; ++it) {
    if (live.empty() || rng() % 3) {
      uint64_t n = 1 + rng() % 65536;
      if (auto o = r.allocate(n)) {
        EXPECT_LE(*o + r.round(n), cap);
        for (auto& [lo, ln] : live) ASSERT_TRUE(*o + r.round(n) <= lo || lo + ln <= *o);
        live.emplace_back(*o, r.round(n));
      }
    } else {
      size_t i = rng() % live.size();
      r.free(live[i].first);
      live.erase(live.begin() + i);
    }
    ASSERT_LE(r.used(), cap);
  }
  uint64_t sum = 0;
  for (auto& l : live) sum += l.second;
  EXPECT_EQ(sum, r.used());
  EXPECT_LE(r.peak(), cap);
  for (auto& l : live) r.free(l.first);
  EXPECT_EQ(r.used(), 0u);
  EXPECT_EQ(r.largest_free(), cap);
}
