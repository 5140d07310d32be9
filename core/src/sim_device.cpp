// The sim backend (sim.hpp): memory is address space that is never touched, and every
// stream operation is timed by the cost model on the virtual clock instead of run.
//
// A stream op is computed on the submitting thread when it is called: it starts at the
// latest of the stream's free time, the thread's now and the times of the events the
// stream was told to wait for; a copy between host and device also waits for its link
// (one per direction, shared by every stream, as a PCIe link is). record() returns an
// event at the stream's free time.
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>

#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/trace.hpp"

namespace strata {

namespace {

// Addresses handed out when the kernel will not map more address space: above 2^52, where
// no user mapping can be on x86-64 or arm64, so a stray dereference faults.
constexpr uintptr_t kFakeBase = uintptr_t{0xF} << 52;

class SimDevice;

class SimStream final : public Stream {
 public:
  SimStream(SimDevice& dev, std::string name) : dev_(dev), name_(std::move(name)) {}

  void copy_async(void* dst, const void* src, size_t bytes) override;
  void host_task(std::function<void()> fn) override {
    double at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      at = std::max(free_, sim::now());
    }
    double end = at;
    std::exception_ptr err;
    {
      // Engine logic on host scalars: runs now, at the stream's time, at no cost.
      sim::ScopedNow scope(at);
      try {
        fn();
      } catch (...) {
        err = std::current_exception();
      }
      end = sim::now();
    }
    std::lock_guard<std::mutex> lock(mu_);
    free_ = std::max(free_, end);
    if (err && !pending_error_) pending_error_ = err;
  }
  void fill_as(void*, DType t, float, size_t n) override { run(memory_cost(1.0 * dtype_size(t) * n), name_, "fill"); }
  void accumulate(float*, const void*, DType t, size_t n) override {
    run(memory_cost((8.0 + dtype_size(t)) * n), name_, "add");
  }
  void convert(void*, DType dt, const void*, DType st, size_t n) override {
    run(memory_cost(1.0 * (dtype_size(dt) + dtype_size(st)) * n), name_, "convert");
  }
  void sum_squares_as(const void*, DType t, size_t n, double*) override {
    run(memory_cost(1.0 * dtype_size(t) * n), name_, "sum_squares");
  }
  void adam_step(const AdamStepArgs& a) override {
    const double half = a.half_t == DType::F32 ? 0.0 : 1.0 * dtype_size(a.half_t);
    run(memory_cost((24.0 + dtype_size(a.grad_t) + half) * a.n), name_, "adam");
  }
  void compute(double flops, std::function<void()>) override;
  void wait(const Event& e) override {
    if (e.impl() == nullptr) return;
    double t = 0;
    std::exception_ptr err;
    try {
      t = sim::time_of(e);
    } catch (...) {
      err = std::current_exception();
      t = e.impl()->virtual_time() >= 0 ? e.impl()->virtual_time() : 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    free_ = std::max(free_, t);
    if (err && !pending_error_) pending_error_ = err;
  }
  Event record() override {
    std::lock_guard<std::mutex> lock(mu_);
    const double t = std::max(free_, sim::now());
    std::exception_ptr err = std::move(pending_error_);
    pending_error_ = nullptr;
    return sim::event_at(t, err);
  }
  void synchronize() override { record().wait(); }
  const std::string& name() const override { return name_; }

  // Takes `cost` seconds on this stream (and on `link`'s lane when given, whose free time
  // is *link_free, guarded by the device). Returns nothing: the time is in free_.
  void run(double cost, std::string_view lane, const char* what, double* link_free = nullptr);

 private:
  double memory_cost(double bytes) const;

  SimDevice& dev_;
  std::string name_;
  std::mutex mu_;
  double free_ = 0;  // virtual seconds: when the last op queued here ends
  std::exception_ptr pending_error_;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(const SimCostModel& cost) : cost_(cost) {
    check_positive(cost_.device_flops, "device_flops");
    check_positive(cost_.device_bandwidth, "device_bandwidth");
    check_positive(cost_.h2d_bandwidth, "h2d_bandwidth");
    check_positive(cost_.d2h_bandwidth, "d2h_bandwidth");
    check_positive(cost_.nvme_read_bandwidth, "nvme_read_bandwidth");
    check_positive(cost_.nvme_write_bandwidth, "nvme_write_bandwidth");
    check_positive(cost_.collective_bandwidth, "collective_bandwidth");
    check_positive(cost_.host_bandwidth, "host_bandwidth");
    sim::reset_clocks();
  }
  ~SimDevice() override {
    for (auto& [base, r] : regions_)
      if (r.mapped) munmap(reinterpret_cast<void*>(base), r.bytes);
  }

  Backend backend() const override { return Backend::Sim; }
  bool host_addressable() const override { return true; }
  std::string description() const override {
    std::ostringstream os;
    os << "sim (virtual clock; " << cost_.device_flops / 1e12 << " TFLOP/s, pcie " << cost_.h2d_bandwidth / 1e9
       << " GB/s, nvme " << cost_.nvme_read_bandwidth / 1e9 << "/" << cost_.nvme_write_bandwidth / 1e9
       << " GB/s read/write)";
    return os.str();
  }
  void* allocate(size_t bytes) override { return reserve(bytes, true); }
  void deallocate(void* p, size_t) override { release(p); }
  bool register_host(void*, size_t) override { return true; }
  void unregister_host(void*) override {}
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<SimStream>(*this, name);
  }
  std::unique_ptr<Stream> create_host_stream(const std::string& name) override { return create_stream(name); }
  int numa_node() const override { return -1; }
  double now() const override { return sim::now(); }
  void* allocate_host(size_t bytes, int, bool, bool* locked) override {
    *locked = true;  // nothing to lock: no pages are ever touched
    return reserve(bytes, false);
  }
  void deallocate_host(void* p, size_t) override { release(p); }
  void host_compute(double bytes, const std::function<void()>&) override {
    sim::advance_to(sim::now() + bytes / cost_.host_bandwidth);
  }
  const SimCostModel* cost_model() const override { return &cost_; }

