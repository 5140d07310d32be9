#include "strata/runtime/train/train.hpp"

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>

#include <unistd.h>

#include "strata/collectives/communicator.hpp"
#include "strata/core/clock.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/output_file.hpp"
#include "strata/core/output_guard.hpp"
#include "strata/model/data.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/formats/export.hpp"
#include "strata/runtime/config/lr_schedule.hpp"
#include "strata/runtime/engine/parted_source.hpp"
#include "strata/runtime/train/rank.hpp"
#include "strata/runtime/formats/peft.hpp"
#include "strata/runtime/train/step_driver.hpp"

namespace strata {

namespace {

std::string with_rank(const std::string& path, int rank, int world) {
  if (path.empty() || world == 1) return path;
  const auto dot = path.rfind('.');
  const std::string tag = ".rank" + std::to_string(rank);
  return dot == std::string::npos || path.find('/', dot) != std::string::npos ? path + tag
                                                                                : path.substr(0, dot) + tag + path.substr(dot);
}

// SIGTERM (a scheduler's preemption, `scancel`, srun forwarding), SIGINT (Ctrl-C) and
// SIGUSR1 (`sbatch --signal=USR1@120`) ask the run to stop after the step in flight,
// with a checkpoint. A second SIGINT stops at once. Each says so on stderr (rank 0;
// write(2) with fixed text: what a signal handler may do).
volatile std::sig_atomic_t g_stop_signal = 0;

void say_from_handler(const char* text) {
  if (process_rank() != 0) return;
  size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;
  if (g_stop_signal != 0 && sig == SIGINT) {
    say_from_handler(
        "\nstrata: a second interrupt: stopping at once, without a checkpoint of this step; the checkpoints "
        "saved before are intact (a save in progress is discarded at the next start): continue with --resume\n");
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  if (g_stop_signal == 0)
    say_from_handler(sig == SIGINT ? "\nstrata: interrupt: stopping after the step in flight, with a checkpoint "
                                     "when strata.checkpoint_dir is set (interrupt again to stop at once)\n"
                                   : "\nstrata: stop signal: stopping after the step in flight, with a checkpoint "
                                     "when strata.checkpoint_dir is set\n");
  g_stop_signal = sig;
  errno = saved_errno;
}

// Installs the handlers for the run and puts the previous ones back after it.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    for (int i = 0; i < 3; ++i) saved_[i] = std::signal(kSignals[i], on_stop_signal);
  }
  ~StopSignals() {
    for (int i = 0; i < 3; ++i) std::signal(kSignals[i], saved_[i]);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGUSR1};
  void (*saved_[3])(int);
};

// Why the run stops after this step, if it does: a stop signal on any rank, or an output
// rank 0 could not write. Every rank stops (they must agree: the checkpoint save is
// collective).
struct StopReason {
  int signal = 0;              // 0: none
  bool output_failed = false;  // rank 0's --metrics
};

StopReason agreed_stop(coll::Communicator& comm, bool output_failed) {
  double stop[2] = {static_cast<double>(g_stop_signal), output_failed ? 1.0 : 0.0};
  if (comm.size() > 1) comm.all_reduce(std::span<double>(stop, 2), coll::ReduceOp::Max).wait();
  return {static_cast<int>(stop[0]), stop[1] > 0};
}

// What train() checks before it opens anything.
void check_inputs(const Config& cfg, const TrainOptions& topts) {
  validate(cfg.strata.model);
  if (cfg.strata.data.path.empty())
    throw ConfigError("strata.data.path is not set: name a text file (byte-level, vocabulary 256) or an llm.c token "
                      "file, in the config or with --set strata.data.path=FILE");
  if (topts.resume && cfg.strata.checkpoint_dir.empty())
    throw ConfigError("--resume needs strata.checkpoint_dir: the directory the earlier run saved into");
  if (topts.resume && !topts.resume_from.empty())
    throw ConfigError("--resume and --resume-from " + topts.resume_from +
                      " both given: use --resume for the latest complete checkpoint in strata.checkpoint_dir, or "
                      "--resume-from to name one");
  if (!topts.init_from.empty() && (topts.resume || !topts.resume_from.empty()))
    throw ConfigError("--init-from starts a new run from a checkpoint's weights; --resume and --resume-from continue "
                      "one: give one of them");
}

// The checkpoint --init-from names (a step-<N> directory, or a directory of checkpoints:
// its latest complete one), checked to hold this model's shape; "" for none.
std::string init_checkpoint(const std::string& from, const GptShape& shape) {
  if (from.empty()) return "";
  std::error_code ec;
  std::string dir = from;
  if (std::filesystem::is_directory(dir, ec) && !std::filesystem::exists(std::filesystem::path(dir) / "manifest.json", ec))
    if (auto latest = latest_checkpoint(dir)) dir = *latest;
  check_checkpoint_model(read_checkpoint_info(dir), shape, "--init-from");
  return dir;
}

// Where a run starts: the checkpoint choose_start_checkpoint picked, loaded into the
// engine, or step 0 at the start of the data for "".
struct StartPoint {
  int64_t step = 0;   // optimizer steps already taken
  DataPosition pos{};
};

StartPoint resume_from(ZeroEngine& engine, coll::Communicator& comm, const std::string& dir) {
  StartPoint start;
  if (dir.empty()) return start;
  CheckpointInfo info;
  try {
    info = load_checkpoint(engine, comm, dir);
  } catch (const CorruptionError& e) {
    throw CorruptionError(e.what() + other_checkpoints_hint(dir));
  }
  start.step = info.step;
  // A checkpoint that strata train did not write (strata import) has no data position:
  // the data starts at its beginning.
  if (info.extra.is_object() && info.extra.contains("data")) start.pos = DataPosition::from_json(info.extra["data"]);
  // Once for the job (under MiCS every group's first rank loads).
  if (comm.rank() == 0 && process_rank() == 0) log::info("resumed from " + dir + " at step " + std::to_string(info.step));
  return start;
}

// The matmul peak that MFU is measured against, FLOP/s: the ranks that measure
// (RankContext::measures_device_peak: on cpu all, at once, sharing a machine's cores; on
// cuda one per GPU) measure at once, and the peaks are summed.
double measure_peak_flops(coll::Communicator& comm, Backend backend, DType precision, bool measures) {
  comm.barrier().wait();
  // Of the precision the model computes in.
  double peak = measures ? measure_matmul_peak(backend, precision, 0.3) : 0.0;
  comm.all_reduce(std::span<double>(&peak, 1)).wait();
  return peak;
}

// What a step's throughput and MFU are measured against.
struct StepCost {
  uint64_t global_tokens = 0;  // tokens per optimizer step, all ranks
  double flops_per_token = 0;  // model FLOPs, forward and backward
  double peak_flops = 0;       // FLOP/s, all ranks (measure_peak_flops)
};

// The timing fields of a step that took `seconds`: throughput, MFU, and the transfer
// wait it exposed (the engine's running totals now, `st`, against the previous step's).
void time_step(StepRecord& rec, double seconds, const StepCost& cost, const EngineStats& st,
               const EngineStats& prev) {
  rec.seconds = seconds;
  rec.tokens_per_s = static_cast<double>(cost.global_tokens) / rec.seconds;
  rec.mfu = cost.flops_per_token * static_cast<double>(cost.global_tokens) / rec.seconds / cost.peak_flops;
  rec.exposed_s = st.exposed_wait_s - prev.exposed_wait_s + st.optimizer_wait_s + st.speculation_wait_s;
  rec.optimizer_s = st.optimizer_s;
}

// A checkpoint after the step that reached optimizer step `step`: every checkpoint_every
// steps and after the last, or at once on a stop signal; only with a checkpoint_dir, and
// never twice for one step (a skipped step leaves the optimizer step unchanged).
bool should_checkpoint(const StrataSection& s, int64_t step, bool last_step, int64_t saved_step, bool stopping) {
  if (s.checkpoint_dir.empty() || step == saved_step) return false;
  if (stopping) return true;
  return s.checkpoint_every > 0 && (step % s.checkpoint_every == 0 || last_step);
}

// The mean loss over up to `asked` held-out global batches, and how many there were (the
// held-out split may hold fewer; loss -1 for none). x and y are the step's token buffers.
struct HeldOut {
  double loss = -1;
  int batches = 0;
  int asked = 0;
};

HeldOut heldout_loss(GptModel& model, WeightSource& engine, const TokenDataset& data, coll::Communicator& comm,
                     int asked, int micro, std::vector<int32_t>& x, std::vector<int32_t>& y) {
  double sum = 0;
  int n = 0;
  for (int b = 0; b < asked; ++b) {
    if (!data.heldout_batch(b, comm.rank(), comm.size(), micro, x.data(), y.data())) break;
    sum += model.forward_loss(engine, x.data(), y.data());
    ++n;
  }
  double both[2] = {sum, static_cast<double>(n)};
  comm.all_reduce(std::span<double>(both, 2)).wait();
  // Every rank has the same count of batches: the split is cut in whole global batches.
  return {both[1] > 0 ? both[0] / both[1] : -1, n, asked};
}

// Why a run evaluated no held-out batch: the split is smaller than one global batch.
std::string no_heldout_reason(const TokenDataset& data, int world, int micro) {
  return "the data's held-out split has " + std::to_string(data.heldout_windows()) + " windows (the last 5% of its " +
         std::to_string(data.windows()) + " windows, rounded down), fewer than one batch of " +
         std::to_string(world * micro) + " (train_micro_batch_size_per_gpu x ranks): use a longer data file, or a "
         "smaller micro-batch";
}

// What a metrics write that fails asks for (IoError's on_full).
constexpr const char* kMetricsFull = "free space on it or give --metrics a path on a disk with room";

// Rank 0's account of the run: the lines on stdout (with --quiet only the stop notice)
// and the metrics file, one JSON object per step. Other ranks hold a silent one.
class StepLog {
 public:
  // Opens the metrics file at once: a bad path fails before the model is built.
  StepLog(const Config& cfg, const TrainOptions& topts, int rank)
      : rank0_(rank == 0),
        lines_(rank == 0 && !topts.quiet),
        every_(std::max(1, cfg.steps_per_print)),
        loss_scaled_(cfg.fp16.enabled),
        speculative_(cfg.strata.speculative_optimizer) {
    if (rank0_ && !topts.metrics_path.empty())
      metrics_ = AppendedLines(topts.metrics_path, "the metrics file (--metrics)", kMetricsFull,
                               topts.metrics_optional ? OnWriteFailure::WarnAndStop : OnWriteFailure::Throw);
  }

