// Trains the residual MLP under the ZeRO engine with a given stage and offload, so that
// runs at different world sizes and settings can be compared step by step.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "support/residual_mlp.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata::testing_engine {

struct RunSpec {
  int stage = 3;
  OffloadDevice param = OffloadDevice::None;
  OffloadDevice optimizer = OffloadDevice::None;
  int accum = 1;
  float clip = 0.0f;
  bool give_schedule = true;  // else the engine learns the order from the first step
  uint64_t sub_group = 1u << 30;
  DType precision = DType::F32;
  bool speculative = false;  // strata.speculative_optimizer
  bool lane = true;          // EngineAblation::speculation_lane (stage 3): false, on the model's thread
  int poison_step = -1;      // this step's gradient of one group on rank poison_rank becomes NaN
  int poison_rank = 0;
  bool snapshots = false;    // RunResult::states after every step
  uint64_t pinned_budget = 2 << 20;
  uint64_t device_budget = 2 << 20;
  bool optimizer_on_stream = false;  // EngineOptions::optimizer_on_stream: the GPU optimizer's path
  bool keep_grads = true;            // EngineAblation::keep_accumulating_grads_on_device
  bool state_prefetch = true;        // EngineAblation::plain_state_prefetch
  bool params_in_place = true;       // EngineAblation::params_in_place
  bool grads_in_place = true;        // EngineAblation::grads_in_place
  double optimizer_ratio = 1.0;      // offload_optimizer.ratio
  int quantized_block = 0;           // qwZ: EngineOptions::quantized_weights_block (0: off)
  int quantized_gradients_block = 0; // qgZ: EngineOptions::quantized_gradients_block (0: off)
  int ranks_per_node = 0;            // EngineOptions::ranks_per_node (qgZ's hops; 0: the launcher's)
  uint64_t quantized_scratch = 0;    // EngineOptions::quantized_scratch_bytes (0: its default)
  // The GPT's activation checkpoints (gpt_harness.hpp, with checkpointing): unset, the
  // model keeps them; None, the engine holds them on the device; Cpu, cpu_checkpointing
  // (pinned memory, or NVMe where the pinned budget is short); Nvme, cpu_checkpointing
  // with the checkpoints' home on NVMe.
  std::optional<OffloadDevice> checkpoints;
  // The GPT's blocks gathered in parts (gpt_parts): of at most this many elements (0:
  // whole blocks), linears in tile_factor tiles.
  uint64_t part_bucket = 0;
  int tile_factor = 1;
  // The GPT's device budget: the engine's start-up minimum (its device homes and working
  // set, from the layout it builds) and one largest group more, not device_budget.
  bool minimum_device_budget = false;
  std::string label() const {
    return std::string(precision_name(precision)) + ", stage " + std::to_string(stage) + ", params " + to_string(param) + ", optimizer " + to_string(optimizer) +
           ", accum " + std::to_string(accum) + (clip > 0 ? ", clip " + std::to_string(clip) : "") +
           (give_schedule ? "" : ", traced") + (speculative ? ", speculative" : "") +
           (speculative && !lane ? " on the model's thread" : "") +
           (poison_step >= 0 ? ", NaN at step " + std::to_string(poison_step) : "") +
           (optimizer_on_stream ? ", optimizer on the stream" : "") +
           (keep_grads ? "" : ", gradients off the device between micro-steps") +
           (state_prefetch ? "" : ", states read at step()") +
           (params_in_place ? "" : ", gathered on one rank") +
           (grads_in_place ? "" : ", reduce-scattered on one rank") +
           (optimizer_ratio < 1.0 ? ", ratio " + std::to_string(optimizer_ratio) : "") +
           (checkpoints ? std::string(", checkpoints ") +
                              (*checkpoints == OffloadDevice::None ? "on the device" : to_string(*checkpoints))
                        : "") +
           (part_bucket ? ", parts of " + std::to_string(part_bucket) : "") +
           (quantized_block ? ", qwZ blocks of " + std::to_string(quantized_block) : "") +
           (quantized_gradients_block ? ", qgZ blocks of " + std::to_string(quantized_gradients_block) : "") +
           (ranks_per_node ? ", nodes of " + std::to_string(ranks_per_node) : "") +
           (quantized_scratch ? ", quantized in chunks of " + std::to_string(quantized_scratch) + " bytes" : "") +
           (tile_factor > 1 ? ", tile factor " + std::to_string(tile_factor) : "") +
           (minimum_device_budget ? ", the minimum device budget and a group" : "");
  }
};

