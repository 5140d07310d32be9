// The fallback backend when io_uring is refused: pread/pwrite on worker threads. It keeps
// the raw interface's contract (one result per op, short transfers reported as such),
// so the engine above it behaves the same.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "strata/core/error.hpp"
#include "strata/offload/io_engine.hpp"

namespace strata {

namespace {

constexpr unsigned kMaxWorkers = 64;

class ThreadPoolBackend final : public IoBackend {
 public:
  explicit ThreadPoolBackend(unsigned depth) {
    unsigned n = std::clamp(depth, 1u, kMaxWorkers);
    for (unsigned i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
  }

  ~ThreadPoolBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  const char* name() const override { return "threadpool"; }
  bool sqpoll() const override { return false; }
  void set_files(const std::vector<int>& fds, std::vector<std::string>*) override { fds_ = fds; }
  unsigned buffer_slots() const override { return 0; }
  int set_buffer(unsigned, void*, uint64_t) override { return -EOPNOTSUPP; }  // no slots to set

  void queue(const RawOp& op) override { queued_.push_back(op); }

  void submit(unsigned wait_for) override {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t handed = queued_.size();
    for (const auto& op : queued_) work_.push_back(op);
    queued_.clear();
    if (handed == 1)
      work_cv_.notify_one();
    else if (handed > 1)
      work_cv_.notify_all();
    if (wait_for > 0) done_cv_.wait(lock, [&] { return done_.size() >= wait_for || woken_; });
    woken_ = false;
  }

  size_t reap(RawCompletion* out, size_t max) override {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = std::min(max, done_.size());
    std::copy_n(done_.begin(), n, out);
    done_.erase(done_.begin(), done_.begin() + static_cast<ptrdiff_t>(n));
    return n;
  }

  void wake() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  void work() {
    for (;;) {
      RawOp op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
        if (work_.empty()) return;
        op = work_.front();
        work_.pop_front();
      }
      const int fd = fds_[op.file];
      const off_t off = static_cast<off_t>(op.offset);
      // One call per op, as io_uring does: a short result goes back to the engine.
      ssize_t r = op.dir == IoDir::Read ? ::pread(fd, op.buf, op.len, off) : ::pwrite(fd, op.buf, op.len, off);
      int64_t result = r >= 0 ? static_cast<int64_t>(r) : -static_cast<int64_t>(errno);
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back(RawCompletion{op.tag, result});
      }
      done_cv_.notify_one();
    }
  }

  std::vector<int> fds_;
  std::vector<RawOp> queued_;  // the driving thread's
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<RawOp> work_;
  std::deque<RawCompletion> done_;
  bool woken_ = false;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> make_threadpool_backend(unsigned depth) {
  return std::make_unique<ThreadPoolBackend>(depth);
}

}  // namespace strata