  // What runs where, the memory it has, and the peak MFU is measured against.
  void header(const GptShape& shape, int world, const Device& device, const EngineOptions& eo, const ZeroEngine& engine,
              const GptModel& model, const GptOptions& mo, const StepCost& cost) {
    if (!lines_) return;
    const uint64_t params = gpt_param_count(shape);
    std::printf("strata train: %llu parameters (%d layers, d_model %d, %d heads, context %d, vocab %d), %d rank%s "
                "on %s%s, ZeRO stage %d, params on %s, optimizer on %s%s\n",
                static_cast<unsigned long long>(params), shape.layers, shape.d_model, shape.heads, shape.seq_len,
                shape.vocab, world, world == 1 ? "" : "s", device.description().c_str(),
                world == 1 ? "" : " (rank 0)", eo.stage, to_string(eo.param_home), to_string(eo.optimizer_home),
                eo.optimizer_ratio < 1.0
                    ? (" for " + std::to_string(static_cast<int>(100 * eo.optimizer_ratio + 0.5)) +
                       "% of the states, the GPU for the rest (offload_optimizer.ratio)")
                          .c_str()
                    : "");
    // Bytes per parameter from the shard layout: working parameters, reduced gradients,
    // fp32 master weights and Adam's two moments; where a group's fp32 parameter shard is
    // its master weights (GroupLayout::master_in_shard), one copy of the two.
    const ShardLayout& L = engine.layout();
    const uint64_t pb = L.elem_bytes(StateRole::ParamShard), gb = L.elem_bytes(StateRole::Grad),
                   ob = 3 * L.elem_bytes(StateRole::Master);
    // A frozen group (strata.lora's base) holds its working parameters alone.
    uint64_t state_bytes = 0, shared = 0;
    for (const GroupLayout& g : L.groups) {
      state_bytes += g.numel * (g.frozen ? pb : pb + gb + ob - (g.master_in_shard ? pb : 0));
      shared += g.master_in_shard && !g.frozen ? g.numel : 0;
    }
    const double per_param = params > 0 ? static_cast<double>(state_bytes) / static_cast<double>(params) : 0.0;
    const std::string masters = shared == 0       ? "f32 master and Adam moments"
                                : shared == params ? "Adam moments; the f32 params are the master weights"
                                                   : "f32 master and Adam moments; the params of " +
                                                         std::to_string(100 * shared / params) +
                                                         "% of them are their master weights";
    std::printf("  %s: model states %s (%.1f B/param: %s params, %s grads, %s) vs budgets "
                "device %s, pinned %s; activations %s per rank%s; %llu tokens per step; %s matmul peak %.1f GFLOP/s\n",
                precision_name(eo.precision), compact(state_bytes).c_str(), per_param,
                precision_name(L.dtype(StateRole::ParamShard)), precision_name(L.dtype(StateRole::Grad)),
                masters.c_str(), compact(eo.store.device_budget).c_str(),
                compact(eo.store.pinned_budget).c_str(), compact(model.activation_bytes()).c_str(),
                mo.checkpointing == ActivationCheckpointing::None ? "" : " (checkpointed per block)",
                static_cast<unsigned long long>(cost.global_tokens), precision_name(eo.precision),
                cost.peak_flops / 1e9);
    std::fflush(stdout);
  }