struct RunResult {
  std::vector<double> losses;                // global mean loss per step
  std::vector<std::vector<float>> weights;   // final full parameters per group
  // With RunSpec::snapshots, after every step: this rank's whole state, the working
  // parameters of every group then each group's master weights and both moments.
  std::vector<std::vector<float>> states;
  std::vector<bool> stepped;
  std::vector<double> norms;  // the gradient norm of every step
  EngineStats stats;          // at the end (the weights' gathers included)
  EngineStats train_stats;    // after the last step, before the weights are gathered (gpt_harness.hpp)
};

// Hands the model the engine's buffers, and fills one group's gradient with NaN on the
// chosen step, after the model wrote it: a non-finite gradient on one rank.
class PoisoningSource final : public WeightSource {
 public:
  PoisoningSource(ZeroEngine& e, bool poison) : e_(e), poison_(poison) {}
  int num_groups() const override { return e_.num_groups(); }
  uint64_t group_numel(int g) const override { return e_.group_numel(g); }
  DType dtype() const override { return e_.dtype(); }
  const void* acquire_params(int g) override { return e_.acquire_params(g); }
  void release_params(int g) override { e_.release_params(g); }
  void* gradient_buffer(int g) override { return buf_[g] = e_.gradient_buffer(g); }
  ActivationStore* activation_store() override { return e_.activation_store(); }
  void grads_ready(int g) override {
    if (poison_ && g == 1) {
      std::vector<float> nan(e_.group_numel(g), std::nanf(""));
      convert_from_f32(buf_[g], e_.dtype(), nan.data(), nan.size());
    }
    e_.grads_ready(g);
  }

 private:
  ZeroEngine& e_;
  bool poison_;
  std::map<int, void*> buf_;
};

constexpr int kLayers = 4, kWidth = 32, kGlobalBatch = 8;

// Inputs and targets of one micro-batch row: a fixed nonlinear map the MLP can learn.
// The job's MPI communicator, made on first use (the tests run under mpirun).
inline coll::Communicator& mpi_world() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  return *comm;
}

inline void make_row(int step, int micro, int row, float* x, float* y) {
  std::mt19937 rng(static_cast<uint32_t>(step * 7919 + micro * 104729 + row * 1299709 + 17));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int j = 0; j < kWidth; ++j) x[j] = u(rng);
  for (int j = 0; j < kWidth; ++j) y[j] = 0.5f * std::sin(2.0f * x[j] + x[(j + 1) % kWidth]);
}

// This rank's whole state: the working parameters of every group, then each group's
// master weights and both moments.
inline std::vector<float> snapshot(ZeroEngine& engine) {
  std::vector<float> all;
  for (int g = 0; g < engine.num_groups(); ++g) {
    const std::vector<float> w = engine.gather_full_params(g);
    all.insert(all.end(), w.begin(), w.end());
  }
  for (int g = 0; g < engine.num_groups(); ++g) {
    const uint64_t n = engine.shard_numel(g);
    std::vector<float> st(3 * n);
    engine.read_optimizer_shard(g, st.data(), st.data() + n, st.data() + 2 * n);
    all.insert(all.end(), st.begin(), st.end());
  }
  return all;
}

