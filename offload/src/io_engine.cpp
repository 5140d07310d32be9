// IoEngine: transfers split into block_size requests over one or more rings. Each ring
// is one thread that owns its backend, so the backend needs no locks and io_uring may
// run single-issuer with deferred task running (completions are processed only when the
// ring thread waits, which it does anyway). Callers hand work over under a short lock and
// wake the ring only when it sleeps with room for more.
#include "strata/offload/io_engine.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/offload/fault_injection.hpp"

namespace strata {

const char* to_string(IoDir d) { return d == IoDir::Read ? "read" : "write"; }

namespace {

constexpr uint64_t kMaxBufferSlice = 1ull << 30;  // the kernel refuses registered buffers over 1 GiB
constexpr unsigned kMaxRetries = 100;              // EAGAIN/EINTR (or no progress) on one request

// One request-sized piece of a transfer: at most block_size bytes, within one file.
struct Piece {
  unsigned file;
  uint64_t offset;  // bytes into the file
  char* buf;
  uint32_t len;     // bytes
};

// One submitted transfer; its pieces may be spread over several rings (parts).
struct Job {
  IoDir dir = IoDir::Read;
  std::atomic<unsigned> parts_left{0};
  std::mutex mu;
  std::exception_ptr error;  // the first error of any part
  std::shared_ptr<HostEvent> event;
  IoFinish finish;

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
};

// The share of a job that one ring moves.
struct Part {
  std::shared_ptr<Job> job;
  std::vector<Piece> pieces;
  size_t next = 0;           // first piece not yet issued
  unsigned outstanding = 0;  // pieces issued and not finished
  bool failed = false;       // stop issuing: the job has already failed
};

// A registered-buffer slot as a ring sees it.
struct Region {
  char* base;
  uint64_t bytes;
  unsigned slot;
};

struct Counters {
  std::atomic<uint64_t> transfers{0}, requests{0}, fixed_requests{0}, bytes{0}, short_resubmits{0},
      retries{0}, failed_transfers{0};
};

using BackendFactory = std::function<std::unique_ptr<IoBackend>(std::vector<std::string>* notes)>;

class Ring {
 public:
  Ring(const IoEngineOptions& opts, Counters& counters, BackendFactory make)
      : opts_(opts), counters_(counters), depth_(opts.aio.queue_depth) {
    std::promise<void> ready;
    auto started = ready.get_future();
    thread_ = std::thread([this, &ready, make = std::move(make)] { main(make, ready); });
    try {
      started.get();
    } catch (...) {
      thread_.join();
      throw;
    }
  }

  ~Ring() {
    {
      // Under the lock: the ring thread drops its backend under it once it has stopped.
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      if (backend_) backend_->wake();
    }
    thread_.join();
  }

  void post(std::unique_ptr<Part> p) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      STRATA_CHECK(!stop_, "I/O submitted to an engine that is shutting down");
      incoming_.push_back(p.release());
      wake = waiting_;
      waiting_ = false;
    }
    if (wake) backend_->wake();
  }