  // One step: a line every steps_per_print steps and after the last, and a metrics
  // object with the tiers' use and the bytes moved since the previous step's stats.
  void step(const StepRecord& rec, bool last_step, const EngineStats& st, const EngineStats& prev) {
    if (!rank0_) return;
    const auto& t = st.store.tiers;
    if (lines_ && (rec.step % every_ == 0 || last_step)) {
      const auto tier = [&](Tier k) {
        const TierUsage& u = t[static_cast<int>(k)];
        return compact(u.used) + "/" + compact(u.budget);
      };
      // fp16: the loss scale the next step's gradients carry.
      const std::string scale = loss_scaled_ ? "  scale " + format_scale(st.loss_scale) : "";
      std::printf("step %5lld  loss %.4f  lr %.3e  %8.0f tok/s  MFU %.2f  device %s  pinned %s  nvme %s  exposed %.3fs  "
                  "step %.2fs%s%s\n",
                  static_cast<long long>(rec.step), rec.loss, rec.lr, rec.tokens_per_s, rec.mfu,
                  tier(Tier::Device).c_str(), tier(Tier::Pinned).c_str(), tier(Tier::Nvme).c_str(), rec.exposed_s,
                  rec.seconds, scale.c_str(),
                  rec.stepped ? "" : loss_scaled_ ? "  (skipped: fp16 overflow)" : "  (skipped: non-finite gradients)");
      std::fflush(stdout);
    }
    if (!metrics_.is_open()) return;
    nlohmann::json j = {{"step", rec.step},          {"loss", rec.loss},       {"lr", rec.lr},
                        {"seconds", rec.seconds},    {"tokens_per_s", rec.tokens_per_s},
                        {"mfu", rec.mfu},            {"exposed_s", rec.exposed_s},
                        {"optimizer_s", rec.optimizer_s}, {"grad_norm", st.last_grad_norm},
                        {"stepped", rec.stepped}, {"skipped_steps", st.skipped_steps}};
    if (loss_scaled_) j["loss_scale"] = st.loss_scale;
    if (speculative_)
      j["speculation"] = {{"sub_groups", st.speculated_sub_groups},
                          {"commits", st.speculation_commits},
                          {"rollbacks", st.speculation_rollbacks},
                          {"fallback_sub_groups", st.speculation_fallback_sub_groups}};
    for (int k = 0; k < kTierCount; ++k) {
      const char* name = to_string(static_cast<Tier>(k));
      j["used"][name] = t[k].used;
      j["peak"][name] = t[k].peak;
      j["budget"][name] = t[k].budget;
    }
    // Bytes rank 0 sent in the step's collectives (EngineStats, as a ring moves them): over
    // the ranks the states are sharded over, across MiCS's replicas, within hpZ's groups,
    // and qgZ's two hops (within the node, across the nodes).
    j["collective_bytes"] = {{"shard", st.shard_collective_bytes - prev.shard_collective_bytes},
                             {"replicas", st.replica_collective_bytes - prev.replica_collective_bytes},
                             {"secondary", st.secondary_collective_bytes - prev.secondary_collective_bytes},
                             {"node", st.node_collective_bytes - prev.node_collective_bytes},
                             {"cross", st.cross_collective_bytes - prev.cross_collective_bytes}};
    if (st.quantized_weights_error > 0) j["quantized_weights_error"] = st.quantized_weights_error;
    if (st.quantized_gradients_error > 0) j["quantized_gradients_error"] = st.quantized_gradients_error;
    // Bytes moved between tiers in this step, by link ("nvme->pinned", ...).
    for (int from = 0; from < kTierCount; ++from)
      for (int to = 0; to < kTierCount; ++to) {
        const uint64_t b = st.store.bytes_moved[from][to] - prev.store.bytes_moved[from][to];
        if (b) j["moved"][std::string(to_string(static_cast<Tier>(from))) + "->" + to_string(static_cast<Tier>(to))] = b;
      }
    record(j, rec.step);
  }

