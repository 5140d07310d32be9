// The staged backend (staged.hpp): device buffers carried by a host communicator through
// two pinned staging slots, chunk by chunk, on a worker thread in call order.
#include "strata/collectives/staged.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "strata/core/device_wait.hpp"
#include "strata/core/log.hpp"

namespace strata::coll {

namespace {

constexpr size_t kWidestElement = 8;  // bytes: f64, i64

// One operation as the worker runs it. Counts are elements; for all_gather and
// reduce_scatter `total` is per rank and a chunk covers [first, first+n) of every
// rank's part. Each chunk: stage_in copies device -> slot (on the stream), collect runs
// the host collective on the slot, stage_out copies slot -> device (on the stream).
struct StagedOp {
  Event after;
  std::shared_ptr<HostEvent> done;
  size_t total = 0;
  size_t per_chunk = 1;  // elements per chunk, from the slot size
  std::function<void(Stream&, char* slot, size_t first, size_t n)> stage_in;
  std::function<Event(Communicator& host, char* slot, size_t n)> collect;
  std::function<void(Stream&, char* slot, size_t first, size_t n)> stage_out;
  bool barrier = false;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, Device& device, const StagedOptions& opts)
      : Communicator(Shape{host->rank(), host->size(), host->local_rank(), host->local_size(), CommBackend::Staged}),
        host_(std::move(host)),
        device_(device) {
    const size_t min = min_staging_bytes(size());
    if (opts.staging_bytes < min)
      throw CollectiveUsageError("staged communicator: staging of " + std::to_string(opts.staging_bytes) +
                                 " bytes is too small for " + std::to_string(size()) + " ranks; give at least " +
                                 std::to_string(min) + " bytes");
    // Whole elements of every type, so each part within a slot is aligned for its type.
    slot_bytes_ = opts.staging_bytes / 2 / kWidestElement * kWidestElement;
    staging_bytes_ = 2 * slot_bytes_;
    bool locked = false;
    staging_ = static_cast<char*>(device_.allocate_host(staging_bytes_, opts.numa_node, /*lock=*/true, &locked));
    registered_ = device_.register_host(staging_, staging_bytes_);
    if (!registered_)
      log::warn_once("staged-register",
                     "staged communicator: the device refused to register its staging memory; copies will be slower");
    stream_ = device_.create_stream("coll.staged");
    worker_ = std::thread([this] { work(); });
  }

  ~StagedCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();  // runs what was queued first
    stream_->synchronize();
    stream_.reset();
    if (registered_) device_.unregister_host(staging_);
    device_.deallocate_host(staging_, staging_bytes_);
    host_.reset();  // waits for its own operations
  }

 protected:
  Event do_all_gather(const void* send, void* recv, size_t count, DataType t, Event after) override {
    const size_t esz = size_of(t), world = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
    auto* out = static_cast<char*>(recv);
    auto* in = static_cast<const char*>(send);
    StagedOp op;
    op.total = count;
    op.per_chunk = slot_bytes_ / (esz * world);
    // The slot holds world parts of n elements; this rank's part goes to part `me`.
    op.stage_in = [=](Stream& s, char* slot, size_t first, size_t n) {
      s.copy_async(slot + me * n * esz, in + first * esz, n * esz);
    };
    op.collect = [=](Communicator& host, char* slot, size_t n) {
      return host.all_gather(ConstView::elements(slot + me * n * esz, n, t),
                             MutView::elements(slot, n * world, t));
    };
    op.stage_out = [=](Stream& s, char* slot, size_t first, size_t n) {
      for (size_t r = 0; r < world; ++r) s.copy_async(out + (r * count + first) * esz, slot + r * n * esz, n * esz);
    };
    return enqueue(std::move(op), std::move(after));
  }