  // Runs fn on the ring's thread (registration must come from the ring's submitter) and
  // waits for it.
  void run_task(const std::function<void(IoBackend&, std::vector<Region>&)>& fn) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      fn(*backend_, regions_);
      return;
    }
    std::promise<void> done;
    auto f = done.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back([&] {
        try {
          fn(*backend_, regions_);
          done.set_value();
        } catch (...) {
          done.set_exception(std::current_exception());
        }
      });
      waiting_ = false;
    }
    backend_->wake();
    f.get();
  }

  const std::vector<std::string>& notes() const { return notes_; }
  const char* backend_name() const { return name_; }
  unsigned buffer_slots() const { return slots_; }
  bool sqpoll() const { return sqpoll_; }

 private:
  struct Slot {
    Part* part = nullptr;
    Piece piece{};
    uint32_t done = 0;     // bytes of the piece already moved
    unsigned retries = 0;  // consecutive retries without progress
  };

  void main(const BackendFactory& make, std::promise<void>& ready) {
    try {
      backend_ = make(&notes_);
      std::vector<int> fds;
      for (const auto& f : opts_.files) fds.push_back(f.fd);
      backend_->set_files(fds, &notes_);
      name_ = backend_->name();
      slots_ = backend_->buffer_slots();
      sqpoll_ = backend_->sqpoll();
      slots_in_use_.assign(depth_, Slot{});
      for (unsigned i = depth_; i-- > 0;) free_.push_back(i);
    } catch (...) {
      backend_.reset();
      ready.set_exception(std::current_exception());
      return;
    }
    ready.set_value();
    loop();
    std::lock_guard<std::mutex> lock(mu_);
    backend_.reset();  // on the thread that drove it
  }

  bool idle() const { return inflight_ == 0 && active_.empty(); }

  // Room for new pieces: with overlap_events, whenever fewer than queue_depth are in
  // flight; without, only once everything submitted has come back (batch by batch).
  bool can_accept() const { return opts_.aio.overlap_events ? inflight_ < depth_ : submitted_ == 0; }

  void loop() {
    std::vector<RawCompletion> cq(depth_ + 8);
    for (;;) {
      bool stopping = intake();
      fill();
      if (stopping && idle()) return;
      unsigned wait_for = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (incoming_.empty() && tasks_.empty() && !(stop_ && idle())) {
          wait_for = 1;
          waiting_ = can_accept() && active_.empty();
        }
      }
      submit(wait_for);
      if (wait_for) {
        std::lock_guard<std::mutex> lock(mu_);
        waiting_ = false;
      }
      size_t n = backend_->reap(cq.data(), cq.size());
      for (size_t i = 0; i < n; ++i) on_completion(cq[i]);
    }
  }

  // Takes what callers handed over; runs control tasks. Returns whether stop was asked.
  // The vectors trade places with the shared ones, so no allocation in steady state.
  bool intake() {
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      taken_parts_.swap(incoming_);
      taken_tasks_.swap(tasks_);
      stop = stop_;
    }
    for (auto& t : taken_tasks_) t();
    taken_tasks_.clear();
    for (Part* p : taken_parts_) active_.push_back(p);
    taken_parts_.clear();
    return stop;
  }

  // Queue: retries first (they hold slots already), then new pieces up to the depth.
  // The loop submits what is queued (issue() may submit earlier, see there).
  void fill() {
    while (!retry_.empty()) {
      issue(retry_.front());
      retry_.pop_front();
    }
    if (opts_.aio.overlap_events || submitted_ == 0) {
      while (inflight_ < depth_ && !active_.empty()) {
        Part* p = active_.front();
        if (p->failed || p->next == p->pieces.size()) {
          active_.pop_front();
          continue;
        }
        uint32_t s = free_.back();
        free_.pop_back();
        slots_in_use_[s] = Slot{p, p->pieces[p->next++], 0, 0};
        ++p->outstanding;
        ++inflight_;
        issue(s);
        if (p->next == p->pieces.size()) active_.pop_front();
      }
    }
  }

  int buffer_index(const char* buf, uint32_t len) const {
    if (regions_.empty()) return -1;
    auto it = std::upper_bound(regions_.begin(), regions_.end(), buf,
                               [](const char* b, const Region& r) { return b < r.base; });
    if (it == regions_.begin()) return -1;
    --it;
    if (buf + len <= it->base + it->bytes) return static_cast<int>(it->slot);
    return -1;
  }

  void issue(uint32_t s) {
    Slot& sl = slots_in_use_[s];
    RawOp op;
    op.tag = s;
    op.dir = sl.part->job->dir;
    op.file = sl.piece.file;
    op.offset = sl.piece.offset + sl.done;
    op.buf = sl.piece.buf + sl.done;
    op.len = sl.piece.len - sl.done;
    op.buf_index = buffer_index(static_cast<char*>(op.buf), op.len);
    // Requests that touch end to end and go to the kernel in one submission are merged by
    // the block layer's plug into larger ones (up to max_sectors_kb): queue_depth requests
    // of block_size become a few big ones, and the device sees a fraction of the depth
    // asked for (on the virtio disk this was measured on: 1 MiB x 16 became ~3.2 MiB x 4,
    // 10-15% slower). So a request adjacent to the one queued just before it goes in a
    // submission of its own; random requests still share one.
    if (last_.queued && last_.file == op.file &&
        (op.offset == last_.end || op.offset + op.len == last_.start))
      submit(0);
    backend_->queue(op);
    last_ = Queued{true, op.file, op.offset, op.offset + op.len};
    ++submitted_;
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    if (op.buf_index >= 0) counters_.fixed_requests.fetch_add(1, std::memory_order_relaxed);
    if (opts_.aio.single_submit) submit(0);
  }

  // Submit: everything queued goes to the backend in one call.
  void submit(unsigned wait_for) {
    last_.queued = false;
    backend_->submit(wait_for);
  }

  std::exception_ptr io_error(const Slot& sl, const char* what, int err) const {
    const Piece& pc = sl.piece;
    std::string w = std::string(to_string(sl.part->job->dir)) + " " + what;
    return std::make_exception_ptr(
        IoError(w, opts_.files[pc.file].path, pc.offset + sl.done, pc.len - sl.done, err, opts_.on_full));
  }

  // Complete: every result is read. Short transfers go round again for the remainder,
  // EAGAIN/EINTR are retried, anything else fails the request and so its transfer.
  void on_completion(const RawCompletion& c) {
    STRATA_CHECK(c.tag < depth_, "completion with an unknown tag " + std::to_string(c.tag));
    uint32_t s = static_cast<uint32_t>(c.tag);
    Slot& sl = slots_in_use_[s];
    STRATA_CHECK(sl.part != nullptr, "completion for an idle request slot");
    --submitted_;
    const uint32_t want = sl.piece.len - sl.done;
    if (c.result < 0) {
      int err = static_cast<int>(-c.result);
      if ((err == EAGAIN || err == EINTR) && sl.retries < kMaxRetries) {
        ++sl.retries;
        counters_.retries.fetch_add(1, std::memory_order_relaxed);
        retry_.push_back(s);
        return;
      }
      const char* what = (err == EAGAIN || err == EINTR) ? "failed after 100 retries" : "failed";
      finish_request(s, io_error(sl, what, err));
      return;
    }
    const uint64_t got = static_cast<uint64_t>(c.result);
    STRATA_CHECK(got <= want, "the kernel reported " + std::to_string(got) + " bytes for a request of " +
                                  std::to_string(want));
    if (got == want) {
      counters_.bytes.fetch_add(sl.piece.len, std::memory_order_relaxed);
      finish_request(s, nullptr);
      return;
    }
    if (got == 0) {  // end of file, or a device that gave up without an error code
      finish_request(s, io_error(sl, "moved 0 bytes (past the end of the file?)", EIO));
      return;
    }
    // Short: resume from the last aligned byte (O_DIRECT needs it); re-moving the few
    // bytes below it is harmless for both directions.
    uint32_t before = sl.done;
    uint32_t done = sl.done + static_cast<uint32_t>(got);
    done -= static_cast<uint32_t>(done % opts_.alignment);
    if (done > before) {
      sl.retries = 0;
    } else if (++sl.retries >= kMaxRetries) {
      finish_request(s, io_error(sl, "made no progress (short transfers below the O_DIRECT alignment)", EIO));
      return;
    }
    sl.done = done;
    counters_.short_resubmits.fetch_add(1, std::memory_order_relaxed);
    retry_.push_back(s);
  }

  void finish_request(uint32_t s, std::exception_ptr err) {
    Slot& sl = slots_in_use_[s];
    Part* p = sl.part;
    sl = Slot{};
    free_.push_back(s);
    --inflight_;
    --p->outstanding;
    if (err) {
      p->job->fail(std::move(err));
      if (!p->failed) {
        p->failed = true;
        if (p->next < p->pieces.size()) std::erase(active_, p);
      }
    }
    if (p->outstanding == 0 && (p->failed || p->next == p->pieces.size())) complete_part(p);
  }

  void complete_part(Part* p) {
    std::shared_ptr<Job> job = std::move(p->job);
    delete p;
    if (job->parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      err = job->error;
    }
    if (job->finish) {
      try {
        err = job->finish(err);
      } catch (...) {
        err = std::current_exception();
      }
    }
    if (err) counters_.failed_transfers.fetch_add(1, std::memory_order_relaxed);
    job->event->complete(err);
  }

  const IoEngineOptions& opts_;
  Counters& counters_;
  const unsigned depth_;
  std::unique_ptr<IoBackend> backend_;
  std::vector<std::string> notes_;
  const char* name_ = "";
  unsigned slots_ = 0;
  bool sqpoll_ = false;
  std::thread thread_;

  // Shared with callers, under mu_.
  std::mutex mu_;
  std::vector<Part*> incoming_;
  std::vector<std::function<void()>> tasks_;
  bool waiting_ = false;  // the ring sleeps with room for more: a post must wake it
  bool stop_ = false;

  // The ring thread's own.
  std::vector<Part*> taken_parts_;               // intake() scratch
  std::vector<std::function<void()>> taken_tasks_;
  std::deque<Part*> active_;      // parts with pieces not yet issued, oldest first
  std::vector<Slot> slots_in_use_;  // [queue_depth]; the op tag is the slot index
  std::vector<uint32_t> free_;
  std::deque<uint32_t> retry_;    // slots to issue again (short, EAGAIN, EINTR)
  unsigned inflight_ = 0;         // slots held (in the backend or waiting to retry)
  unsigned submitted_ = 0;        // ops in the backend
  struct Queued {
    bool queued = false;  // an op is queued and not yet submitted
    unsigned file = 0;
    uint64_t start = 0, end = 0;  // bytes into the file
  } last_;                        // the op queued last, for the merge check in issue()
  std::vector<Region> regions_;   // registered buffers, sorted by base
};

}  // namespace

