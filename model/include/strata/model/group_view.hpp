// A block's parameters and gradient as the model reads and writes them, by element
// offset into the group, whether the weight source hands out the whole group or parts of
// it (weight_source.hpp, gpt_layout.hpp's gpt_parts). A part is acquired when the model
// first reads an element of it and released once the model has said it is done with
// every element in it (or at release_all); a part's gradient is handed back as soon as
// every one of its elements has been written. With one part this is the whole-group
// sequence the engine saw before: acquired at the first read, released after the block.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/model/weight_source.hpp"

namespace strata::detail {

// The parts of group g: their first elements, and sizes.
class PartTable {
 public:
  PartTable(const WeightSource& ws, int g) : numel_(ws.group_numel(g)) {
    const int n = ws.num_parts(g);
    STRATA_CHECK(n >= 1, "weight source group " + std::to_string(g) + " has no parts");
    for (int p = 0; p < n; ++p) begin_.push_back(ws.part_begin(g, p));
    STRATA_CHECK(begin_[0] == 0 && std::is_sorted(begin_.begin(), begin_.end()) && begin_.back() < numel_,
                 "weight source group " + std::to_string(g) + ": parts must start at 0 and rise within the group");
  }
  int count() const { return static_cast<int>(begin_.size()); }
  uint64_t begin(int p) const { return begin_[static_cast<size_t>(p)]; }
  uint64_t end(int p) const { return p + 1 < count() ? begin_[static_cast<size_t>(p) + 1] : numel_; }
  uint64_t size(int p) const { return end(p) - begin(p); }
  int find(uint64_t off) const {
    STRATA_CHECK(off < numel_, "element " + std::to_string(off) + " is outside its group");
    return static_cast<int>(std::upper_bound(begin_.begin(), begin_.end(), off) - begin_.begin()) - 1;
  }
  // fn(part, elements) for each part that elements [off, off + n) touch, in order.
  template <class Fn>
  void each(uint64_t off, uint64_t n, Fn&& fn) const {
    while (n > 0) {
      const int p = find(off);
      const uint64_t k = std::min(n, end(p) - off);
      fn(p, k);
      off += k;
      n -= k;
    }
  }

 private:
  uint64_t numel_;
  std::vector<uint64_t> begin_;
};

// Rows [r0, r1) of a [rows, cols] matrix at `offset` that lie in part `part`.
struct RowSpan {
  int part;
  long r0, r1;
};

class ParamView {
 public:
  ParamView(WeightSource& ws, int g) : ws_(&ws), g_(g), es_(dtype_size(ws.dtype())), t_(ws, g) {
    held_.assign(static_cast<size_t>(t_.count()), nullptr);
    used_.assign(static_cast<size_t>(t_.count()), 0);
  }
  ParamView(const ParamView&) = delete;
  ParamView& operator=(const ParamView&) = delete;
  ~ParamView() = default;  // release_all() is the caller's

  int group() const { return g_; }
  int parts() const { return t_.count(); }
  // Part p's elements of the group, [part_begin, part_end).
  uint64_t part_begin(int p) const { return t_.begin(p); }
  uint64_t part_end(int p) const { return t_.end(p); }
  // Element `off` of the group, its part acquired if it is not yet.
  const void* at(uint64_t off) {
    const int p = t_.find(off);
    const void*& h = held_[static_cast<size_t>(p)];
    if (!h) h = ws_->acquire_part(g_, p);
    return static_cast<const std::byte*>(h) + (off - t_.begin(p)) * es_;
  }
  // Called as a part is handed back: the cuda model returns an event of the kernels it has
  // queued that read the part, and the source orders its reuse of the memory after it
  // (WeightSource::release_part_after). None (the cpu model, whose work is done when the
  // call returns): the part goes back with release_part.
  void set_fence(std::function<Event()> f) { fence_ = std::move(f); }
  // The model has read elements [off, off + n) for the last time in this pass: a part
  // every element of which is done is released (with several parts).
  void done(uint64_t off, uint64_t n) {
    t_.each(off, n, [&](int p, uint64_t k) {
      uint64_t& u = used_[static_cast<size_t>(p)];
      u += k;
      // One part is the whole group: released after the block, as always (release_all).
      if (t_.count() > 1 && u >= t_.size(p) && held_[static_cast<size_t>(p)]) release(p);
    });
  }
  // A new pass over the same block (backward after the recompute): counts start again;
  // parts still held stay held.
  void restart() { std::fill(used_.begin(), used_.end(), 0); }
  // Releases every part still held (those with elements never read in this pass, e.g.
  // biases in backward).
  void release_all() {
    for (int p = 0; p < t_.count(); ++p)
      if (held_[static_cast<size_t>(p)]) release(p);
  }
  // The row ranges of a [rows, cols] matrix at `off` by part (one span when the matrix is
  // in one part; a tile per span when it is tiled).
  std::vector<RowSpan> rows(uint64_t off, long rows, long cols) const { return row_spans(t_, off, rows, cols); }

