// The cpu backend: "device memory" is host RAM (budgeted by memory/DeviceArena), each
// stream is one worker thread running an in-order queue, and an event is a HostEvent
// that the worker completes when it reaches the record point.
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <numa.h>

#include "host_memory.hpp"
#include "strata/core/clock.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace {

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name) : name_(std::move(name)), worker_([this] { run(); }) {}
  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void copy_async(void* dst, const void* src, size_t bytes) override {
    push([=] { std::memcpy(dst, src, bytes); });
  }
  void host_task(std::function<void()> fn) override { push(std::move(fn)); }
  void fill_as(void* dst, DType t, float value, size_t n) override {
    push([=] {
      if (t == DType::F32) {
        std::fill(static_cast<float*>(dst), static_cast<float*>(dst) + n, value);
        return;
      }
      float block[1024];
      std::fill(block, block + std::min<size_t>(n, 1024), value);
      for (size_t i = 0; i < n; i += 1024)
        convert_from_f32(static_cast<char*>(dst) + i * dtype_size(t), t, block, std::min<size_t>(1024, n - i));
    });
  }
  void accumulate(float* dst, const void* src, DType src_t, size_t n) override {
    push([=] { accumulate_f32(dst, src, src_t, n); });
  }
  void convert(void* dst, DType dst_t, const void* src, DType src_t, size_t n) override {
    push([=] { convert_any(dst, dst_t, src, src_t, n); });
  }
  void sum_squares_as(const void* src, DType t, size_t n, double* out) override {
    push([=] { *out += sum_squares_of(src, t, n); });
  }
  void adam_step(const AdamStepArgs& a) override {
    push([a] { adam_step_host(a); });
  }
  void compute(double, std::function<void()> fn) override { push(std::move(fn)); }
  void wait(const Event& e) override {
    if (e.impl() == nullptr) return;
    push([e] { e.wait(); });
  }
  Event record() override {
    auto [ev, host] = HostEvent::make();
    push(/*is_record=*/true, [this, h = host] {
      // Runs on the worker: hand the pending error (if any) to this event.
      std::exception_ptr err = std::move(pending_error_);
      pending_error_ = nullptr;
      h->complete(err);
    });
    return ev;
  }
  void synchronize() override {
    Event e = record();
    e.wait();
  }
  const std::string& name() const override { return name_; }

 private:
  void push(std::function<void()> fn) { push(false, std::move(fn)); }
  void push(bool is_record, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(fn), is_record});
    }
    cv_.notify_one();
  }
  void run() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      // After a failure, work up to the next record point depends on data that never
      // arrived: skip it; the record point reports the failure.
      if (pending_error_ && !task.is_record) continue;
      try {
        task.fn();
      } catch (...) {
        if (!pending_error_) pending_error_ = std::current_exception();
      }
    }
  }

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Task {
    std::function<void()> fn;
    bool is_record = false;
  };
  std::deque<Task> queue_;
  bool stop_ = false;
  std::exception_ptr pending_error_;  // touched only by the worker
  std::thread worker_;                // last: starts after the members above exist
};

class CpuDevice final : public Device {
 public:
  Backend backend() const override { return Backend::Cpu; }
  bool host_addressable() const override { return true; }
  std::string description() const override { return "cpu (host memory as device memory)"; }
  void* allocate(size_t bytes) override {
    // Page-aligned anonymous memory so large arenas are not carved from the heap.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw OutOfBudget("cpu device: cannot map " + format_bytes(bytes) + " of host memory: " +
                        std::strerror(errno));
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (p) munmap(p, bytes);
  }
  bool register_host(void*, size_t) override { return true; }  // already host memory
  void unregister_host(void*) override {}
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CpuStream>(name);
  }
  int numa_node() const override {
    if (numa_available() < 0) return -1;
    int cpu = sched_getcpu();
    return cpu < 0 ? -1 : numa_node_of_cpu(cpu);
  }
  double now() const override { return steady_seconds(); }
  void* allocate_host(size_t bytes, int node, bool lock, bool* locked) override {
    return detail::map_host_memory(bytes, node, lock, locked);
  }
  void deallocate_host(void* p, size_t bytes) override { detail::unmap_host_memory(p, bytes); }
  void host_compute(double, const std::function<void()>& fn) override { fn(); }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

// Device::create_host_stream on the real backends: a worker thread's in-order queue.
std::unique_ptr<Stream> make_host_worker_stream(const std::string& name) { return std::make_unique<CpuStream>(name); }

}  // namespace strata