  void saved(const std::string& checkpoint) {
    if (lines_) std::printf("  saved %s\n", checkpoint.c_str());
  }

  // Printed with --quiet too: the run ended early, and how to continue it.
  void stopped(int signal, int64_t step, const std::string& checkpoint_dir, const std::string& checkpoint) {
    if (rank0_)
      std::printf("stopped by signal %d (%s) after step %lld: %s\n", signal, strsignal(signal),
                  static_cast<long long>(step),
                  checkpoint_dir.empty() ? "no checkpoint was written (strata.checkpoint_dir is not set)"
                                         : ("continue with --resume from " + checkpoint).c_str());
    std::fflush(stdout);
  }

  // The speculative optimizer's count: steps committed, and steps it had to undo.
  void speculation(const EngineStats& st) {
    if (!lines_ || !speculative_) return;
    std::printf("speculative optimizer: %llu step(s) committed, %llu undone and stepped again or skipped "
                "(clipping, non-finite gradients); %llu sub-group(s) without room for it\n",
                static_cast<unsigned long long>(st.speculation_commits),
                static_cast<unsigned long long>(st.speculation_rollbacks),
                static_cast<unsigned long long>(st.speculation_fallback_sub_groups));
    std::fflush(stdout);
  }

  // Printed with --quiet too, and recorded: the loss, or why there is none.
  void heldout(const HeldOut& h, int64_t step, const std::string& why_none, int global_batch) {
    if (!rank0_) return;
    nlohmann::json j = {{"step", step}, {"heldout_batches", h.batches},
                        {"heldout_windows", static_cast<int64_t>(h.batches) * global_batch}};
    if (h.batches == 0) {
      std::printf("no held-out loss: %s\n", why_none.c_str());
      j["heldout_loss"] = nullptr;
      j["heldout_note"] = why_none;
    } else {
      std::printf("held-out loss %.6f%s\n", h.loss,
                  h.batches < h.asked ? (" (over " + std::to_string(h.batches) + " of the " + std::to_string(h.asked) +
                                         " batches asked: the held-out split holds no more)")
                                            .c_str()
                                      : "");
      j["heldout_loss"] = h.loss;
    }
    std::fflush(stdout);
    record(j, step);
  }

