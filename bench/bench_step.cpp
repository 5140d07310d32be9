// `strata bench step`: the time of one training step of the GPT (model/gpt.hpp) under the
// ZeRO engine, fully in memory and with parameters and optimizer states on NVMe, in the
// same run. The in-memory step is the reference: the ratio says what offloading costs.
// With --precision bf16 (or fp16) every configuration also runs in fp32, so the table
// shows what 16 bits buy: tokens/s, MFU against the measured matmul peak of each precision
// (sgemm for fp32, the 16-bit matmul library's for bf16/fp16) and the NVMe bytes a step
// moves; and on the cpu backend PyTorch's step of the same model under
// torch.autocast("cpu", dtype=...) runs beside them (bench/ref/torch_gpt_step.py, in a
// process that stays up for the run). Steps of all configurations alternate, so drift of
// the machine hits them alike.
// On the cuda backend (--backend cuda; run on an H100 and an H200, docs/training.md) the
// reference keeps the parameters on the GPU and the optimizer in pinned memory (CPU Adam;
// --gpu-optimizer adds the states on the GPU, stepped there), the model is GptCuda with
// NCCL over the one GPU, and PyTorch's step runs beside it wholly on the GPU (fused AdamW),
// in fp32 and in the 16-bit precision asked for.
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/bench/cli_checks.hpp"
#include "strata/bench/commands.hpp"
#include "strata/bench/reference_process.hpp"
#include "strata/bench/report.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/nccl.hpp"
#include "strata/core/clock.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/core/trace.hpp"
#include "strata/model/cpu_sgemm.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/train/train.hpp"
#include "strata/runtime/engine/zero_engine.hpp"
#include "strata/runtime/train/step_driver.hpp"

#ifndef STRATA_TORCH_GPT_STEP_SCRIPT
#define STRATA_TORCH_GPT_STEP_SCRIPT "bench/ref/torch_gpt_step.py"
#endif

namespace strata::bench {

namespace {

struct StepArgs {
  GptShape shape{12, 768, 12, 256, 50257};  // GPT-2 small's shape, 124M parameters
  int micro_batch = 4;   // 1024-row matmuls: sgemm near its peak
  int accum = 4;         // 4096 tokens per optimizer step
  int reps = 3;
  int warmup = 1;
  int lead_in = 1;       // untimed steps of a configuration right before each of its timed ones
  bool checkpointing = false;
  bool cpu_checkpointing = false;  // each engine configuration also with the checkpoints in pinned memory
  std::string dir = ".";
  std::string memory_budget = "6G";      // device budget of the in-memory run
  std::string device_budget = "1G";      // of the offloaded run
  std::string pinned_budget = "1G";      // of the offloaded run
  std::string backend = "cpu";
  std::string precision = "f32";  // 16 bits: beside fp32, and beside PyTorch autocast
  bool f32_beside = true;         // with 16 bits: the fp32 configurations too
  bool nvme = true;               // the NVMe configuration too
  bool checksums = false;         // xxHash of every NVMe extent, verified on read (strata.checksums)
  bool speculative = false;       // each engine configuration also with the speculative optimizer
  bool speculation_inline = false;  // its updates on the model's thread, not the optimizer lane
  bool gpu_optimizer = false;     // cuda: also parameters and optimizer states on the GPU (the GPU optimizer)
  unsigned optimizer_threads = 0;  // CPU Adam's threads (EngineOptions::optimizer_threads); 0: every core
  double ratio = 0.5;             // with gpu_optimizer: also offload_optimizer.ratio this (CPU share), concurrently
  bool torch = true;              // the PyTorch reference (cpu backend, 16 bits)
  bool layout = false;            // print each configuration's resolved layout; time nothing
  std::string python = "/usr/bin/python3";
  std::string torch_script = STRATA_TORCH_GPT_STEP_SCRIPT;
  std::string trace;  // Chrome trace of one configuration's engine (see the options lambda)
  OutputOptions out;
};

struct Setup {
  std::string label;
  DType precision = DType::F32;
  bool nvme = false;
  bool speculative = false;            // strata.speculative_optimizer
  bool gpu_optimizer = false;          // states on the GPU, stepped there (offload_optimizer none)
  double ratio = 1.0;                  // offload_optimizer.ratio: below 1, that share on the CPU, the rest on the GPU
  bool cpu_checkpointing = false;      // activation_checkpointing.cpu_checkpointing
  bool torch = false;                  // the PyTorch reference: no engine, it times its own step
  bool traced = false;                 // its engine writes --trace
  std::unique_ptr<ZeroEngine> engine;
  GptModel* model = nullptr;
  std::vector<double> seconds, exposed, optimizer, nvme_read, nvme_written, cpu;
};

uint64_t nvme_bytes(const StoreStats& st, bool read) {
  uint64_t b = 0;
  for (int t = 0; t < kTierCount; ++t)
    b += read ? st.bytes_moved[static_cast<int>(Tier::Nvme)][t] : st.bytes_moved[t][static_cast<int>(Tier::Nvme)];
  return b;
}

// What a run of bench step holds beside the arguments: the machine, the precisions and
// their peaks, the configurations. Members are destroyed in the reverse of this order: the
// models after the engines that drive them, the device after everything on it.
struct Bench {
  explicit Bench(const StepArgs& args) : a(args) {}
  const StepArgs& a;
  std::filesystem::path swap;  // the NVMe configurations' swap files
  Backend backend = Backend::Cpu;
  bool cuda = false;
  DType precision = DType::F32;  // --precision
  bool sixteen = false;          // 16 bits asked for
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> comm;
  std::unique_ptr<coll::Communicator> nccl;  // device buffers on cuda are GPU memory
  Progress progress{"bench step"};
  std::unique_ptr<ReferenceProcess> torch;
  unsigned threads = 1;
  std::vector<DType> precisions;  // fp32, and the 16-bit precision beside it when asked for
  std::vector<double> peaks;      // matmul peak of each precision, FLOP/s
  uint64_t params = 0;
  std::vector<GroupSpec> specs;
  std::vector<GroupSize> sizes;
  std::string memory_label;
  std::vector<Setup> setups;
  std::vector<std::unique_ptr<GptModel>> models;  // one per precision
  trace::Recorder* recorder = nullptr;            // the traced engine's
  uint64_t tokens = 0;                            // per optimizer step

