// The engine's parameters as the model sees them (WeightSource's acquire and release):
// stage 3 gathers each group's shards into a full device buffer, ahead of need by the
// schedule (given, or learned from the first micro-step's acquire order), bounded by the
// prefetch bucket, the live-parameter cap and the device room the resolved layout left;
// stages 1 and 2 hand out the replicated parameters. Stage 3 on one rank with the shards at
// home on the device hands out each shard where it is (ResolvedLayout::params_in_place).
// Owns each group's gathered buffer and the schedule. With hpZ (EngineCore::secondary) a
// group's first gather after its parameters change reads the primary shards over every
// rank and leaves this rank's slice in its secondary partition; later ones read the
// secondaries over the hpZ ranks alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
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
  // `after`: the model's work still reading the parameters (none: done). Its memory is
  // not written again, by a gather or whoever is given it next, before that work is.
  void release(int g, const Event& after);
  bool held(int g) const { return slots_[g].holders > 0; }
  // ResolvedLayout::params_in_place: group g's shard is handed out where it is.
  bool in_place(int g) const { return c_.resolved.params_in_place && c_.groups[g].quantized == 0; }
  // What a holder of the group's parameters is given: the shard read in place, else the
  // gathered (stages 1 and 2: replicated) buffer.
  TensorId handed_out(int g) const { return in_place(g) ? c_.groups[g].param_shard : c_.groups[g].gathered; }
  // Stage 3: a group's gathered copy is dropped (its values changed or are about to).
  void drop(int g);
  // After the optimizer step: stage 3 drops every gathered copy (they hold the old values)
  // and every secondary partition of a trained group; stages 1 and 2 all-gather the
  // replicated parameters' slices each rank updated.
  void refresh();
  // Group g's parameter shard was written outside the step (loaded): its gathered copy and
  // secondary partition are stale.
  void parameters_changed(int g);
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
    // What the gather in flight reads: the parameter shard or (hpZ) the secondary
    // partition, and its elements; whether it fills the secondary when it lands.
    TensorId source = 0;
    uint64_t source_elems = 0;
    bool fills_secondary = false;
    bool quantized = false;  // qwZ: the gather moved int8 blocks through the group's quantized buffer
    uint64_t passing_bytes = 0;  // what the gather in flight holds on the device beside its buffer
    // hpZ: the copy of this rank's slice into the secondary, which reads the buffer.
    Event secondary_copied;
  };
  void invalidate_secondary(int g);
  void gather_quantized(int g, const Acquired& ps, const Acquired& fb);
  // Bytes a gather of g holds on the device beside the buffer until it lands: its source
  // (shard or secondary partition) and, quantized, its quantized buffer.
  uint64_t passing_bytes(int g, bool from_secondary) const;
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
  uint64_t gathering_shard_bytes_ = 0;  // parameter sources on the device for gathers in flight
  // hpZ: the group's secondary partition holds its current parameters.
  std::vector<char> secondary_valid_;
  // qwZ: the largest relative error of a shard quantized so far (the engine's stream writes it).
  std::shared_ptr<std::atomic<double>> worst_quantized_error_ = std::make_shared<std::atomic<double>>(0.0);
};

}  // namespace strata::engine
