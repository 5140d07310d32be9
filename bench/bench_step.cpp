// `strata bench step`: the time of one training step of the GPT (model/gpt.hpp) under the
// ZeRO engine, fully in memory and with parameters and optimizer states on NVMe, in the
// same run. The in-memory step is the reference: the ratio says what offloading costs.
// Steps of the two configurations alternate, so drift of the machine hits both alike.
// On the cuda backend (--backend cuda; run on an H100, docs/training.md) the reference keeps the
// parameters on the GPU and the optimizer in pinned memory (there is no GPU optimizer),
// and the model is GptCuda with NCCL over the one GPU.
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "strata/bench/commands.hpp"
#include "strata/bench/report.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/nccl.hpp"
#include "strata/core/clock.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/train.hpp"
#include "strata/runtime/zero_engine.hpp"

namespace strata::bench {

namespace {

struct StepArgs {
  GptShape shape{12, 768, 12, 256, 50257};  // GPT-2 small's shape, 124M parameters
  int micro_batch = 4;   // 1024-row matmuls: OpenBLAS near its peak
  int accum = 4;         // 4096 tokens per optimizer step
  int reps = 3;
  int warmup = 1;
  bool checkpointing = false;
  std::string dir = ".";
  std::string memory_budget = "6G";      // device budget of the in-memory run
  std::string device_budget = "1G";      // of the offloaded run
  std::string pinned_budget = "1G";      // of the offloaded run
  std::string backend = "cpu";
  std::string trace;  // Chrome trace of the NVMe configuration's engine
  OutputOptions out;
};

struct Setup {
  std::string label;
  std::unique_ptr<ZeroEngine> engine;
  std::vector<double> seconds, exposed, optimizer;
  double exposed_before = 0, opt_wait_before = 0;
};

int run_step(const StepArgs& a) {
  check_output_options(a.out);
  validate(a.shape);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(a.dir, ec))
    throw ConfigError("--dir '" + a.dir + "' is not a directory; give an existing directory on the NVMe drive");
  if (!a.trace.empty() && !std::ofstream(a.trace, std::ios::app))  // before minutes of work, not after
    throw ConfigError("--trace '" + a.trace + "' cannot be written: " + std::strerror(errno) +
                      "; give a file in an existing, writable directory");
  const fs::path swap = fs::path(a.dir) / ("strata-bench-step-" + std::to_string(::getpid()));
  fs::create_directories(swap);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } cleanup{swap};

  const Backend backend = a.backend == "cuda" ? Backend::Cuda : Backend::Cpu;
  const bool cuda = backend == Backend::Cuda;
  auto device = make_device({backend, 0});
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  std::unique_ptr<coll::Communicator> nccl;  // device buffers on cuda are GPU memory
  if (cuda) nccl = coll::make_nccl_communicator(*comm, 0);
  coll::Communicator& dev_comm = nccl ? *nccl : *comm;
  Progress progress("bench step");
  progress.show("measuring the matmul peak");
  const double peak = measure_matmul_peak(backend, 0.5);