  coll::Communicator& dev_comm() { return nccl ? *nccl : *comm; }
  double peak_of(DType p) const { return peaks[p == precisions.front() ? 0 : 1]; }
  // The setup a row is compared with: same configuration in memory (offload cost), and
  // the same configuration in fp32 (what the precision buys).
  const Setup* find(bool nvme, DType p, bool speculative = false, bool gpu_optimizer = false, double ratio = 1.0,
                    bool cpu_ckpt = false) const {
    for (const Setup& s : setups)
      if (s.engine && s.nvme == nvme && s.precision == p && s.speculative == speculative &&
          s.gpu_optimizer == gpu_optimizer && s.ratio == ratio && s.cpu_checkpointing == cpu_ckpt)
        return &s;
    return nullptr;
  }
};

// The arguments, before minutes of work.
void check_args(const StepArgs& a) {
  check_output_options(a.out, {{a.python, "--python"}, {a.torch_script, "--torch-script"}}, {{a.trace, "--trace"}});
  validate(a.shape);
  std::error_code ec;
  if (!std::filesystem::is_directory(a.dir, ec))
    throw ConfigError("--dir '" + a.dir + "' is not a directory; give an existing directory on the NVMe drive");
  if (!a.trace.empty()) {
    check_output_path(a.trace, "--trace");
    check_output_writable(a.trace, "--trace");
  }
  const bool sixteen = parse_precision(a.precision) != DType::F32;
  if (a.cpu_checkpointing && !a.checkpointing)
    throw ConfigError("bench step: --cpu-checkpointing moves the checkpoints of --checkpointing: give both");
  if (a.speculation_inline && !a.speculative)
    throw ConfigError("bench step: --speculation-inline says where the speculative optimizer steps: give --speculative too");
  if (a.gpu_optimizer && a.backend != "cuda")
    throw ConfigError("bench step: --gpu-optimizer needs --backend cuda (the cpu backend's optimizer is CpuAdam)");
  if (!a.f32_beside && !sixteen)
    throw ConfigError("bench step: --no-f32 leaves out the fp32 configurations beside the 16-bit ones: give --precision "
                      "bf16 or fp16 too");
}

// The device and communicators, the PyTorch reference, and the matmul peak of each precision.
void open_machine(Bench& b) {
  const StepArgs& a = b.a;
  b.backend = a.backend == "cuda" ? Backend::Cuda : Backend::Cpu;
  b.cuda = b.backend == Backend::Cuda;
  b.precision = parse_precision(a.precision);
  b.sixteen = b.precision != DType::F32;
  b.device = make_device({b.backend, 0});
  b.comm = coll::make_host_communicator(coll::HostBackend::Self);
  if (b.cuda) b.nccl = coll::make_nccl_communicator(*b.comm, 0);

  // The PyTorch reference: on the cpu backend in the 16-bit precision asked for; on cuda
  // in that precision too, fp32 included (the whole step on the GPU).
  b.threads = std::max(1u, std::thread::hardware_concurrency());
  if (a.torch && !a.layout && (b.sixteen || b.cuda)) {
    b.progress.show("starting the PyTorch reference");
    b.torch = std::make_unique<ReferenceProcess>(
        std::vector<std::string>{a.python, a.torch_script, "--layers", std::to_string(a.shape.layers),
                                 "--d-model", std::to_string(a.shape.d_model), "--heads", std::to_string(a.shape.heads),
                                 "--seq", std::to_string(a.shape.seq_len), "--vocab", std::to_string(a.shape.vocab),
                                 "--micro-batch", std::to_string(a.micro_batch), "--accum", std::to_string(a.accum),
                                 "--threads", std::to_string(b.threads), "--precision", precision_name(b.precision),
                                 "--device", b.cuda ? "cuda" : "cpu"},
        "bench step: the PyTorch reference",
        "it needs a Python with torch: --python names another Python; --no-torch measures without it");
  }

  // fp32, and the 16-bit precision beside it when asked for (alone with --no-f32).
  if (!b.sixteen || a.f32_beside) b.precisions.push_back(DType::F32);
  if (b.sixteen) b.precisions.push_back(b.precision);
  for (DType p : b.precisions) {
    if (a.layout) break;  // nothing is timed
    b.progress.show(std::string("measuring the ") + precision_name(p) + " matmul peak");
    b.peaks.push_back(measure_matmul_peak(b.backend, p, 0.5));
  }
}

// The engine's options of one configuration: budgets and tiers.
EngineOptions engine_options(const Bench& b, bool offload, DType p, bool speculative, bool gpu_optimizer, double ratio,
                             bool cpu_ckpt) {
  const StepArgs& a = b.a;
  const std::vector<DType>& precisions = b.precisions;
  const std::vector<GroupSize>& sizes = b.sizes;
  const std::filesystem::path& swap = b.swap;
  const uint64_t params = b.params;
  const bool cuda = b.cuda;
  EngineOptions o;
  if (a.checkpointing) {  // the engine holds the checkpoints, as strata train has it
    o.checkpoints = {a.shape.layers + 1,
                     static_cast<uint64_t>(a.micro_batch) * a.shape.seq_len * a.shape.d_model * sizeof(float)};
    o.cpu_checkpointing = cpu_ckpt;
  }
  // One configuration writes the trace: the NVMe one (the in-memory one with CPU Adam
  // under --no-nvme) of the last precision, speculative where asked.
  const bool traced = p == precisions.back() && speculative == a.speculative && !cpu_ckpt &&
                      (a.nvme ? offload : !gpu_optimizer && ratio >= 1);
  o.trace_path = traced ? a.trace : "";
  o.stage = 3;
  o.first_gradient_held = a.shape.tied();  // the tied head's gradient, held through backward, as in strata train
  o.optimizer_threads = a.optimizer_threads;
  o.speculative = speculative;
  o.precision = p;
  o.optimizer = {OptimizerKind::AdamW, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  o.gradient_accumulation_steps = a.accum;
  o.persistence_threshold_elems = 0;
  o.prefetch_bucket_elems = 60'000'000;
  o.sub_group_elems = 16'000'000;
  if (offload) {
    o.param_home = o.optimizer_home = Tier::Nvme;
    o.store.device_budget = parse_byte_count(a.device_budget, "--device-budget");
    o.store.pinned_budget = parse_byte_count(a.pinned_budget, "--pinned-budget");
    o.store.nvme.paths = {swap.string()};
    o.store.nvme.checksums = a.checksums;
  } else if (gpu_optimizer || ratio < 1) {
    // Everything on the GPU, or the 1 - ratio share of the states (the rest pinned, CPU
    // Adam's): the budgets are what the engine's layout needs on each tier (every
    // sub-group with its speculative Next set where asked), with room to prefetch.
    o.optimizer_home = gpu_optimizer ? Tier::Device : Tier::Pinned;
    o.optimizer_ratio = gpu_optimizer ? 1.0 : ratio;
    o.optimizer_on_stream = true;  // as the engine sets it on cuda
    // What the resolved layout needs with room to spare on both tiers (every sub-group
    // then has its Next set where speculation is asked for).
    EngineOptions roomy = o;
    roomy.store.device_budget = roomy.store.pinned_budget = uint64_t{1} << 60;
    const ShardLayout L = try_resolve(roomy, {}, sizes, 1, device_traits(*b.device)).layout;
    o.store.device_budget = std::max<uint64_t>(parse_byte_count(a.memory_budget, "--memory-budget"),
                                     L.need[static_cast<int>(Tier::Device)].homes() + L.device_working + (2ull << 30));
    o.store.pinned_budget = L.need[static_cast<int>(Tier::Pinned)].homes() + L.pinned_staging + (1ull << 30);
  } else if (cuda) {
    // The CPU optimizer: master weights, moments and gradient shards in pinned memory.
    o.optimizer_home = Tier::Pinned;
    o.store.device_budget = parse_byte_count(a.memory_budget, "--memory-budget");
    o.store.pinned_budget = params * (speculative ? 28 : 16) + (1ull << 30);  // + the Next sets
  } else {
    o.store.device_budget = parse_byte_count(a.memory_budget, "--memory-budget");
    o.store.pinned_budget = 512ull << 20;  // staging for the CPU optimizer's sub-groups
  }
  return o;
}

// Every configuration, in the order they run and are reported.
std::vector<Setup> make_setups(const Bench& bench) {
  const StepArgs& a = bench.a;
  const std::vector<DType>& precisions = bench.precisions;
  const std::string& memory_label = bench.memory_label;
  const bool sixteen = bench.sixteen, cuda = bench.cuda;
  const DType precision = bench.precision;
  std::vector<Setup> setups;
  for (int offload = 0; offload < (a.nvme ? 2 : 1); ++offload)
    for (DType p : precisions) {
      for (int spec = 0; spec < (a.speculative ? 2 : 1); ++spec)
        for (int cc = 0; cc < (a.cpu_checkpointing ? 2 : 1); ++cc) {
          Setup s;
          s.label = (offload ? "params+optimizer on NVMe" : memory_label) +
                    (sixteen ? std::string(", ") + precision_name(p) : "") + (spec ? ", speculative" : "") +
                    (cc ? ", checkpoints pinned" : "");
          s.precision = p;
          s.nvme = offload == 1;
          s.speculative = spec == 1;
          s.cpu_checkpointing = cc == 1;
          setups.push_back(std::move(s));
        }
      if (a.gpu_optimizer && !offload) {
        // offload_optimizer.ratio 0 (all states on the GPU, the GPU optimizer) and the
        // split (CPU Adam over the ratio's share, concurrently), the latter speculative too.
        Setup s;
        s.label = std::string("params and optimizer on GPU") + (sixteen ? std::string(", ") + precision_name(p) : "");
        s.precision = p;
        s.gpu_optimizer = true;
        setups.push_back(std::move(s));
        for (int spec = 0; spec < (a.speculative ? 2 : 1); ++spec) {
          Setup r;
          char b[96];
          std::snprintf(b, sizeof b, "optimizer %.2g CPU / %.2g GPU", a.ratio, 1 - a.ratio);
          r.label = b + (sixteen ? std::string(", ") + precision_name(p) : "") + (spec ? ", speculative" : "");
          r.precision = p;
          r.ratio = a.ratio;
          r.speculative = spec == 1;
          setups.push_back(std::move(r));
        }
      }
    }
  if (bench.torch) {
    Setup s;
    s.label = std::string(cuda ? "PyTorch on the GPU, " : "PyTorch, ") +
              (sixteen ? std::string("autocast ") + precision_name(precision) : std::string("fp32"));
    s.precision = precision;
    s.torch = true;
    setups.push_back(std::move(s));
  }
  return setups;
}

EngineAblation ablation_of(const StepArgs& a) {
  EngineAblation ablation;
  ablation.speculation_lane = !a.speculation_inline;
  return ablation;
}

// --layout: each configuration's resolved layout (resolve.hpp), the decisions its engine
// would run by, in the form strata plan prints them; nothing is built or timed.
void print_layouts(const Bench& b) {
  for (const Setup& s : b.setups) {
    if (s.torch) continue;
    const EngineOptions o = engine_options(b, s.nvme, s.precision, s.speculative, s.gpu_optimizer, s.ratio, s.cpu_checkpointing);
    const ResolvedLayout r = resolve(o, ablation_of(b.a), b.sizes, 1, device_traits(*b.device));
    std::printf("configuration: %s\n%s\n", s.label.c_str(), r.describe().c_str());
  }
}

// A model per precision, and each configuration's engine.
void build_engines(Bench& b) {
  const StepArgs& a = b.a;
  for (DType p : b.precisions)
    b.models.push_back(make_gpt(b.backend, a.shape,
                                {a.micro_batch, a.checkpointing ? ActivationCheckpointing::PerBlock : ActivationCheckpointing::None, p,
                                 a.checkpointing}));
  // The traced engine's recorder is the process's active one from its construction on;
  // the other configurations' steps, run in between, are kept out of it.
  for (Setup& s : b.setups) {
    if (s.torch) continue;
    b.progress.show("building " + s.label);
    const EngineOptions o = engine_options(b, s.nvme, s.precision, s.speculative, s.gpu_optimizer, s.ratio, s.cpu_checkpointing);
    s.traced = !o.trace_path.empty();
    s.engine = std::make_unique<ZeroEngine>(*b.device, b.dev_comm(), *b.comm, o, b.specs, ablation_of(a));
    if (s.traced) b.recorder = trace::active();
    s.engine->set_schedule(gpt_schedule(a.shape));
    s.model = b.models[s.precision == b.precisions.front() ? 0 : 1].get();
  }
}

// One configuration's timed step (after its lead-in), or the PyTorch reference's.
void time_one(Bench& b, Setup& s, bool warmup, const std::string& what, TokenBatches& batches) {
  const StepArgs& a = b.a;
  if (s.torch) {
    const nlohmann::json got = b.torch->command("step");
    if (!got.contains("seconds")) throw Unavailable("bench step: the PyTorch reference failed: " + got.dump());
    if (!warmup) s.seconds.push_back(got["seconds"].get<double>());
    return;
  }
  trace::set_active(s.traced ? b.recorder : nullptr);
  if (!warmup)
    for (int k = 0; k < a.lead_in; ++k) {
      b.progress.show(what + " (lead-in " + std::to_string(k + 1) + "/" + std::to_string(a.lead_in) + ")");
      run_step(*s.engine, *s.model, *s.engine, batches);
    }
  const double cpu0 = process_cpu_seconds();
  const StepResult r = run_step(*s.engine, *s.model, *s.engine, batches);
  const double cpu = process_cpu_seconds() - cpu0;
  if (warmup) return;
  s.seconds.push_back(r.seconds);
  s.cpu.push_back(cpu);
  s.exposed.push_back(r.exposed_s());
  s.optimizer.push_back(r.after.optimizer_s);
  s.nvme_read.push_back(static_cast<double>(nvme_bytes(r.after.store, true) - nvme_bytes(r.before.store, true)));
  s.nvme_written.push_back(static_cast<double>(nvme_bytes(r.after.store, false) - nvme_bytes(r.before.store, false)));
}

// The configurations alternate, rep by rep, so a drift of the machine falls on all alike.
// Each timed step follows --lead-in untimed steps of its own configuration, so it starts
// as a step in training does: its predecessor's write-backs still landing, its tiers as a
// step of its own left them. Its own write-backs then land in the next configuration's
// untimed steps, not in that one's timed step.
void time_setups(Bench& b) {
  const StepArgs& a = b.a;
  std::mt19937 rng(1);
  // Random tokens, the same sequence for every configuration in turn.
  TokenBatches batches(*b.models.front(), a.accum, [&](int, int32_t* x, int32_t* y) {
    const size_t n = static_cast<size_t>(a.micro_batch) * a.shape.seq_len;
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<int32_t>(rng() % a.shape.vocab);
    for (size_t i = 0; i < n; ++i) y[i] = static_cast<int32_t>(rng() % a.shape.vocab);
  });
  b.tokens = static_cast<uint64_t>(batches.inputs.size()) * a.accum;
  for (int r = 0; r < a.warmup + a.reps; ++r)
    for (Setup& s : b.setups) {
      const std::string what = (r < a.warmup ? "warm-up, " : "rep " + std::to_string(r - a.warmup + 1) + "/" +
                                                                 std::to_string(a.reps) + ", ") +
                               s.label;
      b.progress.show(what);
      time_one(b, s, r < a.warmup, what, batches);
    }
  trace::set_active(b.recorder);  // as the traced engine left it: it hands the outer one back when it goes
  b.progress.done();
}

// The title, the run's configuration and the table's columns.
Report report_head(const Bench& b) {
  const StepArgs& a = b.a;
  const uint64_t params = b.params, tokens = b.tokens;
  const bool sixteen = b.sixteen;
  const DType precision = b.precision;
  const auto& device = b.device;
  const unsigned threads = b.threads;
  auto peak_of = [&b](DType p) { return b.peak_of(p); };
  Report rep;
  rep.benchmark = "step";
  rep.title = "strata bench step: one training step of a " + std::to_string(params / 1'000'000) + "M-parameter GPT, " +
              (sixteen ? std::string(precision_name(precision)) + (a.f32_beside ? " beside fp32, " : ", ") : std::string()) +
              "in memory" +
              (a.nvme ? " and offloaded to NVMe" : "") + " (ZeRO-3, " + a.backend + " backend on " +
              device->description() + ")";
  rep.config = {{"layers", a.shape.layers},   {"d_model", a.shape.d_model}, {"heads", a.shape.heads},
                {"seq_len", a.shape.seq_len}, {"vocab", a.shape.vocab},     {"parameters", params},
                {"micro_batch", a.micro_batch}, {"gradient_accumulation_steps", a.accum},
                {"tokens_per_step", tokens},  {"reps", a.reps},             {"warmup", a.warmup}, {"lead_in", a.lead_in},
                {"activation_checkpointing", a.checkpointing}, {"cpu_checkpointing", a.cpu_checkpointing},
                {"dir", a.dir}, {"backend", a.backend},
                {"precision", precision_name(precision)}, {"nvme", a.nvme}, {"threads", threads},
                {"speculative", a.speculative},
                {"speculation_inline", a.speculation_inline}, {"optimizer_threads", a.optimizer_threads},
                {"fp32_beside", !sixteen || a.f32_beside}};
  if (!sixteen || a.f32_beside) rep.config["matmul_peak_gflops"] = peak_of(DType::F32) / 1e9;
  if (sixteen) rep.config[std::string("matmul_peak_gflops_") + precision_name(precision)] = peak_of(precision) / 1e9;
  rep.table.columns = {{"label", "configuration", ""},       {"step_median_s", "step s", "%.3f"},
                       {"spread", "spread", "%.2f"},          {"tokens_per_s", "tokens/s", "%.0f"},
                       {"mfu", "MFU", "%.3f"},                {"exposed_transfer_s", "exposed s", "%.3f"},
                       {"optimizer_s", "optimizer s", "%.3f"},  {"cpu_s", "CPU s", "%.2f"}};
  if (a.nvme) {
    rep.table.columns.push_back({"nvme_read_mib", "NVMe read MiB", "%.0f"});
    rep.table.columns.push_back({"nvme_written_mib", "NVMe written MiB", "%.0f"});
    rep.table.columns.push_back({"ratio_to_memory", "x in-memory", "%.3f"});
  }
  if (sixteen && a.f32_beside) rep.table.columns.push_back({"speedup_over_f32", "tokens/s x f32", "%.2f"});
  return rep;
}

// A row per configuration.
void report_rows(const Bench& b, Report& rep) {
  const bool sixteen = b.sixteen;
  const double flops = gpt_flops_per_token(b.a.shape) * static_cast<double>(b.tokens);
  const uint64_t tokens = b.tokens;
  const std::vector<Setup>& setups = b.setups;
  auto find = [&b](auto... args) { return b.find(args...); };
  auto peak_of = [&b](DType p) { return b.peak_of(p); };
  for (const Setup& s : setups) {
    const Summary t = summarize(s.seconds);
    nlohmann::json row = {{"label", s.label},
                          {"precision", precision_name(s.precision)},
                          {"step_median_s", t.median},
                          {"step_min_s", t.min},
                          {"step_max_s", t.max},
                          {"spread", t.spread()},
                          {"tokens_per_s", static_cast<double>(tokens) / t.median},
                          {"mfu", flops / t.median / peak_of(s.precision)},
                          {"steps", to_json(t, s.seconds)}};
    const Setup* f32 = s.engine ? find(s.nvme, DType::F32, s.speculative, s.gpu_optimizer, s.ratio, s.cpu_checkpointing) : find(false, DType::F32);
    if (sixteen && f32) row["speedup_over_f32"] = summarize(f32->seconds).median / t.median;
    if (s.engine) row["steps_run"] = s.engine->iterations();  // warm-up, lead-in and timed steps, by the engine's count
    if (s.engine) {
      const Summary e = summarize(s.exposed), o = summarize(s.optimizer);
      const double ref = summarize(find(false, s.precision)->seconds).median;
      row["exposed_transfer_s"] = e.median;
      row["compute_s"] = t.median - e.median;
      row["optimizer_s"] = o.median;
      row["cpu_s"] = summarize(s.cpu).median;
      row["reference_s"] = ref;
      row["ratio_to_memory"] = t.median / ref;
      row["nvme_read_mib"] = summarize(s.nvme_read).median / (1 << 20);
      row["nvme_written_mib"] = summarize(s.nvme_written).median / (1 << 20);
    } else {
      row["compute_s"] = t.median;  // the plot's bar; nothing of it is transfer
      row["exposed_transfer_s"] = 0.0;
    }
    rep.table.rows.push_back(std::move(row));
  }
}

// What MFU, exposed and CPU s are measured against.
void report_measures(const Bench& b, Report& rep) {
  const StepArgs& a = b.a;
  const bool sixteen = b.sixteen, cuda = b.cuda;
  const DType precision = b.precision;
  auto peak_of = [&b](DType p) { return b.peak_of(p); };
  const std::string peak_f32 = cuda ? "cuBLAS sgemm (fp32, no TF32)" : cpu_sgemm_choice().name;
  std::string mfu_note = "MFU: model FLOPs (6 x matmul parameters + causal attention, no recompute) per second over the "
                         "measured matmul peak of the row's precision";
  if (!sixteen || a.f32_beside)
    mfu_note += ": fp32 against " + peak_f32 + " (" + std::to_string(static_cast<int>(peak_of(DType::F32) / 1e9)) + " GFLOP/s)";
  if (sixteen)
    mfu_note += std::string(a.f32_beside ? ", " : ": ") + precision_name(precision) + " against " +
                (cuda ? "cublasGemmEx on the tensor cores" : "the 16-bit matmul the cpu model runs (oneDNN, or sgemm where it falls back)") +
                " (" + std::to_string(static_cast<int>(peak_of(precision) / 1e9)) + " GFLOP/s)";
  rep.notes.push_back(mfu_note + ".");
  rep.notes.push_back("exposed: time the model waited for parameters and gradient buffers, plus the optimizer's wait "
                      "for states from their tier (the speculative updates' during backward too); the rest of the step is compute (model and CPU Adam).");
  rep.notes.push_back("CPU s: CPU seconds of every thread of the process per step (the copy and I/O threads and the optimizer lane "
                      "included); against step s times the cores, it says how busy the cores were and what the offloaded step costs them.");
}

// The comparisons each option asks for: checkpoints pinned, the GPU optimizer, speculation.
void report_options(const Bench& b, Report& rep) {
  const StepArgs& a = b.a;
  const std::vector<DType>& precisions = b.precisions;
  const std::vector<Setup>& setups = b.setups;
  auto find = [&b](auto... args) { return b.find(args...); };
  if (a.checksums && a.nvme)
    rep.notes.push_back("the NVMe configuration ran with strata.checksums on: every extent hashed (xxh3) when "
                        "written and verified when read");
  if (a.cpu_checkpointing) {
    std::string line = "checkpoints in pinned memory (cpu_checkpointing) against on the device, step time:";
    for (int nvme = 0; nvme < (a.nvme ? 2 : 1); ++nvme)
      for (DType p : precisions) {
        const Setup *on = find(nvme, p), *off = find(nvme, p, false, false, 1.0, true);
        char b[192];
        std::snprintf(b, sizeof b, " %s%s %.3f s against %.3f s (%.3fx);", nvme ? "NVMe " : "in memory ",
                      precision_name(p), summarize(off->seconds).median, summarize(on->seconds).median,
                      summarize(off->seconds).median / summarize(on->seconds).median);
        line += b;
      }
    line.back() = '.';
    rep.notes.push_back(line);
  }
  if (a.gpu_optimizer) {
    std::string line = "GPU optimizer: the step with parameters and optimizer states on the GPU against the CPU Adam "
                       "over pinned states:";
    for (DType p : precisions) {
      const Setup *g = find(false, p, false, true), *c = find(false, p), *r = find(false, p, false, false, a.ratio);
      char b[256];
      std::snprintf(b, sizeof b, " %s %.3f s against %.3f s, ratio %.2g %.3f s (optimizer %.3f / %.3f / %.3f s);",
                    precision_name(p), summarize(g->seconds).median, summarize(c->seconds).median, a.ratio,
                    summarize(r->seconds).median, summarize(g->optimizer).median, summarize(c->optimizer).median,
                    summarize(r->optimizer).median);
      line += b;
    }
    line.back() = '.';
    rep.notes.push_back(line);
  }
  if (a.speculative) {
    // What the speculative optimizer moved out of step(): its optimizer time (the sub-groups
    // left for step(), or all of them again where the step was undone) against the plain row's.
    nlohmann::json hidden = nlohmann::json::object();
    std::string line = "speculative: optimizer s is what is left at step() (the last group, plus any step undone); "
                       "of the plain row's optimizer time, moved into the backward pass:";
    for (const Setup& s : setups) {
      if (!s.engine || !s.speculative) continue;
      const Setup* plain = find(s.nvme, s.precision, false, s.gpu_optimizer, s.ratio, s.cpu_checkpointing);
      const double po = summarize(plain->optimizer).median, so = summarize(s.optimizer).median;
      const double frac = po > 0 ? 1.0 - so / po : 0.0;
      hidden[s.label] = frac;
      char b[160];
      std::snprintf(b, sizeof b, " %s %.0f%%, step %.3fx the plain one;", s.label.c_str(), 100 * frac,
                    summarize(s.seconds).median / summarize(plain->seconds).median);
      line += b;
    }
    line.back() = '.';
    rep.notes.push_back(line);
    rep.extra["optimizer_moved_into_backward"] = hidden;
  }
}

// PyTorch's step and the 16-bit step against fp32 and PyTorch.
void report_ratios(const Bench& b, Report& rep) {
  const StepArgs& a = b.a;
  const bool sixteen = b.sixteen, cuda = b.cuda;
  const DType precision = b.precision;
  const auto& torch = b.torch;
  const std::vector<Setup>& setups = b.setups;
  const std::string& memory_label = b.memory_label;
  auto find = [&b](auto... args) { return b.find(args...); };
  // Strata's step in memory in the reference's precision against PyTorch's.
  auto torch_ratio = [&] { return summarize(setups.back().seconds).median / summarize(find(false, precision)->seconds).median; };
  if (torch) {
    rep.extra["torch"] = torch->info();
    const std::string how =
        sixteen ? std::string("under torch.autocast(\"") + (cuda ? "cuda" : "cpu") + "\", dtype=torch." +
                      (precision == DType::BF16 ? "bfloat16" : "float16") + ")"
                : std::string("in fp32 (no TF32)");
    rep.notes.push_back("PyTorch " + torch->info().value("torch", std::string("?")) + " (" +
                        (cuda ? torch->info().value("device", std::string("GPU")) + ", parameters, gradients and "
                                                                                     "fused AdamW on the GPU"
                              : std::to_string(torch->info().value("threads", 0)) + " threads") +
                        ", attention: " + torch->info().value("attention", std::string("?")) +
                        "): the same GPT and step (AdamW included) " + how + ", bench/ref/torch_gpt_step.py.");
  }
  if (torch && !sixteen) {
    char b[200];
    std::snprintf(b, sizeof b, "fp32 tokens/s over PyTorch's on the GPU: %.2fx (%s).", torch_ratio(),
                  memory_label.c_str());
    rep.notes.push_back(b);
    rep.extra["ratios"] = {{"memory_tokens_per_s_over_torch", torch_ratio()}};
  }
  if (sixteen) {
    nlohmann::json ratios = nlohmann::json::object();
    auto two = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.2f", v);
      return std::string(b);
    };
    const Setup* mem16 = find(false, precision);
    if (a.f32_beside)
      ratios["memory_tokens_per_s_over_f32"] = summarize(find(false, DType::F32)->seconds).median / summarize(mem16->seconds).median;
    if (a.nvme && a.f32_beside) {
      const Setup *n32 = find(true, DType::F32), *n16 = find(true, precision);
      ratios["nvme_tokens_per_s_over_f32"] = summarize(n32->seconds).median / summarize(n16->seconds).median;
      const double b32 = summarize(n32->nvme_read).median + summarize(n32->nvme_written).median;
      const double b16 = summarize(n16->nvme_read).median + summarize(n16->nvme_written).median;
      if (b32 > 0) ratios["nvme_bytes_over_f32"] = b16 / b32;
    }
    if (torch) ratios["memory_tokens_per_s_over_torch"] = torch_ratio();
    std::vector<std::string> parts;
    if (ratios.contains("memory_tokens_per_s_over_f32")) {
      std::string p = "tokens/s over fp32: " + two(ratios["memory_tokens_per_s_over_f32"].get<double>()) + "x in memory";
      if (ratios.contains("nvme_tokens_per_s_over_f32"))
        p += ", " + two(ratios["nvme_tokens_per_s_over_f32"].get<double>()) + "x with NVMe";
      parts.push_back(p);
    }
    if (ratios.contains("nvme_bytes_over_f32"))
      parts.push_back("NVMe bytes per step " + two(ratios["nvme_bytes_over_f32"].get<double>()) + " of fp32's");
    if (ratios.contains("memory_tokens_per_s_over_torch"))
      parts.push_back(std::string("tokens/s over PyTorch autocast") + (cuda ? " on the GPU" : "") + ": " +
                      two(ratios["memory_tokens_per_s_over_torch"].get<double>()) + "x");
    if (!parts.empty()) {
      std::string line = precision_name(precision);
      for (size_t i = 0; i < parts.size(); ++i) line += (i ? "; " : " ") + parts[i];
      rep.notes.push_back(line + ".");
    }
    rep.extra["ratios"] = ratios;
  } else if (a.torch && !cuda) {
    rep.notes.push_back("fp32 only: --precision bf16 runs the 16-bit step beside it, and PyTorch autocast beside both.");
  }
}

int run_bench_step(const StepArgs& a) {
  check_args(a);
  namespace fs = std::filesystem;
  const fs::path swap = fs::path(a.dir) / ("strata-bench-step-" + std::to_string(::getpid()));
  fs::create_directories(swap);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } cleanup{swap};

