// The engine's parameters as the model sees them (WeightSource's acquire and release):
// stage 3 gathers each group's shards into a full device buffer, ahead of need by the
// schedule (given, or learned from the first micro-step's acquire order), bounded by the
// prefetch bucket, the live-parameter cap and the device room the resolved layout left;
// stages 1 and 2 hand out the replicated parameters. Owns each group's gathered buffer
// and the schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "engine_state.hpp"

namespace strata::engine {

class Gatherer {
 public:
  explicit Gatherer(EngineCore& core);

  void set_schedule(std::vector<int> order);  // given by the caller
  // The store's eviction order follows the schedule's parameter tensors: call again when
  // they change (a committed speculation swaps shards).
  void readopt_schedule();
  bool has_schedule() const { return !schedule_.empty(); }
  // Before a micro-step's forward: learns the order of the micro-step just finished where
  // none was given, or after a departure from it.
  void begin_micro_step();

  const void* acquire(int g);
  void release(int g);
  bool held(int g) const { return slots_[g].holders > 0; }
  // Stage 3: a group's gathered copy is dropped (its values changed or are about to).
  void drop(int g);
  // After the optimizer step: stage 3 drops every gathered copy (they hold the old values);
  // stages 1 and 2 all-gather the replicated parameters' slices each rank updated.
  void refresh();
  // The full working parameters of group g handed to fn(device pointer) and released
  // after: gathered for the purpose in stage 3 (and dropped again unless kept).
  template <class Fn>
  void with_full(int g, Fn&& fn) {
    const void* p = acquire_for_host(g);
    fn(p);
    release_for_host(g);
  }

 private:
  enum class State { Released, Gathering, Ready };
  struct Slot {
    State state = State::Released;
    Event gathered;
    void* data = nullptr;  // the full buffer while gathering or ready
    int holders = 0;
    double issued = 0;  // device clock, for the trace
    bool kept_for_host = false;  // acquire_for_host found it gathered already
  };
  void adopt_schedule(std::vector<int> order);
  void start_gather(int g, bool ahead);
  void wait_gathered(int g);
  void prefetch_after(size_t pos);
  uint64_t reuse_distance(int g, size_t pos) const;
  const void* acquire_for_host(int g);
  void release_for_host(int g);

  EngineCore& c_;
  std::vector<Slot> slots_;
  std::vector<int> schedule_;    // group order of one micro-step
  std::vector<int> recording_;   // order seen in this micro-step
  bool schedule_given_ = false;
  bool departed_ = false;        // this micro-step left the schedule: on demand only
  size_t pos_ = 0;               // index of the next acquire in schedule_
  uint64_t live_full_bytes_ = 0;        // gathered parameters alive, bytes (persistent ones excluded)
  uint64_t gathering_shard_bytes_ = 0;  // parameter shards on the device for gathers in flight
};

}  // namespace strata::engine
