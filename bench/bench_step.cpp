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
// --peers runs what a user who needs offload would pick instead (DeepSpeed ZeRO-Offload and
// ZeRO-Infinity, FSDP2 with CPU offload; step_peers.hpp) beside them, each in its own process
// in the precision asked for; step_report.cpp reports the run.
#include <algorithm>
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
#include "strata/bench/step_peers.hpp"
#include "step_bench.hpp"
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

namespace strata::bench {

using step::Bench;
using step::Setup;
using step::StepArgs;
using step::nvme_bytes;

namespace {


// The arguments, before minutes of work.
void check_args(const StepArgs& a) {
  check_output_options(a.out, {{a.python, "--python"}, {a.torch_script, "--torch-script"}, {a.peer_script, "--peer-script"}},
                       {{a.trace, "--trace"}});
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
  if (a.cuda_kernels != "reference" && a.backend != "cuda")
    throw ConfigError("bench step: --cuda-kernels " + a.cuda_kernels +
                      " selects kernels of the cuda backend: give --backend cuda too, or leave --cuda-kernels out");
  if (!a.cuda_profile.empty() && a.backend != "cuda")
    throw ConfigError("bench step: --cuda-profile brackets a configuration's step for a CUDA profiler (ncu, nsys): "
                      "give --backend cuda too");
  if (!a.cuda_profile.empty() && a.warmup < 1)
    throw ConfigError("bench step: --cuda-profile records a configuration's last warm-up step (no timed step runs "
                      "under the profiler): give --warmup 1 or more");
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

  // The peers, each in its own process, in the precision asked for (a peer that cannot
  // start is skipped with its reason, said now and under the table).
  if (!a.layout)
    for (PeerKind k : peer_kinds(a.peers, a.nvme)) {
      b.progress.show(std::string("starting ") + peer_title(k) + " (DeepSpeed builds its ops on first use: minutes)");
      b.peers.push_back(start_peer(k, {a.shape, a.micro_batch, a.accum, b.threads, b.precision, b.cuda, a.python,
                                       a.peer_script, b.swap / peer_id(k)}));
      if (!b.peers.back().skipped.empty())
        std::fprintf(stderr, "bench step: %s skipped: %s\n", peer_title(k).c_str(), b.peers.back().skipped.c_str());
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
  // The peers (before PyTorch: report_ratios finds PyTorch's row last).
  for (size_t i = 0; i < bench.peers.size(); ++i) {
    if (!bench.peers[i].process) continue;
    Setup s;
    s.label = peer_title(bench.peers[i].kind) + (sixteen ? std::string(", ") + precision_name(precision) : "");
    s.precision = precision;
    s.peer = static_cast<int>(i);
    setups.push_back(std::move(s));
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

// --cuda-profile: each label names one of Strata's configurations or PyTorch's, exactly as
// the table prints it; a peer's step is its own process's and is not bracketed.
void mark_profiled(std::vector<Setup>& setups, const std::vector<std::string>& labels) {
  std::vector<std::string> names;
  std::vector<Setup*> own;
  for (Setup& s : setups)
    if (s.peer < 0) names.push_back(s.label), own.push_back(&s);
  for (size_t i : find_labels(names, labels, "bench step: --cuda-profile")) own[i]->profiled = true;
}

EngineAblation ablation_of(const StepArgs& a) {
  EngineAblation ablation;
  ablation.speculation_lane = !a.speculation_inline;
  ablation.plain_state_prefetch = !a.no_state_prefetch;
  ablation.params_in_place = ablation.grads_in_place = !a.no_in_place;
  return ablation;
}

// --layout: each configuration's resolved layout (resolve.hpp), the decisions its engine
// would run by, in the form strata plan prints them; nothing is built or timed.
void print_layouts(const Bench& b) {
  for (const Setup& s : b.setups) {
    if (s.torch || s.peer >= 0) continue;
    const EngineOptions o = engine_options(b, s.nvme, s.precision, s.speculative, s.gpu_optimizer, s.ratio, s.cpu_checkpointing);
    const ResolvedLayout r = resolve(o, ablation_of(b.a), b.sizes, 1, device_traits(*b.device));
    std::printf("configuration: %s\n%s\n", s.label.c_str(), r.describe().c_str());
  }
}

// A model per precision, and each configuration's engine.
void build_engines(Bench& b) {
  const StepArgs& a = b.a;
  const CudaKernels kernels = a.cuda_kernels == "fused" ? CudaKernels::Fused : CudaKernels::Reference;
  for (DType p : b.precisions)
    b.models.push_back(make_gpt(b.backend, a.shape,
                                {a.micro_batch, a.checkpointing ? ActivationCheckpointing::PerBlock : ActivationCheckpointing::None, p,
                                 a.checkpointing, kernels}));
  // The traced engine's recorder is the process's active one from its construction on;
  // the other configurations' steps, run in between, are kept out of it.
  for (Setup& s : b.setups) {
    if (s.torch || s.peer >= 0) continue;
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
// profile: the step inside CUDA's profiler capture (--cuda-profile: the last warm-up step of
// a configuration asked for, so no timed step is a profiled one).
void time_one(Bench& b, Setup& s, bool warmup, bool profile, const std::string& what, TokenBatches& batches) {
  const StepArgs& a = b.a;
  if (s.torch) {
    const nlohmann::json got = b.torch->command(profile ? "profile" : "step");
    if (!got.contains("seconds")) throw Unavailable("bench step: the PyTorch reference failed: " + got.dump());
    if (!warmup) s.seconds.push_back(got["seconds"].get<double>());
    return;
  }
  if (s.peer >= 0) {  // its lead-in too, as Strata's configurations have it: a peer's step follows one of its own
    for (int k = 0; k < (warmup ? 0 : a.lead_in); ++k) step_peer(b.peers[s.peer]);
    const PeerStep got = step_peer(b.peers[s.peer]);
    if (warmup) return;
    s.seconds.push_back(got.seconds);
    s.nvme_read.push_back(got.read_bytes);
    s.nvme_written.push_back(got.written_bytes);
    s.peak_host.push_back(got.peak_host_bytes);
    return;
  }
  trace::set_active(s.traced ? b.recorder : nullptr);
  if (!warmup)
    for (int k = 0; k < a.lead_in; ++k) {
      b.progress.show(what + " (lead-in " + std::to_string(k + 1) + "/" + std::to_string(a.lead_in) + ")");
      run_step(*s.engine, *s.model, *s.engine, batches);
    }
  const double cpu0 = process_cpu_seconds();
  if (profile) cuda_profiler_range(true);
  const StepResult r = run_step(*s.engine, *s.model, *s.engine, batches);
  if (profile) cuda_profiler_range(false);
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
      time_one(b, s, r < a.warmup, s.profiled && r == a.warmup - 1, what, batches);
    }
  trace::set_active(b.recorder);  // as the traced engine left it: it hands the outer one back when it goes
  b.progress.done();
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
  mark_profiled(b.setups, a.cuda_profile);
  if (a.layout) {
    print_layouts(b);
    return 0;
  }
  build_engines(b);
  time_setups(b);

  emit(step::step_report(b), a.out);
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
  s->add_option("--cuda-profile", a.cuda_profile,
                "cuda: the last warm-up step of this configuration (its label as the table prints it, PyTorch's too; "
                "repeatable) inside CUDA's profiler capture, for `ncu --profile-from-start off` or `nsys profile "
                "--capture-range=cudaProfilerApi`; the timed steps run outside it");
  s->add_option("--backend", a.backend, "cpu, or cuda (GptCuda on GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  s->add_option("--cuda-kernels", a.cuda_kernels,
                "With --backend cuda: the model's kernels, reference or fused (strata.cuda_kernels; fused has not run "
                "on a GPU yet)")
      ->check(CLI::IsMember({"reference", "fused"}))
      ->capture_default_str();
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
  s->add_flag("--no-state-prefetch", a.no_state_prefetch,
              "Without speculation: the optimizer's states read at step(), each while the one before is stepped, "
              "not fetched during the last backward pass (EngineAblation::plain_state_prefetch), to measure what "
              "the prefetch gives");
  s->add_flag("--no-in-place", a.no_in_place,
              "Copy on one rank as on several: every configuration reduce-scatters each micro-step's gradient, and "
              "those with the parameters on the device gather them, rather than reading both where they are "
              "(EngineAblation::grads_in_place, params_in_place), to measure what that gives");
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
  s->add_option("--peers", a.peers,
                "Peers beside Strata, each its own process with --python, same GPT, tokens and precision: deepspeed "
                "(ZeRO-3 with offload_optimizer cpu, and with params and optimizer on NVMe in --dir unless --no-nvme), "
                "fsdp2 (fully_shard with CPUOffloadPolicy). One that cannot start is skipped with its reason")
      ->delimiter(',')
      ->check(CLI::IsMember(peer_names()));
  s->add_option("--peer-script", a.peer_script, "The peers' script")->capture_default_str();
  add_output_options(*s, a.out, "step time of each configuration, split into compute and exposed transfer");
  s->callback([&run] { run = [] { return run_bench_step(a); }; });
}

}  // namespace strata::bench
