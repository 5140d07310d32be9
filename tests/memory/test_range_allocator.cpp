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

// High carves from the end of the highest free range that fits, Low best-fit from the
// start of the smallest: the two ends fill towards each other and what is freed between
// them stays one range.
TEST(RangeAllocator, HighPlacementTakesTheTopOfTheHighestRangeThatFits) {
  RangeAllocator r(16 * 4096, 4096);
  const uint64_t low = *r.allocate(4096);
  EXPECT_EQ(low, 0u);
  const uint64_t top = *r.allocate(2 * 4096, RangeAllocator::Placement::High);
  EXPECT_EQ(top, 14 * 4096u);
  const uint64_t next = *r.allocate(4096, RangeAllocator::Placement::High);
  EXPECT_EQ(next, 13 * 4096u);
  const uint64_t mid = *r.allocate(4 * 4096);  // low end: [1, 5)
  EXPECT_EQ(mid, 4096u);
  r.free(next);  // [5, 14) free: 9 pages, one range
  EXPECT_EQ(r.largest_free(), 9 * 4096u);
  // A hole higher up that is too small is passed over for a lower range that fits.
  const uint64_t a = *r.allocate(4096, RangeAllocator::Placement::High);  // [13, 14)
  EXPECT_EQ(a, 13 * 4096u);
  r.free(top);  // free: [5, 13) and [14, 16)
  const uint64_t b = *r.allocate(3 * 4096, RangeAllocator::Placement::High);
  EXPECT_EQ(b, 10 * 4096u);
  EXPECT_FALSE(r.allocate(6 * 4096, RangeAllocator::Placement::High));  // 5 + 2 pages free, apart
  EXPECT_EQ(r.used(), (1 + 4 + 1 + 3) * 4096u);
}

TEST(RangeAllocator, RandomNeverOverlapsOrExceeds) {
  const uint64_t cap = 1 << 22;
  RangeAllocator r(cap, 512);
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int it = 0; it < 20000; ++it) {
    if (live.empty() || rng() % 3) {
      uint64_t n = 1 + rng() % 65536;
      const auto where = rng() % 2 ? RangeAllocator::Placement::High : RangeAllocator::Placement::Low;
      if (auto o = r.allocate(n, where)) {
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
