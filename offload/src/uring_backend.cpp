// The io_uring backend. One ring per engine ring, driven by one thread, so setup tries
// single-issuer with deferred task running first: completions are then processed only
// when that thread waits, with no inter-processor interrupts. Every feature that the
// kernel (or a policy) refuses is dropped, and the reason noted, rather than failing.
// Every call's answer is read: EINTR (and, where the kernel means "not now", EAGAIN and
// EBUSY) is retried or handed back to the engine's loop; any other refusal of an optional
// feature is noted, and of a submit or wait is fatal, naming the call and the errno.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "strata/core/error.hpp"
#include "strata/offload/fault_injection.hpp"
#include "strata/offload/io_engine.hpp"

namespace strata {

namespace {

constexpr uint64_t kWakeTag = ~0ull;    // the eventfd read that wake() completes
constexpr unsigned kBufferSlots = 1024; // sparse registered-buffer table (kernel max 16384)

std::string errstr(int neg) { return std::string(std::strerror(-neg)) + " (errno " + std::to_string(-neg) + ")"; }

// io_uring_register may be interrupted while the kernel quiesces the ring; nothing has
// changed then, so the call is made again.
template <class Call>
int register_call(Call&& call) {
  int r;
  do r = call();
  while (r == -EINTR);
  return r;
}

class UringBackend final : public IoBackend {
 public:
  UringBackend(unsigned depth, bool sqpoll, std::vector<std::string>* notes, std::shared_ptr<FaultPlan> faults)
      : faults_(std::move(faults)) {
    std::vector<std::string> dropped;
    // Room for every data op plus the wake-up read.
    const unsigned entries = depth + 2;
    struct Try {
      unsigned flags;
      const char* what;
    };
    std::vector<Try> tries;
    if (sqpoll) {
      tries.push_back({IORING_SETUP_SQPOLL | IORING_SETUP_SINGLE_ISSUER, "SQPOLL + single issuer"});
      tries.push_back({IORING_SETUP_SQPOLL, "SQPOLL"});
    }
    tries.push_back({IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, "single issuer + deferred task running"});
    tries.push_back({IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG, "cooperative task running"});
    tries.push_back({0, "plain"});
    int r = -EINVAL;
    int sqpoll_err = 0;
    for (const auto& t : tries) {
      io_uring_params p{};
      p.flags = t.flags;
      if (t.flags & IORING_SETUP_SQPOLL) p.sq_thread_idle = 50;  // ms before the kernel thread sleeps
      r = io_uring_queue_init_params(entries, &ring_, &p);
      if (r == 0) {
        flags_ = t.flags;
        break;
      }
      if (t.flags & IORING_SETUP_SQPOLL)
        sqpoll_err = r;  // noted once below, whichever SQPOLL set-up was refused last
      else
        dropped.push_back(std::string(t.what) + " refused: " + errstr(r));
    }
    if (r != 0) {
      std::string why = "io_uring_setup refused: " + errstr(r);
      if (r == -EPERM) why += " (kernel.io_uring_disabled or a seccomp policy forbids io_uring)";
      throw Unavailable(why);
    }
    live_ = true;
    if (sqpoll && !(flags_ & IORING_SETUP_SQPOLL) && notes)
      notes->push_back("SQPOLL refused (" + errstr(sqpoll_err) + "); the ring thread submits instead");
    if (notes) notes->insert(notes->end(), dropped.begin(), dropped.end());
    defer_ = (flags_ & IORING_SETUP_DEFER_TASKRUN) != 0;

    if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
      bool rw = io_uring_opcode_supported(probe, IORING_OP_READ) && io_uring_opcode_supported(probe, IORING_OP_WRITE);
      fixed_ops_ = io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                   io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
      io_uring_free_probe(probe);
      if (!rw) {
        io_uring_queue_exit(&ring_);
        live_ = false;
        throw Unavailable("io_uring lacks IORING_OP_READ/WRITE (kernel older than 5.6)");
      }
    } else if (notes) {
      notes->push_back("io_uring opcode probe refused; assuming READ/WRITE and fixed buffers work");
    }
    if (fixed_ops_) {
      int b = register_call([&] { return io_uring_register_buffers_sparse(&ring_, kBufferSlots); });
      if (b >= 0)
        slots_ = kBufferSlots;
      else if (notes)
        notes->push_back("registered buffers refused: " + errstr(b) + "; using unregistered buffers");
    } else if (notes) {
      notes->push_back("READ_FIXED/WRITE_FIXED not supported; using unregistered buffers");
    }
    // Saves the ring-fd lookup on every io_uring_enter; without it (kernels before 5.18)
    // liburing goes on using the ring's fd.
    int rfd = injected(UringCall::RegisterRingFd);
    if (rfd == 0) rfd = register_call([&] { return io_uring_register_ring_fd(&ring_); });
    if (rfd < 0 && notes) notes->push_back("ring fd registration refused: " + errstr(rfd));

