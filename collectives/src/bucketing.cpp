#include "strata/collectives/bucketing.hpp"

#include <algorithm>

namespace strata::coll {

namespace {
size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
}  // namespace

size_t BucketPlan::max_count() const {
  size_t m = 0;
  for (const Bucket& b : buckets) m = std::max(m, b.count);
  return m;
}

size_t padded_count(const Bucket& b, size_t multiple) {
  if (multiple == 0) throw CollectiveUsageError("padded_count: multiple must be > 0");
  return round_up(b.count, multiple);
}

BucketPlan plan_buckets(std::span<const size_t> tensor_counts, const BucketOptions& opt) {
  if (opt.capacity == 0) throw CollectiveUsageError("plan_buckets: capacity must be > 0 elements");
  if (opt.align == 0) throw CollectiveUsageError("plan_buckets: align must be > 0 elements");
  if (opt.align > opt.capacity)
    throw CollectiveUsageError("plan_buckets: align (" + std::to_string(opt.align) + ") exceeds capacity (" +
                               std::to_string(opt.capacity) + ")");
  BucketPlan plan;
  plan.capacity = opt.capacity;
  plan.tensor_counts.assign(tensor_counts.begin(), tensor_counts.end());

  auto open_bucket = [&] {
    plan.buckets.push_back(Bucket{plan.pieces.size(), 0, 0});
  };
  auto add_piece = [&](size_t tensor, size_t tensor_offset, size_t bucket_offset, size_t count) {
    plan.pieces.push_back(BucketPiece{tensor, tensor_offset, bucket_offset, count});
    Bucket& b = plan.buckets.back();
    ++b.piece_count;
    b.count = bucket_offset + count;
  };

  auto current_is_empty = [&] { return plan.buckets.empty() || plan.buckets.back().piece_count == 0; };
  for (size_t t = 0; t < tensor_counts.size(); ++t) {
    const size_t n = tensor_counts[t];
    if (n == 0) continue;
    if (opt.oversize == Oversize::OwnBucket && n > opt.capacity) {
      // Whole, in a bucket of its own; the next tensor finds no room and opens another.
      if (!current_is_empty() || plan.buckets.empty()) open_bucket();
      add_piece(t, 0, 0, n);
      continue;
    }
    size_t done = 0;
    while (done < n) {
      if (plan.buckets.empty()) open_bucket();
      const size_t start = current_is_empty() ? 0 : round_up(plan.buckets.back().count, opt.align);
      const size_t room = start < opt.capacity ? opt.capacity - start : 0;
      const size_t left = n - done;
      if (left <= room) {
        add_piece(t, done, start, left);
        done = n;
      } else if (room == 0 || opt.oversize == Oversize::OwnBucket) {
        open_bucket();  // OwnBucket: n <= capacity, so it fits a fresh bucket whole
      } else {
        add_piece(t, done, start, room);  // Split: fill this bucket, go on in the next
        done += room;
        open_bucket();
      }
    }
  }
  // Drop a trailing bucket that received no piece.
  if (!plan.buckets.empty() && plan.buckets.back().piece_count == 0) plan.buckets.pop_back();
  return plan;
}

namespace detail {
void check_pack_args(const BucketPlan& plan, size_t bucket, std::span<const size_t> tensor_sizes,
                     size_t buffer_count, const char* what) {
  const std::string w = std::string(what) + " of bucket " + std::to_string(bucket) + ": ";
  if (bucket >= plan.buckets.size())
    throw CollectiveUsageError(w + "the plan has only " + std::to_string(plan.buckets.size()) + " buckets");
  if (tensor_sizes.size() != plan.tensor_counts.size())
    throw CollectiveUsageError(w + std::to_string(tensor_sizes.size()) + " tensors given, the plan has " +
                               std::to_string(plan.tensor_counts.size()));
  for (const BucketPiece& p : plan.pieces_of(bucket))
    if (tensor_sizes[p.tensor] != plan.tensor_counts[p.tensor])
      throw CollectiveUsageError(w + "tensor " + std::to_string(p.tensor) + " holds " +
                                 std::to_string(tensor_sizes[p.tensor]) + " elements, the plan was made for " +
                                 std::to_string(plan.tensor_counts[p.tensor]));
  if (buffer_count < plan.buckets[bucket].count)
    throw CollectiveUsageError(w + "buffer holds " + std::to_string(buffer_count) + " elements, the bucket needs " +
                               std::to_string(plan.buckets[bucket].count));
}
}  // namespace detail

}  // namespace strata::coll