  const uint64_t params = gpt_param_count(a.shape);
  auto options = [&](bool offload) {
    EngineOptions o;
    o.stage = 3;
    o.optimizer = {OptimizerKind::AdamW, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    o.gradient_accumulation_steps = a.accum;
    o.persistence_threshold_elems = 0;
    o.prefetch_bucket_elems = 60'000'000;
    o.sub_group_elems = 16'000'000;
    if (offload) {
      o.trace_path = a.trace;
      o.param_home = o.optimizer_home = Tier::Nvme;
      o.store.device_budget = parse_size("--device-budget", a.device_budget);
      o.store.pinned_budget = parse_size("--pinned-budget", a.pinned_budget);
      o.store.nvme.paths = {swap.string()};
    } else if (cuda) {
      // No GPU optimizer: master weights, moments and gradient shards in pinned memory.
      o.optimizer_home = Tier::Pinned;
      o.store.device_budget = parse_size("--memory-budget", a.memory_budget);
      o.store.pinned_budget = params * 16 + (1ull << 30);
    } else {
      o.store.device_budget = parse_size("--memory-budget", a.memory_budget);
      o.store.pinned_budget = 512ull << 20;  // staging for the CPU optimizer's sub-groups
    }
    return o;
  };
  std::vector<Setup> setups(2);
  setups[0].label = cuda ? "params on GPU, optimizer pinned" : "in memory";
  setups[1].label = "params+optimizer on NVMe";
  const auto specs = gpt_group_specs(a.shape);
  for (int i = 0; i < 2; ++i) {
    progress.show("building " + setups[i].label);
    setups[i].engine = std::make_unique<ZeroEngine>(*device, dev_comm, *comm, options(i == 1), specs);
    setups[i].engine->set_schedule(gpt_schedule(a.shape));
  }
  const auto model = make_gpt(
      backend, a.shape, {a.micro_batch, a.checkpointing ? ActivationCheckpointing::PerBlock : ActivationCheckpointing::None});
  const size_t n = static_cast<size_t>(a.micro_batch) * a.shape.seq_len;
  std::vector<int32_t> x(n), y(n);
  std::mt19937 rng(1);
  const uint64_t tokens = static_cast<uint64_t>(n) * a.accum;

  for (int r = 0; r < a.warmup + a.reps; ++r)
    for (Setup& s : setups) {
      progress.show((r < a.warmup ? "warm-up, " : "rep " + std::to_string(r - a.warmup + 1) + "/" +
                                                      std::to_string(a.reps) + ", ") +
                    s.label);
      const EngineStats before = s.engine->stats();
      const double t0 = steady_seconds();
      for (int m = 0; m < a.accum; ++m) {
        for (size_t i = 0; i < n; ++i) x[i] = static_cast<int32_t>(rng() % a.shape.vocab);
        for (size_t i = 0; i < n; ++i) y[i] = static_cast<int32_t>(rng() % a.shape.vocab);
        s.engine->begin_micro_step();
        model->forward_backward(*s.engine, x.data(), y.data());
      }
      s.engine->step();
      const double dt = steady_seconds() - t0;
      const EngineStats after = s.engine->stats();
      if (r < a.warmup) continue;
      s.seconds.push_back(dt);
      s.exposed.push_back(after.exposed_wait_s - before.exposed_wait_s + after.optimizer_wait_s);
      s.optimizer.push_back(after.optimizer_s);
    }
  progress.done();

  Report rep;
  rep.benchmark = "step";
  rep.title = "strata bench step: one training step of a " + std::to_string(params / 1'000'000) +
              "M-parameter GPT, in memory and offloaded to NVMe (ZeRO-3, " + a.backend + " backend on " +
              device->description() + ")";
  rep.config = {{"layers", a.shape.layers},   {"d_model", a.shape.d_model}, {"heads", a.shape.heads},
                {"seq_len", a.shape.seq_len}, {"vocab", a.shape.vocab},     {"parameters", params},
                {"micro_batch", a.micro_batch}, {"gradient_accumulation_steps", a.accum},
                {"tokens_per_step", tokens},  {"reps", a.reps},             {"warmup", a.warmup},
                {"activation_checkpointing", a.checkpointing}, {"dir", a.dir}, {"backend", a.backend},
                {"matmul_peak_gflops", peak / 1e9}};
  rep.table.columns = {{"label", "configuration", ""},       {"step_median_s", "step s", "%.3f"},
                       {"spread", "spread", "%.2f"},          {"tokens_per_s", "tokens/s", "%.0f"},
                       {"mfu", "MFU", "%.3f"},                {"exposed_transfer_s", "exposed s", "%.3f"},
                       {"optimizer_s", "optimizer s", "%.3f"}, {"ratio_to_memory", "x in-memory", "%.3f"}};
  const double flops = gpt_flops_per_token(a.shape) * static_cast<double>(tokens);
  const Summary ref = summarize(setups[0].seconds);
  for (Setup& s : setups) {
    const Summary t = summarize(s.seconds), e = summarize(s.exposed), o = summarize(s.optimizer);
    rep.table.rows.push_back({{"label", s.label},
                              {"step_median_s", t.median},
                              {"step_min_s", t.min},
                              {"step_max_s", t.max},
                              {"spread", t.spread()},
                              {"tokens_per_s", static_cast<double>(tokens) / t.median},
                              {"mfu", flops / t.median / peak},
                              {"exposed_transfer_s", e.median},
                              {"compute_s", t.median - e.median},
                              {"optimizer_s", o.median},
                              {"reference_s", ref.median},
                              {"ratio_to_memory", t.median / ref.median},
                              {"steps", to_json(t, s.seconds)}});
  }
  rep.notes.push_back("MFU: model FLOPs (6 x matmul parameters + causal attention, no recompute) per second over the "
                      "measured " + std::string(cuda ? "cuBLAS sgemm (fp32, no TF32) peak of the GPU" : "OpenBLAS sgemm peak of this machine") + " (" +
                      std::to_string(static_cast<int>(peak / 1e9)) + " GFLOP/s).");
  rep.notes.push_back("exposed: time the model waited for parameters and gradient buffers, plus the optimizer's wait "
                      "for states from their tier; the rest of the step is compute (model and CPU Adam).");
  emit(rep, a.out);
  return 0;
}

}  // namespace

void add_step(CLI::App& bench, Runner& run) {
  static StepArgs a;
  auto* s = bench.add_subcommand("step", "One training step of the GPT, in memory and with params and optimizer states "
                                         "on NVMe (the in-memory step is the reference)");
  s->add_option("--layers", a.shape.layers, "Transformer blocks")->check(CLI::PositiveNumber);
  s->add_option("--d-model", a.shape.d_model, "Model width")->check(CLI::PositiveNumber);
  s->add_option("--heads", a.shape.heads, "Attention heads")->check(CLI::PositiveNumber);
  s->add_option("--seq", a.shape.seq_len, "Sequence length")->check(CLI::PositiveNumber);
  s->add_option("--vocab", a.shape.vocab, "Vocabulary")->check(CLI::Range(2, 1 << 20));
  s->add_option("--micro-batch", a.micro_batch, "Sequences per micro-step")->check(CLI::PositiveNumber);
  s->add_option("--accum", a.accum, "Micro-steps per optimizer step")->check(CLI::PositiveNumber);
  s->add_option("--reps", a.reps, "Timed steps per configuration")->check(CLI::PositiveNumber);
  s->add_option("--warmup", a.warmup, "Untimed steps per configuration first")->check(CLI::NonNegativeNumber);
  s->add_flag("--checkpointing", a.checkpointing, "Recompute each block's activations in backward");
  s->add_option("--dir", a.dir, "Directory on the NVMe drive for the swap files");
  s->add_option("--memory-budget", a.memory_budget, "Device budget of the in-memory configuration");
  s->add_option("--device-budget", a.device_budget, "Device budget of the offloaded configuration");
  s->add_option("--pinned-budget", a.pinned_budget, "Pinned budget of the offloaded configuration");
  s->add_option("--trace", a.trace, "Write a Chrome trace of the NVMe configuration's steps to this file");
  s->add_option("--backend", a.backend, "cpu, or cuda (GptCuda on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_output_options(*s, a.out, "step time of each configuration, split into compute and exposed transfer");
  s->callback([&run] { run = [] { return run_step(a); }; });
}

}  // namespace strata::bench