    wake_fd_ = eventfd(0, EFD_CLOEXEC);  // blocking: io_uring then polls it instead of failing
    if (wake_fd_ < 0) {
      int e = errno;
      io_uring_queue_exit(&ring_);
      live_ = false;
      throw Unavailable(std::string("eventfd for the io_uring wake-up refused: ") + std::strerror(e));
    }
    arm_wake();
  }

  ~UringBackend() override {
    if (live_) io_uring_queue_exit(&ring_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  const char* name() const override { return "io_uring"; }
  bool sqpoll() const override { return (flags_ & IORING_SETUP_SQPOLL) != 0; }

  void set_files(const std::vector<int>& fds, std::vector<std::string>* notes) override {
    fds_ = fds;
    if (fds.empty()) return;
    int r = injected(UringCall::RegisterFiles);
    if (r == 0)
      r = register_call([&] { return io_uring_register_files(&ring_, fds.data(), static_cast<unsigned>(fds.size())); });
    fixed_files_ = r == 0;
    if (r < 0 && notes) notes->push_back("registered files refused: " + errstr(r) + "; ops name the file descriptors");
  }

  unsigned buffer_slots() const override { return slots_; }

  int set_buffer(unsigned slot, void* base, uint64_t bytes) override {
    STRATA_CHECK(slot < slots_, "registered-buffer slot out of range");
    iovec iov{base, static_cast<size_t>(bytes)};
    int r = injected(UringCall::RegisterBuffer);
    if (r == 0) r = register_call([&] { return io_uring_register_buffers_update_tag(&ring_, slot, &iov, nullptr, 1); });
    return r < 0 ? r : 0;  // on success, the number of slots updated
  }

  void queue(const RawOp& op) override {
    io_uring_sqe* sqe = get_sqe();
    const int fd = fixed_files_ ? static_cast<int>(op.file) : fds_[op.file];
    if (op.dir == IoDir::Read) {
      if (op.buf_index >= 0)
        io_uring_prep_read_fixed(sqe, fd, op.buf, op.len, op.offset, op.buf_index);
      else
        io_uring_prep_read(sqe, fd, op.buf, op.len, op.offset);
    } else {
      if (op.buf_index >= 0)
        io_uring_prep_write_fixed(sqe, fd, op.buf, op.len, op.offset, op.buf_index);
      else
        io_uring_prep_write(sqe, fd, op.buf, op.len, op.offset);
    }
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, op.tag);
  }

  void submit(unsigned wait_for) override {
    for (;;) {
      const char* call;
      int r = injected(UringCall::Submit);
      if (wait_for > 0) {
        call = "io_uring_submit_and_wait";
        if (r == 0) r = io_uring_submit_and_wait(&ring_, wait_for);
      } else if (defer_) {
        call = "io_uring_submit_and_get_events";  // runs deferred completions so reap sees them
        if (r == 0) r = io_uring_submit_and_get_events(&ring_);
      } else {
        call = "io_uring_submit";
        if (r == 0) r = io_uring_submit(&ring_);
      }
      if (r >= 0) return;
      // Interrupted, or the kernel is short of resources (EAGAIN) / has completions
      // backed up (EBUSY): queued SQEs stay queued and go with the next submit, and the
      // engine reaps what is there. A waiting submit is retried (EINTR) or waits a
      // little for a completion first, so that the engine's loop does not spin.
      if (r == -EINTR || r == -EAGAIN || r == -EBUSY) {
        if (wait_for == 0 || io_uring_cq_ready(&ring_) > 0) return;
        if (r == -EINTR) continue;
        back_off();
        return;
      }
      // EINVAL, EFAULT, EBADF, EEXIST (another thread drove the ring), EOWNERDEAD (the
      // SQPOLL thread died)...: the ring cannot be driven on, and the ops it holds may
      // still be in the kernel's hands (make_uring_backend in io_engine.hpp).
      STRATA_CHECK_NEG_ERRNO_OF(r, call);
    }
  }

  size_t reap(RawCompletion* out, size_t max) override {
    size_t n = 0;
    io_uring_cqe* cqes[64];
    while (n < max) {
      unsigned want = static_cast<unsigned>(std::min<size_t>(64, max - n));
      unsigned got = io_uring_peek_batch_cqe(&ring_, cqes, want);
      if (got == 0) break;
      for (unsigned i = 0; i < got; ++i) {
        uint64_t tag = io_uring_cqe_get_data64(cqes[i]);
        if (tag == kWakeTag) {
          int res = cqes[i]->res;
          STRATA_CHECK(res >= 0 || res == -EINTR || res == -EAGAIN || res == -ECANCELED,
                       "io_uring wake-up read failed: " + errstr(res));
          arm_wake();
        } else {
          out[n++] = RawCompletion{tag, cqes[i]->res};
        }
      }
      io_uring_cq_advance(&ring_, got);
    }
    return n;
  }

  void wake() override {
    uint64_t one = 1;
    ssize_t w;
    do w = ::write(wake_fd_, &one, sizeof one);
    while (w < 0 && errno == EINTR);
    STRATA_CHECK_ERRNO(w);  // an eventfd takes 8 bytes or none
    STRATA_CHECK(w == static_cast<ssize_t>(sizeof one), "short write to the io_uring wake-up eventfd");
  }

 private:
  // 0, or -errno when the fault plan (tests) fails this call in place of the kernel.
  int injected(UringCall call) { return faults_ ? -faults_->uring_call_error(call) : 0; }

  // After EAGAIN/EBUSY with nothing to reap: waits at most 1 ms for a completion (some
  // op may be in flight, or none: the wait is bounded so that a submit refused with
  // nothing in flight is retried rather than waiting for a wake-up that may not come).
  void back_off() {
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 1'000'000};
    int r = injected(UringCall::WaitCqe);
    if (r == 0) r = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    // ETIME: nothing came; EINTR/EAGAIN/EBUSY: as for the submit. The engine's loop submits again.
    if (r == 0 || r == -ETIME || r == -EINTR || r == -EAGAIN || r == -EBUSY) return;
    STRATA_CHECK_NEG_ERRNO_OF(r, "io_uring_wait_cqe_timeout");
  }

  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (!sqe) {
      // The queue has room for queue_depth ops and the wake-up read, all the engine holds;
      // it is full only while an SQPOLL thread has not yet taken the last batch. Submit
      // (which wakes that thread if it sleeps) and wait until it has taken some.
      int r = io_uring_submit(&ring_);
      const char* call = "io_uring_submit";
      if (r >= 0 && sqpoll()) {
        r = io_uring_sqring_wait(&ring_);
        call = "io_uring_sqring_wait";
      }
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) STRATA_CHECK_NEG_ERRNO_OF(r, call);
      sqe = io_uring_get_sqe(&ring_);
      STRATA_CHECK(sqe != nullptr || sqpoll(),
                   "io_uring submission queue full although at most queue_depth ops are outstanding");
    }
    return sqe;
  }

  void arm_wake() {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, wake_fd_, &wake_buf_, sizeof wake_buf_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  std::shared_ptr<FaultPlan> faults_;
  io_uring ring_{};
  bool live_ = false;
  unsigned flags_ = 0;
  bool defer_ = false;
  bool fixed_ops_ = true;
  bool fixed_files_ = false;
  unsigned slots_ = 0;
  std::vector<int> fds_;
  int wake_fd_ = -1;
  uint64_t wake_buf_ = 0;
};

}  // namespace

std::unique_ptr<IoBackend> make_uring_backend(unsigned depth, bool sqpoll, std::vector<std::string>* notes,
                                              std::shared_ptr<FaultPlan> faults) {
  return std::make_unique<UringBackend>(depth, sqpoll, notes, std::move(faults));
}

}  // namespace strata
