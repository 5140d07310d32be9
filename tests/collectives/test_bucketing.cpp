#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "strata/collectives/bucketing.hpp"

using namespace strata::coll;

namespace {
// Every element of every tensor is covered exactly once, pieces are in order, and
// no piece overlaps another in its bucket.
void expect_covers(const BucketPlan& plan, const std::vector<size_t>& counts, size_t align) {
  std::vector<std::vector<int>> seen(counts.size());
  for (size_t t = 0; t < counts.size(); ++t) seen[t].assign(counts[t], 0);
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    size_t end = 0;
    ASSERT_GT(plan.buckets[b].piece_count, 0u) << "empty bucket " << b;
    for (const BucketPiece& p : plan.pieces_of(b)) {
      EXPECT_GE(p.bucket_offset, end) << "overlap in bucket " << b;
      EXPECT_EQ(p.bucket_offset % align, 0u);
      EXPECT_GT(p.count, 0u);
      end = p.bucket_offset + p.count;
      for (size_t i = 0; i < p.count; ++i) ++seen[p.tensor][p.tensor_offset + i];
    }
    EXPECT_EQ(plan.buckets[b].count, end);
  }
  for (size_t t = 0; t < counts.size(); ++t)
    for (size_t i = 0; i < counts[t]; ++i) ASSERT_EQ(seen[t][i], 1) << "tensor " << t << " element " << i;
}
}  // namespace

TEST(Bucketing, SmallTensorsShareOneBucket) {
  std::vector<size_t> counts{3, 5, 7};
  BucketPlan plan = plan_buckets(counts, {.capacity = 100});
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_EQ(plan.buckets[0].count, 15u);
  ASSERT_EQ(plan.pieces.size(), 3u);
  EXPECT_EQ(plan.pieces[1].bucket_offset, 3u);
  EXPECT_EQ(plan.pieces[2].bucket_offset, 8u);
  expect_covers(plan, counts, 1);
}

TEST(Bucketing, SplitFillsBucketsToCapacity) {
  std::vector<size_t> counts{6, 6, 6};
  BucketPlan plan = plan_buckets(counts, {.capacity = 8});
  ASSERT_EQ(plan.buckets.size(), 3u);  // 18 elements in buckets of 8: 8, 8, 2
  EXPECT_EQ(plan.buckets[0].count, 8u);
  EXPECT_EQ(plan.buckets[1].count, 8u);
  EXPECT_EQ(plan.buckets[2].count, 2u);
  // Tensor 1 is cut: 2 elements in bucket 0, 4 in bucket 1.
  auto b0 = plan.pieces_of(0);
  ASSERT_EQ(b0.size(), 2u);
  EXPECT_EQ(b0[1].tensor, 1u);
  EXPECT_EQ(b0[1].count, 2u);
  auto b1 = plan.pieces_of(1);
  EXPECT_EQ(b1[0].tensor, 1u);
  EXPECT_EQ(b1[0].tensor_offset, 2u);
  EXPECT_EQ(b1[0].count, 4u);
  expect_covers(plan, counts, 1);
}

TEST(Bucketing, OwnBucketKeepsTensorsWhole) {
  std::vector<size_t> counts{6, 6, 20, 1};
  BucketPlan plan = plan_buckets(counts, {.capacity = 8, .oversize = Oversize::OwnBucket});
  ASSERT_EQ(plan.buckets.size(), 4u);  // [6] [6] [20 (oversized)] [1]
  for (size_t b = 0; b < plan.buckets.size(); ++b) EXPECT_EQ(plan.buckets[b].piece_count, 1u);
  EXPECT_EQ(plan.buckets[2].count, 20u);
  EXPECT_EQ(plan.max_count(), 20u);
  expect_covers(plan, counts, 1);
}

TEST(Bucketing, AlignmentLeavesGaps) {
  std::vector<size_t> counts{3, 3, 3};
  BucketPlan plan = plan_buckets(counts, {.capacity = 16, .align = 4});
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_EQ(plan.pieces[1].bucket_offset, 4u);
  EXPECT_EQ(plan.pieces[2].bucket_offset, 8u);
  EXPECT_EQ(plan.buckets[0].count, 11u);
  EXPECT_EQ(padded_count(plan.buckets[0], 4), 12u);
  EXPECT_EQ(padded_count(plan.buckets[0], 3), 12u);
  EXPECT_EQ(padded_count(plan.buckets[0], 11), 11u);
}