// The engine settings the tests' training runs use; group_numel sets the
// look-ahead (three groups).
inline EngineOptions test_engine_options(const RunSpec& spec, uint64_t group_numel, const std::string& nvme_dir,
                                        uint64_t seed = 42) {
  EngineOptions o;
  o.stage = spec.stage;
  o.precision = spec.precision;
  // fp16: a first scale no rank's summed gradient overflows, so runs at every world size
  // skip the same steps (none) and stay comparable.
  o.fp16.initial_scale_power = 8;
  o.param_home = home_tier(spec.param);
  o.optimizer_home = home_tier(spec.optimizer);
  o.optimizer.kind = OptimizerKind::AdamW;
  o.optimizer.lr = 3e-3f;
  o.optimizer.weight_decay = 0.01f;
  o.gradient_clipping = spec.clip;
  o.speculative = spec.speculative;
  o.optimizer_on_stream = spec.optimizer_on_stream;
  o.optimizer_ratio = spec.optimizer_ratio;
  o.quantized_weights_block = spec.quantized_block;
  o.quantized_gradients_block = spec.quantized_gradients_block;
  o.ranks_per_node = spec.ranks_per_node;
  if (spec.quantized_scratch > 0) o.quantized_scratch_bytes = spec.quantized_scratch;
  o.gradient_accumulation_steps = spec.accum;
  o.sub_group_elems = spec.sub_group;
  o.prefetch_bucket_elems = 3 * group_numel;
  o.max_reuse_distance_elems = 0;
  o.optimizer_threads = 1;
  o.seed = seed;
  o.store.device_budget = spec.device_budget;
  o.store.pinned_budget = spec.pinned_budget;
  if (spec.param == OffloadDevice::Nvme || spec.optimizer == OffloadDevice::Nvme ||
      spec.checkpoints == OffloadDevice::Nvme) {
    o.store.nvme.paths = {nvme_dir};
    o.store.nvme.checksums = true;
  }
  return o;
}

// The optimisations a spec turns off (EngineAblation).
inline EngineAblation test_engine_ablation(const RunSpec& spec) {
  EngineAblation a;
  a.speculation_lane = spec.lane;
  a.keep_accumulating_grads_on_device = spec.keep_grads;
  a.plain_state_prefetch = spec.state_prefetch;
  a.params_in_place = spec.params_in_place;
  a.grads_in_place = spec.grads_in_place;
  return a;
}

inline RunResult train(coll::Communicator& comm, coll::Communicator& host, const RunSpec& spec, int steps,
                       const std::string& nvme_dir) {
  auto device = make_device({});
  ResidualMlp model(kLayers, kWidth);
  EngineOptions o = test_engine_options(spec, model.group_numel(), nvme_dir);
  std::vector<GroupSpec> groups;
  for (int b = 0; b < kLayers; ++b)
    groups.push_back({"block." + std::to_string(b), model.group_numel(), InitKind::Normal, 0.1f, {}});
  ZeroEngine engine(*device, comm, host, o, groups, test_engine_ablation(spec));
  if (spec.give_schedule) engine.set_schedule(model.schedule());

  const int world = comm.size(), rank = comm.rank();
  const int local = kGlobalBatch / world;
  std::vector<float> x(static_cast<size_t>(local) * kWidth), y(x.size());
  RunResult r;
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    for (int m = 0; m < spec.accum; ++m) {
      for (int i = 0; i < local; ++i) make_row(step, m, rank * local + i, &x[i * kWidth], &y[i * kWidth]);
      engine.begin_micro_step();
      PoisoningSource source(engine, step == spec.poison_step && rank == spec.poison_rank && m == spec.accum - 1);
      loss += model.forward_backward(source, x.data(), y.data(), local);
    }
    host.all_reduce(std::span<double>(&loss, 1)).wait();
    r.losses.push_back(loss / (world * spec.accum));
    r.stepped.push_back(engine.step());
    r.norms.push_back(engine.stats().last_grad_norm);
    if (spec.snapshots) r.states.push_back(snapshot(engine));
  }
  for (int g = 0; g < kLayers; ++g) r.weights.push_back(engine.gather_full_params(g));
  r.stats = engine.stats();
  return r;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() / ("strata-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace strata::testing_engine