  // A metrics write failed (rank 0, never with --metrics-optional): the run stops after
  // this step. Says where it stopped and how to go on, prints the record it could not
  // write, and throws the write's error.
  bool output_failed() const { return static_cast<bool>(failure_); }
  [[noreturn]] void raise_output_failure(int64_t step, const std::string& checkpoint_dir,
                                         const std::string& checkpoint) {
    std::printf("stopped after step %lld: --metrics could not be written (the error follows); %s\n", static_cast<long long>(step),
                checkpoint.empty() ? (checkpoint_dir.empty() ? "no checkpoint was written (strata.checkpoint_dir is not set)"
                                                             : "no checkpoint was written")
                                   : ("saved " + checkpoint + ": make room and continue with --resume").c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "strata: the metrics record of step %lld, not written: %s\n",
                 static_cast<long long>(unwritten_step_), unwritten_.c_str());
    std::rethrow_exception(failure_);
  }

 private:
  static std::string compact(uint64_t bytes) { return format_bytes(bytes, ByteStyle::Compact); }
  static std::string format_scale(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }

  bool rank0_;   // only rank 0 reports
  bool lines_;   // rank 0 without --quiet
  int every_;    // steps_per_print, at least 1
  bool loss_scaled_ = false;  // fp16: lines and metrics show the loss scale
  bool speculative_ = false;  // strata.speculative_optimizer: its counts in metrics and at the end
  AppendedLines metrics_;
  std::exception_ptr failure_;  // the metrics write that failed; nothing is written after it
  std::string unwritten_;       // its record
  int64_t unwritten_step_ = 0;

