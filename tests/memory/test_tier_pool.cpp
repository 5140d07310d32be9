#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "strata/core/error.hpp"
#include "strata/memory/tier.hpp"
#include "strata/memory/topology.hpp"

using namespace strata;

TEST(TierPool, DeviceArenaHonoursBudgetAndOwners) {
  auto dev = make_device({});
  auto arena = make_device_arena(*dev, 1 << 20);
  EXPECT_EQ(arena->capacity(), 1u << 20);
  void* a = arena->try_allocate(600 * 1024, "params");
  void* b = arena->try_allocate(300 * 1024, "grads");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(arena->try_allocate(200 * 1024, "x"), nullptr);  // would exceed the budget
  std::memset(a, 1, 600 * 1024);
  auto u = arena->usage();
  EXPECT_EQ(u.budget, 1u << 20);
  EXPECT_EQ(u.by_owner["params"], 600u * 1024);
  EXPECT_EQ(u.by_owner["grads"], 300u * 1024);
  EXPECT_LE(u.peak, u.budget);
  arena->free(a);
  EXPECT_EQ(arena->usage().by_owner.count("params"), 0u);
  EXPECT_NE(arena->try_allocate(200 * 1024, "x"), nullptr);
}

TEST(TierPool, PinnedPoolIsPageAlignedAndUsable) {
  auto dev = make_device({});
  auto pool = make_pinned_pool(*dev, {.budget = 4 << 20});
  void* p = pool->try_allocate(12345, "staging");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  std::memset(p, 0xab, 12345);
  EXPECT_TRUE(pool->contains(p));
  pool->free(p);
  EXPECT_EQ(pool->usage().used, 0u);
}

TEST(TierPool, ZeroBudgetIsAConfigError) {
  auto dev = make_device({});
  EXPECT_THROW(make_device_arena(*dev, 0), ConfigError);
  EXPECT_THROW(make_pinned_pool(*dev, {.budget = 0}), ConfigError);
  EXPECT_THROW(parse_tier("ssd"), ConfigError);
}

TEST(Topology, SummaryHasCores) {
  auto m = machine_summary();
  EXPECT_GT(m.threads, 0);
  EXPECT_GT(m.memory_bytes, 0u);
}