  static std::vector<RowSpan> row_spans(const PartTable& t, uint64_t off, long rows, long cols) {
    std::vector<RowSpan> out;
    const uint64_t end = off + static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
    for (int p = t.find(off); p < t.count() && t.begin(p) < end; ++p) {
      const uint64_t lo = std::max(off, t.begin(p)), hi = std::min(end, t.end(p));
      STRATA_CHECK((lo - off) % static_cast<uint64_t>(cols) == 0 && (hi - off) % static_cast<uint64_t>(cols) == 0,
                   "a part boundary cuts a matrix row");
      out.push_back({p, static_cast<long>((lo - off) / cols), static_cast<long>((hi - off) / cols)});
    }
    return out;
  }

 private:
  void release(int p) {
    if (fence_)
      ws_->release_part_after(g_, p, fence_());
    else
      ws_->release_part(g_, p);
    held_[static_cast<size_t>(p)] = nullptr;
    used_[static_cast<size_t>(p)] = 0;
  }
  WeightSource* ws_;
  int g_;
  size_t es_;
  PartTable t_;
  std::vector<const void*> held_;
  std::vector<uint64_t> used_;
  std::function<Event()> fence_;
};

class GradView {
 public:
  GradView(WeightSource& ws, int g) : ws_(&ws), g_(g), es_(dtype_size(ws.dtype())), t_(ws, g) {
    held_.assign(static_cast<size_t>(t_.count()), nullptr);
    written_.assign(static_cast<size_t>(t_.count()), 0);
    hold_ = t_.count() == 1;  // the whole group: handed back after the block, as always
  }
  GradView(const GradView&) = delete;
  GradView& operator=(const GradView&) = delete;

  int parts() const { return t_.count(); }
  // Where element `off` of the group's gradient is written.
  void* at(uint64_t off) {
    const int p = t_.find(off);
    void*& h = held_[static_cast<size_t>(p)];
    if (!h) h = ws_->part_gradient(g_, p);
    return static_cast<std::byte*>(h) + (off - t_.begin(p)) * es_;
  }
  // Called as a part is handed back: the cuda model returns an event of the kernels that
  // write it (WeightSource::part_grads_ready_after). None: part_grads_ready.
  void set_fence(std::function<Event()> f) { fence_ = std::move(f); }
  // Elements [off, off + n) are written: a part complete is handed back, unless it is the
  // whole group (handed back at finish, after the block).
  void wrote(uint64_t off, uint64_t n) {
    t_.each(off, n, [&](int p, uint64_t k) {
      uint64_t& w = written_[static_cast<size_t>(p)];
      w += k;
      STRATA_CHECK(w <= t_.size(p), "a gradient element was written twice in one backward");
      if (w == t_.size(p) && !hold_) ready(p);
    });
  }
  // Every part must be complete: hands back those not yet handed back.
  void finish() {
    for (int p = 0; p < t_.count(); ++p) {
      const size_t i = static_cast<size_t>(p);
      STRATA_CHECK(written_[i] == t_.size(p),
                   "block " + std::to_string(g_) + "'s gradient part " + std::to_string(p) + " is incomplete");
      if (held_[i]) ready(p);
    }
  }
  std::vector<RowSpan> rows(uint64_t off, long rows, long cols) const { return ParamView::row_spans(t_, off, rows, cols); }

 private:
  void ready(int p) {
    STRATA_CHECK(held_[static_cast<size_t>(p)], "a gradient part handed back that was never asked for");
    if (fence_)
      ws_->part_grads_ready_after(g_, p, fence_());
    else
      ws_->part_grads_ready(g_, p);
    held_[static_cast<size_t>(p)] = nullptr;
  }
  WeightSource* ws_;
  int g_;
  size_t es_;
  PartTable t_;
  std::vector<void*> held_;
  std::vector<uint64_t> written_;
  bool hold_ = false;
  std::function<Event()> fence_;
};

}  // namespace strata::detail
