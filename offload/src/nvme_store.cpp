// NvmeStore: a swap space (nvme_swap.hpp: swap files through the IoEngine, or the sim's
// virtual channels) carved into extents by a RangeAllocator. The store keeps what each
// extent holds, so that a read of an extent whose last write failed fails too, and, with
// checksums on, what a read must find.
#include "strata/offload/nvme_store.hpp"

#include <mutex>
#include <optional>
#include <unordered_map>

#include "nvme_swap.hpp"
#include "strata/core/error.hpp"
#include "strata/memory/range_allocator.hpp"

namespace strata {

struct NvmeStore::Impl {
  NvmeStoreOptions opts;
  std::unique_ptr<detail::SwapSpace> space;

  // What the store knows of an extent's contents. Checksums are kept per segment of the
  // last write (a stripe unit, or the whole extent with one file) so that a mismatch
  // names the file and the range that went bad.
  enum class Contents { Unwritten, Written, Failed };
  struct State {
    uint64_t gen = 0;  // tells a reallocated extent at the same offset from the old one
    Contents contents = Contents::Unwritten;
    uint64_t bytes = 0;             // bytes of the last write
    std::vector<uint64_t> hashes;   // XXH3_64bits per segment of the last write
  };
  mutable std::mutex mu;
  std::optional<RangeAllocator> ranges;
  std::unordered_map<uint64_t, State> states;  // extent offset -> state
  uint64_t next_gen = 1;

  // The space first: it finishes the transfers in flight, whose completions record into
  // states under mu.
  ~Impl() { space.reset(); }

  State& state_of(const Extent& e, const char* op) {
    STRATA_CHECK(e.valid(), std::string(op) + " of an invalid (empty) extent");
    auto it = states.find(e.offset);
    STRATA_CHECK(it != states.end() && ranges->size_of(e.offset) == e.bytes,
                 std::string(op) + " of an extent that is not allocated: offset " + std::to_string(e.offset) +
                     ", " + std::to_string(e.bytes) + " bytes");
    return it->second;
  }

  void check_buffer(const Extent& e, const void* buf, uint64_t bytes, const char* op) const {
    const uint64_t align = space->layout().align;
    STRATA_CHECK(reinterpret_cast<uintptr_t>(buf) % align == 0,
                 std::string(op) + " buffer " + std::to_string(reinterpret_cast<uintptr_t>(buf)) +
                     " is not aligned to " + std::to_string(align) + " bytes (O_DIRECT)");
    STRATA_CHECK(bytes <= e.bytes, std::string(op) + " of " + std::to_string(bytes) + " bytes into an extent of " +
                                       std::to_string(e.bytes));
  }

  // A write of the extent at `offset` has landed (or failed). A write to an extent freed
  // and reallocated since (another generation) is not recorded: its new owner's is.
  void record_write(uint64_t offset, uint64_t gen, uint64_t bytes, std::exception_ptr err,
                    std::vector<uint64_t> hashes) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = states.find(offset);
    if (it == states.end() || it->second.gen != gen) return;
    State& st = it->second;
    st.contents = err ? Contents::Failed : Contents::Written;
    st.bytes = bytes;
    st.hashes = std::move(hashes);
  }
};

NvmeStore::NvmeStore(NvmeStoreOptions opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = std::move(opts);
  if (m.opts.paths.empty())
    throw ConfigError("nvme store: no paths given; set strata.nvme_path to one or more directories");
  if (m.opts.capacity == 0) throw ConfigError("nvme store: capacity is 0 bytes; set the NVMe budget");
  m.space = detail::make_swap_space(m.opts);
  m.ranges.emplace(m.space->layout().capacity, m.space->layout().grain);
}

NvmeStore::~NvmeStore() = default;

Extent NvmeStore::try_allocate(uint64_t bytes) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto off = m.ranges->allocate(bytes);
  if (!off) return Extent{};
  Impl::State st;
  st.gen = m.next_gen++;
  m.states[*off] = std::move(st);
  return Extent{*off, m.ranges->size_of(*off)};
}

Extent NvmeStore::allocate(uint64_t bytes) {
  Extent e = try_allocate(bytes);
  if (e.valid()) return e;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  throw OutOfBudget("nvme store: no free extent of " + format_bytes(m.ranges->round(bytes)) + " (largest free " +
                    format_bytes(m.ranges->largest_free()) + ", " + format_bytes(m.ranges->used()) + " of " +
                    format_bytes(m.space->layout().capacity) + " in use over " +
                    std::to_string(m.space->files().size()) + " swap file(s)); raise the NVMe budget or free tensors");
}

void NvmeStore::free(const Extent& e) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.state_of(e, "free");
  m.states.erase(e.offset);
  m.ranges->free(e.offset);
}

Event NvmeStore::write(const Extent& e, const void* src, uint64_t bytes, const Event& after) {
  Impl* m = impl_.get();
  m->check_buffer(e, src, bytes, "nvme write");
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    gen = m->state_of(e, "nvme write").gen;
  }
  const uint64_t off = e.offset;
  return m->space->write(off, src, bytes, after, [m, off, gen, bytes](std::exception_ptr err, std::vector<uint64_t> h) {
    m->record_write(off, gen, bytes, err, std::move(h));
  });
}

Event NvmeStore::read(const Extent& e, void* dst, uint64_t bytes, const Event& after) {
  Impl* m = impl_.get();
  m->check_buffer(e, dst, bytes, "nvme read");
  Impl::Contents contents;
  std::vector<uint64_t> expect;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    const Impl::State& st = m->state_of(e, "nvme read");
    contents = st.contents;
    if (m->opts.checksums && contents == Impl::Contents::Written) {
      STRATA_CHECK(bytes == st.bytes, "nvme read of " + std::to_string(bytes) + " bytes from an extent last written with " +
                                          std::to_string(st.bytes) + " bytes: with checksums on, read what was written");
      expect = st.hashes;
    }
  }
  if (contents == Impl::Contents::Failed) {
    auto [ev, host] = HostEvent::make();
    host->complete(std::make_exception_ptr(CorruptionError(
        "nvme store: the extent at logical offset " + std::to_string(e.offset) + " (" + format_bytes(e.bytes) +
        ") holds no valid data: its last write failed")));
    return ev;
  }
  return m->space->read(e.offset, dst, bytes, after, std::move(expect));
}

void NvmeStore::register_buffer(void* base, uint64_t bytes) { impl_->space->register_buffer(base, bytes); }
void NvmeStore::unregister_buffer(void* base) { impl_->space->unregister_buffer(base); }

uint64_t NvmeStore::alignment() const { return impl_->space->layout().align; }
uint64_t NvmeStore::capacity() const { return impl_->space->layout().capacity; }

uint64_t NvmeStore::used() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranges->used();
}

uint64_t NvmeStore::peak() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranges->peak();
}

uint64_t NvmeStore::largest_free() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranges->largest_free();
}

const std::vector<std::string>& NvmeStore::files() const { return impl_->space->files(); }
std::string NvmeStore::engine_name() const { return impl_->space->engine_name(); }
uint64_t NvmeStore::stripe_unit() const { return impl_->space->layout().stripe; }
IoStats NvmeStore::io_stats() const { return impl_->space->io_stats(); }

}  // namespace strata