  // Whether p lies in device memory handed out by allocate(); anything else is host memory.
  bool is_device(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return false;
    --it;
    return it->second.device && a < it->first + it->second.bytes;
  }
  const SimCostModel& cost() const { return cost_; }
  std::mutex& links_mu() { return links_mu_; }
  double h2d_free = 0, d2h_free = 0;  // virtual seconds, guarded by links_mu()

 private:
  struct Region {
    size_t bytes = 0;
    bool device = false;
    bool mapped = false;  // from mmap (else a fake address)
  };
  static void check_positive(double v, const char* name) {
    if (!(v > 0)) throw ConfigError(std::string("sim cost model: ") + name + " must be positive");
  }
  // Address space that is never touched: PROT_NONE, no swap reserved, so terabytes cost
  // nothing; above what the kernel will map, addresses that can never be valid.
  void* reserve(size_t bytes, bool device) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes = std::max<size_t>(bytes, 1);
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    bool mapped = p != MAP_FAILED;
    if (!mapped) {
      p = reinterpret_cast<void*>(next_fake_);
      next_fake_ += (bytes + 4095) / 4096 * 4096 + 4096;
    }
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{bytes, device, mapped};
    return p;
  }
  void release(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
    STRATA_CHECK(it != regions_.end(), "sim device: free of memory it did not hand out");
    if (it->second.mapped) munmap(p, it->second.bytes);
    regions_.erase(it);
  }

  SimCostModel cost_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Region> regions_;  // base -> region
  uintptr_t next_fake_ = kFakeBase;
  std::mutex links_mu_;
};

double SimStream::memory_cost(double bytes) const { return bytes / dev_.cost().device_bandwidth; }

void SimStream::run(double cost, std::string_view lane, const char* what, double* link_free) {
  double t0, t1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t0 = std::max(free_, sim::now());
    if (link_free) {
      std::lock_guard<std::mutex> links(dev_.links_mu());
      t0 = std::max(t0, *link_free);
      *link_free = t0 + cost;
    }
    t1 = t0 + cost;
    free_ = t1;
  }
  if (trace::Recorder* r = trace::active()) r->record(lane, what, t0, t1);
}

void SimStream::copy_async(void* dst, const void* src, size_t bytes) {
  const SimCostModel& c = dev_.cost();
  const bool from_dev = dev_.is_device(src), to_dev = dev_.is_device(dst);
  const double b = static_cast<double>(bytes);
  if (!from_dev && to_dev) {
    run(c.pcie_latency + b / c.h2d_bandwidth, "copy:h2d", "copy h2d", &dev_.h2d_free);
  } else if (from_dev && !to_dev) {
    run(c.pcie_latency + b / c.d2h_bandwidth, "copy:d2h", "copy d2h", &dev_.d2h_free);
  } else if (from_dev && to_dev) {
    run(2 * b / c.device_bandwidth, "copy:d2d", "copy d2d");  // read and write
  } else {
    run(2 * b / c.host_bandwidth, "copy:h2h", "copy h2h");
  }
}

void SimStream::compute(double flops, std::function<void()>) {
  run(flops / dev_.cost().device_flops, "compute", "compute");
}

}  // namespace

std::unique_ptr<Device> make_sim_device(const SimCostModel& cost) { return std::make_unique<SimDevice>(cost); }

}  // namespace strata