struct IoEngine::Impl {
  IoEngineOptions opts;
  Counters counters;
  std::vector<std::unique_ptr<Ring>> rings;
  std::atomic<unsigned> next_ring{0};
  std::string name;
  std::vector<std::string> notes;

  std::mutex reg_mu;
  std::vector<bool> slot_taken;                            // engine-wide slot numbers
  std::vector<std::pair<char*, std::vector<unsigned>>> registered;  // region base -> its slots
  bool fixed = false;
};

IoEngine::IoEngine(IoEngineOptions opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = std::move(opts);
  const AioConfig& aio = m.opts.aio;
  STRATA_CHECK(aio.queue_depth >= 1 && aio.intra_op_parallelism >= 1, "queue_depth and rings must be >= 1");
  STRATA_CHECK(m.opts.alignment > 0 && (m.opts.alignment & (m.opts.alignment - 1)) == 0,
               "alignment must be a power of two");
  STRATA_CHECK(aio.block_size % m.opts.alignment == 0 && aio.block_size <= (1ull << 30),
               "block_size must be a multiple of the alignment and at most 1 GiB");
  auto faults = m.opts.faults;
  auto factory = [&aio, faults](IoEngineKind kind) -> BackendFactory {
    return [&aio, faults, kind](std::vector<std::string>* notes) {
      std::unique_ptr<IoBackend> b;
      if (kind == IoEngineKind::ThreadPool) {
        b = make_threadpool_backend(aio.queue_depth);
      } else {
        if (faults && faults->refuse_uring) throw Unavailable("io_uring setup refused (injected by the fault plan)");
        b = make_uring_backend(aio.queue_depth, aio.use_sqpoll, notes, faults);
      }
      if (faults) b = make_fault_backend(std::move(b), faults);
      return b;
    };
  };
  IoEngineKind kind = aio.engine == IoEngineKind::ThreadPool ? IoEngineKind::ThreadPool : IoEngineKind::Uring;
  if (kind == IoEngineKind::Uring) {
    try {
      m.rings.push_back(std::make_unique<Ring>(m.opts, m.counters, factory(kind)));
    } catch (const Unavailable& e) {
      if (aio.engine == IoEngineKind::Uring) throw;
      log::warn_once("io-uring-refused", std::string("I/O engine: ") + e.what() +
                                             "; using the pread/pwrite thread pool instead (slower)");
      kind = IoEngineKind::ThreadPool;
    }
  }
  while (m.rings.size() < aio.intra_op_parallelism)
    m.rings.push_back(std::make_unique<Ring>(m.opts, m.counters, factory(kind)));
  m.name = m.rings[0]->backend_name();
  // Fault decorators report their inner backend's name, so the name is the engine's.
  m.notes = m.rings[0]->notes();
  // SQPOLL as running, from the backends (the thread pool has none): on only when every
  // ring has it, as a config that says so must hold for all of them.
  auto without = std::find_if(m.rings.begin(), m.rings.end(), [](const auto& r) { return !r->sqpoll(); });
  if (aio.use_sqpoll && without != m.rings.end() && kind == IoEngineKind::Uring) {
    // Asked for and refused by the kernel: worth a warning, with the reasons it gave.
    std::string why;
    for (const auto& n : (*without)->notes()) why += (why.empty() ? "" : "; ") + n;
    log::warn_once("io-uring-sqpoll", "I/O engine: aio.use_sqpoll is set but SQPOLL is off (" + why + ")");
  } else {
    for (const auto& n : m.notes) log::debug("I/O engine: " + n);
  }
  m.opts.aio.use_sqpoll = without == m.rings.end();
  m.opts.aio.engine = kind;
  unsigned slots = m.rings[0]->buffer_slots();
  for (auto& r : m.rings) slots = std::min(slots, r->buffer_slots());
  m.slot_taken.assign(slots, false);
  m.fixed = slots > 0;
}