TEST(Bucketing, EmptyTensorsAndInputs) {
  EXPECT_TRUE(plan_buckets(std::vector<size_t>{}, {.capacity = 4}).buckets.empty());
  std::vector<size_t> counts{0, 4, 0, 4, 0};
  BucketPlan plan = plan_buckets(counts, {.capacity = 4});
  EXPECT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.pieces.size(), 2u);
  expect_covers(plan, counts, 1);
}

TEST(Bucketing, BadOptionsThrow) {
  std::vector<size_t> counts{1};
  EXPECT_THROW(plan_buckets(counts, {.capacity = 0}), CollectiveUsageError);
  EXPECT_THROW(plan_buckets(counts, {.capacity = 4, .align = 0}), CollectiveUsageError);
  EXPECT_THROW(plan_buckets(counts, {.capacity = 4, .align = 8}), CollectiveUsageError);
}

TEST(Bucketing, RandomPlansCoverEverythingWithinCapacity) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> counts(rng() % 20);
    for (auto& c : counts) c = rng() % 50;
    const size_t cap = 1 + rng() % 40;
    const size_t align = 1 + rng() % std::min<size_t>(cap, 4);
    const Oversize mode = trial % 2 ? Oversize::Split : Oversize::OwnBucket;
    BucketPlan plan = plan_buckets(counts, {.capacity = cap, .align = align, .oversize = mode});
    expect_covers(plan, counts, align);
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      const bool oversized = plan.buckets[b].count > cap;
      if (mode == Oversize::Split) {
        EXPECT_FALSE(oversized);
      } else if (oversized) {
        EXPECT_EQ(plan.buckets[b].piece_count, 1u);  // an oversized bucket holds one whole tensor
      }
    }
    if (mode == Oversize::OwnBucket) {
      for (const BucketPiece& p : plan.pieces) EXPECT_EQ(p.count, counts[p.tensor]);  // never split
    }
  }
}

TEST(Bucketing, PackZeroesGapsAndUnpackRestores) {
  std::vector<float> a{1, 2, 3}, b{4, 5}, c{6, 7, 8, 9, 10};
  std::vector<size_t> counts{a.size(), b.size(), c.size()};
  BucketPlan plan = plan_buckets(counts, {.capacity = 8, .align = 4});
  // [a a a _ b b _ _] [c c c c c]
  ASSERT_EQ(plan.buckets.size(), 2u);
  std::vector<std::span<const float>> in{a, b, c};
  std::vector<float> buf(8, -1.0f);  // sentinel: pack must overwrite every element
  pack<float>(plan, 0, in, buf);
  EXPECT_EQ(buf, (std::vector<float>{1, 2, 3, 0, 4, 5, 0, 0}));
  std::fill(buf.begin(), buf.end(), -1.0f);
  pack<float>(plan, 1, in, buf);
  EXPECT_EQ(buf, (std::vector<float>{6, 7, 8, 9, 10, 0, 0, 0}));

  // Unpack writes only the pieces of its bucket.
  std::vector<float> a2(3, 0), b2(2, 0), c2(5, 0);
  std::vector<std::span<float>> out{a2, b2, c2};
  for (auto& x : buf) x *= 10;
  unpack<float>(plan, 1, buf, out);
  EXPECT_EQ(c2, (std::vector<float>{60, 70, 80, 90, 100}));
  EXPECT_EQ(a2, (std::vector<float>{0, 0, 0}));
}

TEST(Bucketing, PackChecksItsArguments) {
  std::vector<float> a(3), b(2);
  std::vector<size_t> counts{3, 2};
  BucketPlan plan = plan_buckets(counts, {.capacity = 8});
  std::vector<float> buf(8), small(4);
  std::vector<std::span<const float>> in{a, b};
  std::vector<std::span<const float>> one{a};
  std::vector<float> wrong(4);
  std::vector<std::span<const float>> mismatched{a, wrong};
  EXPECT_THROW(pack<float>(plan, 1, in, buf), CollectiveUsageError);    // no bucket 1
  EXPECT_THROW(pack<float>(plan, 0, one, buf), CollectiveUsageError);   // tensor count
  EXPECT_THROW(pack<float>(plan, 0, in, small), CollectiveUsageError);  // buffer too small
  try {
    pack<float>(plan, 0, mismatched, buf);
    ADD_FAILURE() << "a tensor of the wrong size was packed";
  } catch (const CollectiveUsageError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 1 holds 4 elements, the plan was made for 2"), std::string::npos)
        << e.what();
  }
}