  Bench b(a);
  b.swap = swap;
  open_machine(b);
  b.params = gpt_param_count(a.shape);
  b.specs = gpt_group_specs(a.shape);
  for (const GroupSpec& g : b.specs) b.sizes.push_back({g.name, g.numel});
  b.memory_label = b.cuda ? "params on GPU, optimizer pinned" : "in memory";
  b.setups = make_setups(b);
  if (a.layout) {
    print_layouts(b);
    return 0;
  }
  build_engines(b);
  time_setups(b);

  Report rep = report_head(b);
  report_rows(b, rep);
  report_measures(b, rep);
  report_options(b, rep);
  report_ratios(b, rep);
  emit(rep, a.out);
  return 0;
}

}  // namespace

void add_step(CLI::App& bench, Runner& run) {
  static StepArgs a;
  auto* s = bench.add_subcommand("step", "One training step of the GPT, in memory and with params and optimizer states "
                                         "on NVMe (the in-memory step is the reference)");
  s->add_option("--layers", a.shape.layers, "Transformer blocks")->check(cli_checks::at_least(1));
  s->add_option("--d-model", a.shape.d_model, "Model width")->check(cli_checks::at_least(1));
  s->add_option("--heads", a.shape.heads, "Attention heads")->check(cli_checks::at_least(1));
  s->add_option("--seq", a.shape.seq_len, "Sequence length")->check(cli_checks::at_least(1));
  s->add_option("--vocab", a.shape.vocab, "Vocabulary")->check(CLI::Range(2, 1 << 20));
  s->add_option("--micro-batch", a.micro_batch, "Sequences per micro-step")->check(cli_checks::at_least(1));
  s->add_option("--accum", a.accum, "Micro-steps per optimizer step")->check(cli_checks::at_least(1));
  s->add_option("--reps", a.reps, "Timed steps per configuration")->check(cli_checks::at_least(1));
  s->add_option("--warmup", a.warmup, "Untimed steps per configuration first")->check(cli_checks::at_least(0));
  s->add_option("--lead-in", a.lead_in,
                "Untimed steps of a configuration right before each of its timed steps, so the timed one starts as in "
                "training (0: the configurations alternate step by step)")
      ->capture_default_str()
      ->check(cli_checks::at_least(0));
  s->add_flag("--checkpointing", a.checkpointing,
              "Recompute each block's activations in backward (the engine holds the checkpoints, as strata train does)");
  s->add_flag("--cpu-checkpointing", a.cpu_checkpointing,
              "With --checkpointing: each configuration also with the checkpoints in pinned memory "
              "(activation_checkpointing.cpu_checkpointing)");
  s->add_option("--dir", a.dir, "Directory on the NVMe drive for the swap files");
  s->add_option("--memory-budget", a.memory_budget, "Device budget of the in-memory configuration");
  s->add_option("--device-budget", a.device_budget, "Device budget of the offloaded configuration");
  s->add_option("--pinned-budget", a.pinned_budget, "Pinned budget of the offloaded configuration");
  s->add_option("--trace", a.trace, "Write a Chrome trace of one configuration's steps to this file: the NVMe one (with --no-nvme the in-memory "
                "one with CPU Adam) in the last precision, speculative with --speculative");
  s->add_option("--backend", a.backend, "cpu, or cuda (GptCuda on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  s->add_option("--precision", a.precision,
                "f32, or bf16 / fp16: each configuration in fp32 and in 16 bits, PyTorch autocast beside them")
      ->check(CLI::IsMember({"f32", "bf16", "fp16"}))
      ->capture_default_str();
  s->add_flag("!--no-f32", a.f32_beside,
              "With --precision bf16/fp16: only the 16-bit configurations, not fp32 beside them (a model that fits "
              "the GPU once, not twice)");
  s->add_flag("!--no-nvme", a.nvme, "Only the in-memory configuration");
  s->add_flag("--checksums", a.checksums,
              "The NVMe configuration with strata.checksums on: an xxHash of every extent written, verified on every "
              "read (run with and without it to see what checksums cost)");
  s->add_flag("--speculative", a.speculative,
              "Each configuration also with the speculative optimizer (strata.speculative_optimizer)");
  s->add_flag("--speculation-inline", a.speculation_inline,
              "With --speculative: step its updates on the model's thread between blocks, not on the optimizer "
              "lane beside it (EngineAblation::speculation_lane), to measure what the lane gives");
  s->add_flag("--gpu-optimizer", a.gpu_optimizer,
              "cuda: also parameters and optimizer states on the GPU, stepped there (offload_optimizer none), "
              "and the states split by --optimizer-ratio between CPU Adam and the GPU optimizer");
  s->add_option("--optimizer-ratio", a.ratio,
                "With --gpu-optimizer: the share of optimizer states CPU Adam steps in the split configuration "
                "(offload_optimizer.ratio; the rest on the GPU, concurrently)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  s->add_option("--optimizer-threads", a.optimizer_threads,
                "CPU Adam's threads (0: every core); fewer leave cores to the model's thread beside the optimizer lane")
      ->check(CLI::Range(0u, 4096u))
      ->capture_default_str();
  s->add_flag("!--no-torch", a.torch, "Without the PyTorch reference");
  s->add_flag("--layout", a.layout,
              "Print each configuration's resolved layout (every tier, speculating sub-group, checkpoint home and "
              "budget decision its engine would run by, as strata plan prints it) and time nothing");
  s->add_option("--python", a.python, "Python with torch, for the PyTorch reference")->capture_default_str();
  s->add_option("--torch-script", a.torch_script, "The PyTorch reference script")->capture_default_str();
  add_output_options(*s, a.out, "step time of each configuration, split into compute and exposed transfer");
  s->callback([&run] { run = [] { return run_bench_step(a); }; });
}

}  // namespace strata::bench