IoEngine::~IoEngine() = default;  // each Ring drains its work, then stops

Event IoEngine::submit(IoDir dir, std::span<const IoSegment> segments, IoFinish finish) {
  Impl& m = *impl_;
  const uint64_t a = m.opts.alignment;
  const uint64_t bs = m.opts.aio.block_size;
  std::vector<Piece> pieces;
  for (const auto& s : segments) {
    STRATA_CHECK(s.file < m.opts.files.size(), "segment names file " + std::to_string(s.file) + " of " +
                                                   std::to_string(m.opts.files.size()));
    const auto addr = reinterpret_cast<uintptr_t>(s.buf);
    STRATA_CHECK(s.offset % a == 0 && s.bytes % a == 0 && addr % a == 0,
                 std::string("misaligned ") + to_string(dir) + " on " + m.opts.files[s.file].path + ": offset " +
                     std::to_string(s.offset) + ", length " + std::to_string(s.bytes) + ", buffer " +
                     std::to_string(addr) + " must all be multiples of " + std::to_string(a) +
                     " (O_DIRECT alignment)");
    for (uint64_t o = 0; o < s.bytes; o += bs)
      pieces.push_back(Piece{s.file, s.offset + o, static_cast<char*>(s.buf) + o,
                             static_cast<uint32_t>(std::min(bs, s.bytes - o))});
  }
  m.counters.transfers.fetch_add(1, std::memory_order_relaxed);
  auto [event, host] = HostEvent::make();
  if (pieces.empty()) {
    std::exception_ptr err;
    if (finish) {
      try {
        err = finish(nullptr);
      } catch (...) {
        err = std::current_exception();
      }
    }
    host->complete(err);
    return event;
  }
  auto job = std::make_shared<Job>();
  job->dir = dir;
  job->event = host;
  job->finish = std::move(finish);
  // Spread large transfers over the rings in contiguous runs; small ones go to the next
  // ring in turn so that concurrent callers still use them all.
  const size_t R = m.rings.size();
  const size_t nparts = std::min(R, pieces.size());
  const size_t per = (pieces.size() + nparts - 1) / nparts;
  const size_t used_parts = (pieces.size() + per - 1) / per;
  job->parts_left.store(static_cast<unsigned>(used_parts));
  const unsigned first = m.next_ring.fetch_add(1, std::memory_order_relaxed);
  for (size_t k = 0; k < used_parts; ++k) {
    auto part = std::make_unique<Part>();
    part->job = job;
    size_t lo = k * per, hi = std::min(pieces.size(), lo + per);
    if (used_parts == 1)
      part->pieces = std::move(pieces);
    else
      part->pieces.assign(pieces.begin() + static_cast<ptrdiff_t>(lo), pieces.begin() + static_cast<ptrdiff_t>(hi));
    m.rings[(first + k) % R]->post(std::move(part));
  }
  return event;
}

