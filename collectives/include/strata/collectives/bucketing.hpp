// Bucketing: packs many small tensors into fixed-size buckets so that one collective
// moves many of them (a collective per 4 KiB bias costs its latency, not its bytes).
//
// The plan is made once from the tensors' element counts; each step packs the tensors
// of a bucket into a bucket buffer, runs one collective over the buffer, and unpacks.
// Counts are elements of one type: a bucket holds tensors of a single dtype.
//
//   plan = plan_buckets(counts, {.capacity = 1 << 20});
//   for b in buckets: pack(plan, b, grads, buf); comm.all_reduce(buf...); unpack(...)
//
// Packing copies on the host (memcpy); for device buffers use the plan's pieces to
// drive copies on a stream instead.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/dtype.hpp"

namespace strata::coll {

// What to do with a tensor larger than a bucket.
enum class Oversize {
  Split,      // cut it into pieces across consecutive buckets (fine for all_reduce)
  OwnBucket,  // give it a bucket of its own, larger than capacity (keeps it whole)
};

struct BucketOptions {
  size_t capacity = 0;  // elements per bucket; > 0
  size_t align = 1;     // every piece starts at a multiple of this many elements; > 0
  Oversize oversize = Oversize::Split;
};

// A contiguous run of one tensor inside one bucket.
struct BucketPiece {
  size_t tensor;         // index into the counts given to plan_buckets
  size_t tensor_offset;  // elements from the tensor's start
  size_t bucket_offset;  // elements from the bucket's start
  size_t count;          // elements
};

struct Bucket {
  size_t first_piece = 0;  // index into BucketPlan::pieces
  size_t piece_count = 0;
  size_t count = 0;  // elements from the bucket's start to the end of its last piece
};

struct BucketPlan {
  size_t capacity = 0;                // elements, as asked
  std::vector<size_t> tensor_counts;  // elements per tensor, as given
  std::vector<Bucket> buckets;        // in order; a tensor's pieces are in order too
  std::vector<BucketPiece> pieces;    // grouped by bucket

  std::span<const BucketPiece> pieces_of(size_t bucket) const {
    const Bucket& b = buckets.at(bucket);
    return std::span<const BucketPiece>(pieces).subspan(b.first_piece, b.piece_count);
  }
  // The largest bucket's count: the buffer size that every bucket fits in.
  size_t max_count() const;
};

// Throws CollectiveUsageError for a zero capacity or alignment. Zero-length tensors
// get no piece. Tensors keep their order: the plan fills bucket 0 first.
BucketPlan plan_buckets(std::span<const size_t> tensor_counts, const BucketOptions& opt);

// A bucket's element count rounded up to a multiple of `multiple` (the world size,
// so that reduce_scatter can cut it into equal slices).
size_t padded_count(const Bucket& b, size_t multiple);

namespace detail {
void check_pack_args(const BucketPlan& plan, size_t bucket, std::span<const size_t> tensor_sizes,
                     size_t buffer_count, const char* what);
}

// Copies the pieces of `bucket` from tensors into buffer and zeroes every element of
// buffer that no piece covers (alignment gaps, padding), so that padding never
// carries stale values into a sum. buffer.size() must be at least the bucket's count.
template <Element T>
void pack(const BucketPlan& plan, size_t bucket, std::span<const std::span<const T>> tensors,
          std::span<T> buffer) {
  std::vector<size_t> sizes;
  sizes.reserve(tensors.size());
  for (const auto& t : tensors) sizes.push_back(t.size());
  detail::check_pack_args(plan, bucket, sizes, buffer.size(), "pack");
  size_t filled = 0;
  for (const BucketPiece& p : plan.pieces_of(bucket)) {
    std::memset(static_cast<void*>(buffer.data() + filled), 0, (p.bucket_offset - filled) * sizeof(T));
    std::memcpy(static_cast<void*>(buffer.data() + p.bucket_offset), tensors[p.tensor].data() + p.tensor_offset,
                p.count * sizeof(T));
    filled = p.bucket_offset + p.count;
  }
  std::memset(static_cast<void*>(buffer.data() + filled), 0, (buffer.size() - filled) * sizeof(T));
}

// Copies the pieces of `bucket` from buffer back into tensors.
template <Element T>
void unpack(const BucketPlan& plan, size_t bucket, std::span<const T> buffer,
            std::span<const std::span<T>> tensors) {
  std::vector<size_t> sizes;
  sizes.reserve(tensors.size());
  for (const auto& t : tensors) sizes.push_back(t.size());
  detail::check_pack_args(plan, bucket, sizes, buffer.size(), "unpack");
  for (const BucketPiece& p : plan.pieces_of(bucket))
    std::memcpy(static_cast<void*>(tensors[p.tensor].data() + p.tensor_offset), buffer.data() + p.bucket_offset,
                p.count * sizeof(T));
}

}  // namespace strata::coll
