#include "strata/collectives/sim_communicator.hpp"

#include <algorithm>
#include <mutex>

#include "strata/core/trace.hpp"

namespace strata::coll {

namespace {

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(int rank, int world, const SimCostModel& cost)
      : Communicator(Shape{rank, world, 0, 1, CommBackend::Sim}), cost_(cost) {}

 protected:
  Event do_all_gather(const void*, void*, size_t count, DataType t, Event after) override {
    return run("all_gather", ring(count * size_of(t) * size()), after);
  }
  Event do_reduce_scatter(const void*, void*, size_t count, DataType t, ReduceOp, Event after) override {
    return run("reduce_scatter", ring(count * size_of(t) * size()), after);
  }
  Event do_all_reduce(const void*, void*, size_t count, DataType t, ReduceOp, Event after) override {
    return run("all_reduce", 2 * ring(count * size_of(t)), after);
  }
  Event do_broadcast(void*, size_t count, DataType t, int, Event after) override {
    return run("broadcast", size() > 1 ? static_cast<double>(count * size_of(t)) : 0.0, after);
  }
  Event do_barrier(Event after) override { return run("barrier", 0.0, after); }
  // Every rank sends size() - 1 parts of `count` elements: what a ring reduce-scatter of
  // the same buffer sends.
  Event do_all_to_all(const void*, void*, size_t count, DataType t, Event after) override {
    return run("all_to_all", ring(count * size_of(t) * size()), after);
  }

 private:
  // Bytes one rank sends on a ring for a collective over `total` bytes.
  double ring(size_t total) const {
    return static_cast<double>(total) * (size() - 1) / size();
  }
  Event run(const char* op, double wire_bytes, const Event& after) {
    double ready = 0;
    std::exception_ptr err;
    try {
      ready = sim::time_of(after);
    } catch (...) {
      err = std::current_exception();  // runs anyway, as on every backend, and fails
      ready = after.impl()->virtual_time() >= 0 ? after.impl()->virtual_time() : 0;
    }
    const double cost =
        size() > 1 ? cost_.collective_latency + wire_bytes / cost_.collective_bandwidth : 0.0;
    double t0, t1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t0 = std::max({free_, sim::now(), ready});
      t1 = t0 + cost;
      free_ = t1;
    }
    if (trace::Recorder* r = trace::active()) r->record("collectives", op, t0, t1);
    return sim::event_at(t1, err);
  }

  SimCostModel cost_;
  std::mutex mu_;
  double free_ = 0;  // virtual seconds: when the last collective ends
};

}  // namespace

std::unique_ptr<Communicator> make_sim_communicator(int rank, int world, const SimCostModel& cost) {
  if (world < 1 || rank < 0 || rank >= world)
    throw ConfigError("sim communicator: rank " + std::to_string(rank) + " of world size " + std::to_string(world) +
                      " is not a rank; use 0 <= rank < world");
  if (!(cost.collective_bandwidth > 0) || cost.collective_latency < 0)
    throw ConfigError("sim cost model: collective_bandwidth must be positive and collective_latency not negative");
  return std::make_unique<SimCommunicator>(rank, world, cost);
}

}  // namespace strata::coll