Event IoEngine::read(unsigned file, uint64_t offset, void* buf, uint64_t bytes) {
  IoSegment s{file, offset, buf, bytes};
  return submit(IoDir::Read, std::span<const IoSegment>(&s, 1));
}

Event IoEngine::write(unsigned file, uint64_t offset, const void* buf, uint64_t bytes) {
  IoSegment s{file, offset, const_cast<void*>(buf), bytes};
  return submit(IoDir::Write, std::span<const IoSegment>(&s, 1));
}

void IoEngine::register_buffer(void* base, uint64_t bytes) {
  Impl& m = *impl_;
  if (!m.fixed || bytes == 0) return;
  std::lock_guard<std::mutex> lock(m.reg_mu);
  for (const auto& r : m.registered)
    STRATA_CHECK(r.first != base, "buffer registered twice");
  std::vector<unsigned> slots;
  char* p = static_cast<char*>(base);
  for (uint64_t off = 0; off < bytes; off += kMaxBufferSlice) {
    uint64_t len = std::min(kMaxBufferSlice, bytes - off);
    auto it = std::find(m.slot_taken.begin(), m.slot_taken.end(), false);
    if (it == m.slot_taken.end()) {
      log::warn_once("io-uring-slots", "I/O engine: no registered-buffer slot left; " + format_bytes(len) +
                                           " of buffers will use unregistered I/O");
      break;
    }
    unsigned slot = static_cast<unsigned>(it - m.slot_taken.begin());
    *it = true;
    slots.push_back(slot);
    char* sb = p + off;
    for (auto& ring : m.rings) {
      ring->run_task([&](IoBackend& b, std::vector<Region>& regions) {
        if (int r = b.set_buffer(slot, sb, len); r < 0) {
          log::warn_once("io-uring-register-buffer",
                         "I/O engine: the kernel refused to register a " + format_bytes(len) + " buffer: " +
                             std::strerror(-r) + (r == -ENOMEM ? " (locked-memory limit?)" : "") +
                             "; it will use unregistered I/O");
          return;
        }
        Region r{sb, len, slot};
        regions.insert(std::upper_bound(regions.begin(), regions.end(), r,
                                        [](const Region& x, const Region& y) { return x.base < y.base; }),
                       r);
      });
    }
  }
  m.registered.emplace_back(p, std::move(slots));
}