  // One record, whole or not at all; a failure is kept for the step's stop agreement.
  void record(const nlohmann::json& j, int64_t step) {
    if (failure_) return;
    try {
      metrics_.append(j.dump());
    } catch (const IoError&) {
      failure_ = std::current_exception();
      unwritten_ = j.dump();
      unwritten_step_ = step;
    }
  }
};

// The model's options, and the engine's share of them: with checkpointing the engine
// holds the checkpoints (block inputs and the final residual), so its device budget counts
// them and cpu_checkpointing moves them off the device between forward and backward.
GptOptions model_options(const Config& cfg, EngineOptions& eo) {
  const GptShape& shape = cfg.strata.model;
  const int micro = cfg.train_micro_batch_size_per_gpu;
  GptOptions mo{micro,
                cfg.activation_checkpointing.enabled ? ActivationCheckpointing::PerBlock : ActivationCheckpointing::None,
                cfg.precision()};
  mo.cuda_kernels = cfg.strata.cuda_kernels;
  if (cfg.activation_checkpointing.enabled) {
    mo.checkpoints_from_source = true;
    eo.checkpoints.count = shape.layers + 1;
    eo.checkpoints.bytes = static_cast<uint64_t>(micro) * shape.seq_len * shape.d_model * sizeof(float);
  }
  return mo;
}

// A step whose loss is NaN or inf: most often the learning rate, but with NVMe offload
// and checksums off (the default) data damaged between the engine and the drive (a swap
// file overwritten, a failing drive) looks the same, so the message says how to rule
// that out.
std::string non_finite_loss_message(const Config& cfg, const ZeroEngine& engine, int64_t step, double loss) {
  std::string m = "step " + std::to_string(step) + ": the loss is " + std::to_string(loss) +
                  "; lower the learning rate or set gradient_clipping";
  if (!cfg.strata.checksums && !engine.resolved().options.store.nvme.paths.empty())
    m += ". With strata.checksums off (the default) corrupted offload data (a swap file on NVMe overwritten or "
         "damaged while the run held it) can also cause this: run again with --set strata.checksums=true, which "
         "verifies every NVMe read and names the file and offset of any damage";
  return m;
}

// --init-from, and LoRA's adapters: a base model's checkpoint loads the frozen base; its
// adapters start from strata.lora.init (--lora-init) or peft's default. A LoRA
// checkpoint's adapters come with it unless strata.lora.init names others. `host`: the
// engine's (each rank reads its slice of the masters).
void init_weights(const Config& cfg, ZeroEngine& engine, const PartedSource& source, coll::Communicator& host,
                  const std::string& init_dir, bool fresh) {
  const GptShape& shape = cfg.strata.model;
  const bool announce = process_rank() == 0;
  bool adapters_loaded = false;
  if (!init_dir.empty()) {
    const size_t base_groups = static_cast<size_t>(shape.layers) + 2;
    adapters_loaded = shape.has_lora() && checkpoint_model_groups(read_checkpoint_info(init_dir)).size() > base_groups;
    load_checkpoint_weights(engine, host, init_dir, shape.has_lora() && !adapters_loaded ? base_groups : SIZE_MAX);
    if (announce) log::info("initialised from the weights of " + init_dir + " (fresh optimizer, step 0)");
  }
  if (shape.has_lora() && fresh && (!adapters_loaded || !cfg.strata.lora.init.empty())) {
    write_lora_groups(engine, source, shape, lora_start_values(shape, cfg.strata.lora.init, cfg.strata.seed));
    if (announce)
      log::info(cfg.strata.lora.init.empty() ? std::string("LoRA adapters start as peft's default (A kaiming-uniform, B zero)")
                                             : "LoRA adapters start from " + cfg.strata.lora.init);
  }
}

// What the step loop works with, built by train() in the order it needs.
struct TrainLoop {
  const Config& cfg;
  coll::Communicator& comm;
  ZeroEngine& engine;
  GptModel& model;
  WeightSource& source;  // the engine, seen in the model's groups (PartedSource)
  const LrSchedule& lr_schedule;
  const StepCost& cost;
  const std::vector<std::string>& group_names;  // for checkpoints
  StepLog& log;
  // What checkpoints are written and read over: the engine's host communicator (its
  // MiCS group's ranks, or every rank), and whether this rank writes (under MiCS the
  // first group writes; the others hold the same shards).
  coll::Communicator& shard_host;
  bool writes_checkpoints = true;
};

// Saves a checkpoint. Under MiCS the first group's ranks write it as a checkpoint of
// their group (any layout reads it: checkpoint.hpp); every rank learns whether it worked.
std::string save_step(const TrainLoop& t, const nlohmann::json& extra) {
  const Config& cfg = t.cfg;
  if (&t.shard_host == &t.comm)
    return save_checkpoint(t.engine, t.comm, cfg.strata.checkpoint_dir, cfg.raw, extra, t.group_names);
  std::string path = checkpoint_dir_for(cfg.strata.checkpoint_dir, t.engine.iterations());
  std::exception_ptr ep;
  if (t.writes_checkpoints) {
    try {
      path = save_checkpoint(t.engine, t.shard_host, cfg.strata.checkpoint_dir, cfg.raw, extra, t.group_names);
    } catch (...) {
      ep = std::current_exception();
    }
  }
  std::vector<int32_t> failed{ep ? 1 : 0};
  t.comm.all_reduce(failed, coll::ReduceOp::Max).wait();
  if (ep) std::rethrow_exception(ep);
  if (failed[0] != 0)
    throw Error("saving " + path + " failed on the ranks of the first MiCS group, which write it (rank 0's "
                "message says why); this rank holds the same shards and wrote nothing");
  return path;
}

// The steps from res.first_step to strata.steps, or to a stop signal: each timed,
// reported, and checkpointed where due. batches' fill advances `pos` through the data.
void run_steps(const TrainLoop& t, TrainResult& res, TokenBatches& batches, const DataPosition& pos) {
  const Config& cfg = t.cfg;
  EngineStats prev = t.engine.stats();  // running totals after the previous step
  int64_t saved_step = res.first_step;  // the checkpoint resumed from, if any
  for (int64_t step = res.first_step; step < cfg.strata.steps; ++step) {
    const bool last_step = step + 1 == cfg.strata.steps;
    const double t0 = steady_seconds();
    // The learning rate the schedule gives this optimizer step, set before the backward
    // pass (the speculative optimizer steps during it).
    StepRecord rec;
    rec.lr = t.lr_schedule.lr_at(t.engine.optimizer_steps());
    t.engine.set_learning_rate(rec.lr);
    // Forward and backward over the micro-batches (the engine accumulates the gradients),
    // the loss averaged over every rank's, then the optimizer step.
    const StepResult r = run_step(t.engine, t.model, t.source, batches, &t.comm);
    rec.loss = r.loss;
    rec.stepped = r.stepped;
    rec.step = t.engine.iterations();
    const double seconds = steady_seconds() - t0;
    const EngineStats& st = r.after;
    time_step(rec, seconds, t.cost, st, prev);
    res.steps.push_back(rec);
    if (!std::isfinite(rec.loss)) throw Error(non_finite_loss_message(cfg, t.engine, step + 1, rec.loss));
    t.log.step(rec, last_step, st, prev);
    prev = st;

    const StopReason stop = agreed_stop(t.comm, t.log.output_failed());
    res.stop_signal = stop.signal;
    if (should_checkpoint(cfg.strata, rec.step, last_step, saved_step, stop.signal != 0 || stop.output_failed)) {
      saved_step = rec.step;
      const nlohmann::json extra = {{"data", pos.to_json()}, {"loss", rec.loss}};
      res.last_checkpoint = save_step(t, extra);
      t.log.saved(res.last_checkpoint);
    }
    if (stop.output_failed) {
      if (t.log.output_failed()) t.log.raise_output_failure(rec.step, cfg.strata.checkpoint_dir, res.last_checkpoint);
      throw Error("stopped after step " + std::to_string(rec.step) +
                  ": rank 0 could not write --metrics (its message says why)");
    }
    if (res.stop_signal) {
      t.log.stopped(res.stop_signal, rec.step, cfg.strata.checkpoint_dir, res.last_checkpoint);
      break;
    }
  }
}

// No output of the run replaces one of its inputs or another output (output_guard.hpp),
// checked on every rank (each writes its own trace) before anything is written.
void check_run_outputs(const Config& cfg, const TrainOptions& topts, const EngineOptions& eo,
                       const std::string& start_dir, const std::string& init_dir) {
  std::vector<RunPath> inputs = {{topts.config_path, "the config file"}, {cfg.strata.data.path, "strata.data.path"}};
  for (const std::string& p : eo.store.nvme.paths) inputs.push_back({p, "nvme_path"});
  const std::string resumed = topts.resume_from.empty() ? "the checkpoint --resume reads" : "--resume-from";
  for (const auto& [dir, what] : {std::pair{start_dir, resumed}, std::pair{init_dir, std::string("--init-from")}}) {
    if (dir.empty()) continue;
    inputs.push_back({dir, what});
    for (RunPath& f : files_in(dir, what)) inputs.push_back(std::move(f));
  }
  check_outputs_replace_no_input(
      inputs, {{topts.metrics_path, "--metrics"}, {eo.trace_path, "strata.trace"}, standard_output()});
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& topts) {
  check_inputs(cfg, topts);
  const GptShape shape = cfg.strata.model;
  // Blocks larger than stage3_prefetch_bucket_size, or tiled, are gathered in parts: one
  // engine group per part (gpt_parts), which the model reads through `source`.
  std::vector<std::vector<uint64_t>> parts =
      gpt_parts(shape, cfg.zero.stage3_prefetch_bucket_size, cfg.strata.tile_factor, cfg.strata.tile_size);
  const std::vector<GroupSpec> specs = gpt_group_specs(shape, parts);
  const bool parted = specs.size() != parts.size();
  // MPI (or self), the device and its communicator (strata.device_communicator; rank.hpp).
  RankContext ctx = open_rank(cfg);
  coll::Communicator* comm = ctx.host_comm.get();
  const int world = comm->size(), rank = comm->rank();

  // Data before the engine: a bad data file fails in a second, before any allocation.
  TokenDataset data(cfg.strata.data, shape.seq_len, shape.vocab, cfg.strata.seed);
  // The metrics file too (opened, nothing written before check_run_outputs): a bad path
  // fails now, not after the model is built.
  StepLog step_log(cfg, topts, rank);

  // The checkpoint directory next, before the model, the engine or any swap file: rank 0
  // holds its lock for the whole run (a second run into it is refused), and where the run
  // starts is decided now, so that a checkpoint in the way is an error before the first
  // step, not at the first save.
  CheckpointDirLock dir_lock;
  if (!cfg.strata.checkpoint_dir.empty()) dir_lock = lock_checkpoint_dir(*comm, cfg.strata.checkpoint_dir);
  const std::string start_dir =
      choose_start_checkpoint(*comm, cfg.strata.checkpoint_dir, topts.resume, topts.resume_from);
  if (!start_dir.empty())
    check_checkpoint_model(read_checkpoint_info(start_dir), shape, topts.resume ? "--resume" : "--resume-from");
  const std::string init_dir = init_checkpoint(topts.init_from, shape);

  EngineOptions eo = EngineOptions::from_config(cfg);
  eo.trace_path = with_rank(cfg.strata.trace, rank, world);
  check_run_outputs(cfg, topts, eo, start_dir, init_dir);
  const int micro = cfg.train_micro_batch_size_per_gpu, accum = cfg.gradient_accumulation_steps;
  const GptOptions mo = model_options(cfg, eo);
  // The model first: its activations (device memory on cuda) are allocated beside the
  // engine's device budget, so a budget too large for the GPU fails in the engine's
  // allocation, which names strata.device_budget.
  std::unique_ptr<GptModel> model = make_gpt(cfg.strata.backend, shape, mo);
  std::vector<std::string> group_names;
  for (const auto& g : specs) group_names.push_back(g.name);
  // Under MiCS the engine shards over its group's ranks and all-reduces across the groups.
  auto engine = std::make_unique<ZeroEngine>(*ctx.device, ctx.engine_comm(), ctx.engine_host_comm(), eo, specs,
                                             EngineAblation{}, ctx.engine_replicas(), ctx.engine_hpz());
  // Whole blocks: the schedule is known. Parts: the engine learns their order in the
  // first step (zero_engine.hpp's recorded trace).
  if (!parted) engine->set_schedule(gpt_schedule(shape));
  PartedSource source(*engine, std::move(parts));
  const LrSchedule lr_schedule{cfg.scheduler};  // a function of optimizer steps: resumes with them

  TrainResult res;
  // Every group reads its slices (a checkpoint of any layout: checkpoint.hpp).
  const StartPoint start = resume_from(*engine, ctx.engine_host_comm(), start_dir);
  init_weights(cfg, *engine, source, ctx.engine_host_comm(), init_dir, start_dir.empty());
  res.first_step = start.step;
  DataPosition pos = start.pos;
  res.peak_flops = measure_peak_flops(*comm, cfg.strata.backend, cfg.precision(), ctx.measures_device_peak);
  const StepCost cost{static_cast<uint64_t>(micro) * accum * world * shape.seq_len, gpt_flops_per_token(shape),
                      res.peak_flops};
  step_log.header(shape, world, *ctx.device, eo, *engine, *model, mo, cost);

  const StopSignals stop_signals;
  // Each micro-batch's tokens: this rank's share of the next world x micro sequences.
  TokenBatches batches(*model, accum, [&](int, int32_t* x, int32_t* y) {
    data.batch(pos, rank, world, micro, x, y);
    pos = data.advance(pos, world * micro);
  });
  run_steps({cfg, *comm, *engine, *model, source, lr_schedule, cost, group_names, step_log, ctx.engine_host_comm(),
             ctx.writes_checkpoints()},
            res, batches, pos);

  if (topts.eval_batches > 0 && !res.stop_signal) {
    const HeldOut h = heldout_loss(*model, source, data, *comm, topts.eval_batches, micro, batches.inputs, batches.targets);
    res.eval_loss = h.loss;
    res.eval_batches = h.batches;
    step_log.heldout(h, engine->iterations(), no_heldout_reason(data, world, micro), world * micro);
    if (step_log.output_failed())
      step_log.raise_output_failure(engine->iterations(), cfg.strata.checkpoint_dir, res.last_checkpoint);
  }
  res.stats = engine->stats();
  step_log.speculation(res.stats);
  return res;
}

}  // namespace strata