  Event do_reduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp rop,
                          Event after) override {
    const size_t esz = size_of(t), world = static_cast<size_t>(size());
    auto* out = static_cast<char*>(recv);
    auto* in = static_cast<const char*>(send);
    StagedOp op;
    op.total = count;
    op.per_chunk = slot_bytes_ / (esz * (world + 1));
    // The slot holds world parts of n elements, then the n reduced ones.
    op.stage_in = [=](Stream& s, char* slot, size_t first, size_t n) {
      for (size_t r = 0; r < world; ++r) s.copy_async(slot + r * n * esz, in + (r * count + first) * esz, n * esz);
    };
    op.collect = [=](Communicator& host, char* slot, size_t n) {
      return host.reduce_scatter(ConstView::elements(slot, n * world, t),
                                 MutView::elements(slot + world * n * esz, n, t), rop);
    };
    op.stage_out = [=](Stream& s, char* slot, size_t first, size_t n) {
      s.copy_async(out + first * esz, slot + world * n * esz, n * esz);
    };
    return enqueue(std::move(op), std::move(after));
  }

  Event do_all_reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp rop,
                      Event after) override {
    const size_t esz = size_of(t);
    auto* out = static_cast<char*>(recv);
    auto* in = static_cast<const char*>(send);
    StagedOp op;
    op.total = count;
    op.per_chunk = slot_bytes_ / esz;
    // In place (send == recv) needs nothing special: the slot is between them.
    op.stage_in = [=](Stream& s, char* slot, size_t first, size_t n) {
      s.copy_async(slot, in + first * esz, n * esz);
    };
    op.collect = [=](Communicator& host, char* slot, size_t n) {
      return host.all_reduce(MutView::elements(slot, n, t), rop);
    };
    op.stage_out = [=](Stream& s, char* slot, size_t first, size_t n) {
      s.copy_async(out + first * esz, slot, n * esz);
    };
    return enqueue(std::move(op), std::move(after));
  }

  Event do_broadcast(void* buf, size_t count, DataType t, int root, Event after) override {
    const size_t esz = size_of(t);
    const bool is_root = rank() == root;
    auto* b = static_cast<char*>(buf);
    StagedOp op;
    op.total = count;
    op.per_chunk = slot_bytes_ / esz;
    // Only the root's data goes in, and only the others' comes back.
    op.stage_in = [=](Stream& s, char* slot, size_t first, size_t n) {
      if (is_root) s.copy_async(slot, b + first * esz, n * esz);
    };
    op.collect = [=](Communicator& host, char* slot, size_t n) {
      return host.broadcast(MutView::elements(slot, n, t), root);
    };
    op.stage_out = [=](Stream& s, char* slot, size_t first, size_t n) {
      if (!is_root) s.copy_async(b + first * esz, slot, n * esz);
    };
    return enqueue(std::move(op), std::move(after));
  }

  Event do_all_to_all(const void* send, void* recv, size_t count, DataType t, Event after) override {
    const size_t esz = size_of(t), world = static_cast<size_t>(size());
    auto* out = static_cast<char*>(recv);
    auto* in = static_cast<const char*>(send);
    StagedOp op;
    op.total = count;
    op.per_chunk = slot_bytes_ / (esz * 2 * world);
    // The slot holds the world parts to send, then the world parts received.
    op.stage_in = [=](Stream& s, char* slot, size_t first, size_t n) {
      for (size_t r = 0; r < world; ++r) s.copy_async(slot + r * n * esz, in + (r * count + first) * esz, n * esz);
    };
    op.collect = [=](Communicator& host, char* slot, size_t n) {
      return host.all_to_all(ConstView::elements(slot, n * world, t),
                             MutView::elements(slot + world * n * esz, n * world, t));
    };
    op.stage_out = [=](Stream& s, char* slot, size_t first, size_t n) {
      for (size_t r = 0; r < world; ++r)
        s.copy_async(out + (r * count + first) * esz, slot + (world + r) * n * esz, n * esz);
    };
    return enqueue(std::move(op), std::move(after));
  }

  Event do_barrier(Event after) override {
    StagedOp op;
    op.barrier = true;
    return enqueue(std::move(op), std::move(after));
  }

 private:
  // The event completes once this op's copies back into device memory are done, GPU work
  // this worker issues later: a CUDA stream ordered after it waits on the host
  // (HostEvent::DeviceWait::Host), never holding a GPU queue the copies may share.
  Event enqueue(StagedOp op, Event after) {
    auto [ev, done] = HostEvent::make(HostEvent::DeviceWait::Host);
    op.after = std::move(after);
    op.done = std::move(done);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
    return ev;
  }

  void work() {
    for (;;) {
      StagedOp op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      op.done->complete(run(op));
    }
  }

  // Runs every step of op even after a failure, so that this rank still takes part in
  // each of its host collectives; returns the first error. Device work (`after`'s, the
  // copies') is waited for with wait_device_work: on a driver without stream memory
  // operations, a stream of the engine may be holding CUDA's callback thread until this
  // very operation completes (device_wait.hpp).
  std::exception_ptr run(StagedOp& op) {
    std::exception_ptr err;
    auto keep = [&err](auto&& step) {
      try {
        step();
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    };
    keep([&] { wait_device_work(op.after); });
    if (op.barrier) {
      keep([&] { host_->barrier().wait(); });
      return err;
    }
    const size_t chunks = (op.total + op.per_chunk - 1) / op.per_chunk;
    auto span_of = [&](size_t i) {
      const size_t first = i * op.per_chunk;
      return std::pair{first, std::min(op.per_chunk, op.total - first)};
    };
    auto slot = [&](size_t i) { return staging_ + (i % 2) * slot_bytes_; };
    // Chunk i+1 is copied into the other slot while chunk i's collective runs. Its
    // slot's last use, chunk i-1's copy out, is earlier on the same stream.
    Event staged_in;
    if (chunks > 0)
      keep([&] {
        auto [first, n] = span_of(0);
        op.stage_in(*stream_, slot(0), first, n);
        staged_in = stream_->record();
      });
    for (size_t i = 0; i < chunks; ++i) {
      auto [first, n] = span_of(i);
      keep([&] { wait_device_work(staged_in); });
      Event collected;
      keep([&] { collected = op.collect(*host_, slot(i), n); });
      staged_in = Event();
      if (i + 1 < chunks)
        keep([&] {
          auto [next_first, next_n] = span_of(i + 1);
          op.stage_in(*stream_, slot(i + 1), next_first, next_n);
          staged_in = stream_->record();
        });
      keep([&] { collected.wait(); });
      keep([&] { op.stage_out(*stream_, slot(i), first, n); });
    }
    keep([&] { wait_device_work(stream_->record()); });
    return err;
  }

  std::unique_ptr<Communicator> host_;
  Device& device_;
  char* staging_ = nullptr;  // [2 * slot_bytes_] pinned host bytes: slot 0, then slot 1
  size_t slot_bytes_ = 0;
  size_t staging_bytes_ = 0;
  bool registered_ = false;
  std::unique_ptr<Stream> stream_;  // the copies in and out, in order

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StagedOp> queue_;  // called, not yet started; in call order
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace

size_t min_staging_bytes(int world_size) {
  const size_t world = static_cast<size_t>(std::max(world_size, 1));
  return 2 * kWidestElement * std::max(world + 1, 2 * world);
}

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host, Device& device,
                                                       const StagedOptions& opts) {
  if (!host) throw CollectiveUsageError("make_staged_communicator: no host communicator given");
  return std::make_unique<StagedCommunicator>(std::move(host), device, opts);
}

}  // namespace strata::coll