void IoEngine::unregister_buffer(void* base) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.reg_mu);
  auto it = std::find_if(m.registered.begin(), m.registered.end(), [&](const auto& r) { return r.first == base; });
  if (it == m.registered.end()) return;
  for (unsigned slot : it->second) {
    for (auto& ring : m.rings) {
      ring->run_task([&](IoBackend& b, std::vector<Region>& regions) {
        const bool held = std::erase_if(regions, [&](const Region& r) { return r.slot == slot; }) > 0;
        // No op names the slot any more, so a refusal costs only memory: the kernel keeps
        // the old pages pinned until the slot is registered again or the ring is closed.
        if (int r = held ? b.set_buffer(slot, nullptr, 0) : 0; r < 0)
          log::warn_once("io-uring-unregister-buffer", "I/O engine: the kernel refused to clear registered-buffer slot " +
                                                           std::to_string(slot) + ": " + std::strerror(-r) +
                                                           "; its pages stay pinned until the slot is reused");
      });
    }
    m.slot_taken[slot] = false;
  }
  m.registered.erase(it);
}

std::string IoEngine::name() const { return impl_->name; }
uint64_t IoEngine::alignment() const { return impl_->opts.alignment; }
const AioConfig& IoEngine::config() const { return impl_->opts.aio; }
bool IoEngine::fixed_buffers() const { return impl_->fixed; }
const std::vector<std::string>& IoEngine::notes() const { return impl_->notes; }

IoStats IoEngine::stats() const {
  const Counters& c = impl_->counters;
  IoStats s;
  s.transfers = c.transfers.load();
  s.requests = c.requests.load();
  s.fixed_requests = c.fixed_requests.load();
  s.bytes = c.bytes.load();
  s.short_resubmits = c.short_resubmits.load();
  s.retries = c.retries.load();
  s.failed_transfers = c.failed_transfers.load();
  return s;
}

}  // namespace strata
