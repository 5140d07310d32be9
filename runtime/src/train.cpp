#include "strata/runtime/train.hpp"

#include <chrono>
#include <csignal>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "strata/collectives/communicator.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/model/data.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/checkpoint.hpp"
#include "strata/runtime/lr_schedule.hpp"
#include "strata/runtime/rank.hpp"

namespace strata {

namespace {

std::string human_bytes(uint64_t b) {
  char buf[32];
  const double v = static_cast<double>(b);
  if (v >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2fG", v / (1024.0 * 1024 * 1024));
  else if (v >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1fM", v / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.0fK", v / 1024.0);
  return buf;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string with_rank(const std::string& path, int rank, int world) {
  if (path.empty() || world == 1) return path;
  const auto dot = path.rfind('.');
  const std::string tag = ".rank" + std::to_string(rank);
  return dot == std::string::npos || path.find('/', dot) != std::string::npos ? path + tag
                                                                                : path.substr(0, dot) + tag + path.substr(dot);
}

// SIGTERM (a scheduler's preemption, `scancel`, srun forwarding), SIGINT (Ctrl-C) and
// SIGUSR1 (`sbatch --signal=USR1@120`) ask the run to stop after the step in flight,
// with a checkpoint. A second SIGINT stops at once.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0 && sig == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_stop_signal = sig;
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

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& topts) {
  const GptShape shape = cfg.strata.model;
  validate(shape);
  if (cfg.strata.data.path.empty())
    throw ConfigError("strata.data.path is not set: name a text file (byte-level, vocabulary 256) or an llm.c token "
                      "file, in the config or with --set strata.data.path=FILE");
  if (topts.resume && cfg.strata.checkpoint_dir.empty())
    throw ConfigError("--resume needs strata.checkpoint_dir: the directory the earlier run saved into");

  // MPI (or self), the device (cuda: the GPU of this rank's local rank) and NCCL on cuda.
  RankContext ctx = open_rank(cfg);
  coll::Communicator* comm = ctx.host_comm.get();
  const int world = comm->size(), rank = comm->rank();

  // Data before the engine: a bad data file fails in a second, before any allocation.
  TokenDataset data(cfg.strata.data, shape.seq_len, shape.vocab, cfg.strata.seed);
  // The metrics file too: a bad path fails now, not after the model is built.
  std::ofstream metrics;
  if (rank == 0 && !topts.metrics_path.empty()) {
    metrics.open(topts.metrics_path, std::ios::app);
    if (!metrics) throw IoError("cannot open the metrics file for appending", topts.metrics_path, 0, 0, errno);
  }

  EngineOptions eo = EngineOptions::from_config(cfg);
  eo.trace_path = with_rank(cfg.strata.trace, rank, world);
  const int micro = cfg.train_micro_batch_size_per_gpu, accum = cfg.gradient_accumulation_steps;
  GptOptions mo{micro, cfg.activation_checkpointing.enabled ? ActivationCheckpointing::PerBlock
                                                            : ActivationCheckpointing::None};
  // The model first: its activations (device memory on cuda) are allocated beside the
  // engine's device budget, so a budget too large for the GPU fails in the engine's
  // allocation, which names strata.device_budget.
  std::unique_ptr<GptModel> model = make_gpt(cfg.strata.backend, shape, mo);
  const std::vector<GroupSpec> specs = gpt_group_specs(shape);
  std::vector<std::string> group_names;
  for (const auto& g : specs) group_names.push_back(g.name);
  auto engine = std::make_unique<ZeroEngine>(*ctx.device, ctx.device_comm(), *comm, eo, specs);
  engine->set_schedule(gpt_schedule(shape));
  const LrSchedule lr_schedule{cfg.scheduler};  // a function of optimizer steps: resumes with them

  TrainResult res;
  DataPosition pos{};
  if (topts.resume) {
    if (auto latest = latest_checkpoint(cfg.strata.checkpoint_dir)) {
      CheckpointInfo info = load_checkpoint(*engine, *comm, *latest);
      res.first_step = info.step;
      pos = DataPosition::from_json(info.extra.at("data"));
      if (rank == 0) log::info("resumed from " + *latest + " at step " + std::to_string(info.step));
    } else if (rank == 0) {
      log::warn("--resume: no complete checkpoint in " + cfg.strata.checkpoint_dir + "; starting from step 0");
    }
  }

  // The matmul peak that MFU is measured against: every rank measures at once (on the cpu
  // they share the machine's cores when they share a machine; on cuda each its own GPU)
  // and the peaks are summed.
  comm->barrier().wait();
  double peak = measure_matmul_peak(cfg.strata.backend, 0.3);
  comm->all_reduce(std::span<double>(&peak, 1)).wait();
  res.peak_flops = peak;

  const uint64_t params = gpt_param_count(shape);
  const double flops_per_token = gpt_flops_per_token(shape);
  const uint64_t global_tokens = static_cast<uint64_t>(micro) * accum * world * shape.seq_len;
  if (rank == 0 && !topts.quiet) {
    std::printf("strata train: %llu parameters (%d layers, d_model %d, %d heads, context %d, vocab %d), %d rank%s "
                "on %s%s, ZeRO stage %d, params on %s, optimizer on %s\n",
                static_cast<unsigned long long>(params), shape.layers, shape.d_model, shape.heads, shape.seq_len,
                shape.vocab, world, world == 1 ? "" : "s", ctx.device->description().c_str(),
                world == 1 ? "" : " (rank 0)", eo.stage, to_string(eo.param_home), to_string(eo.optimizer_home));
    std::printf("  model states %s (20 B/param: fp32 params, grads, master, Adam moments) vs budgets device %s, pinned %s; activations %s per rank%s; "
                "%llu tokens per step; matmul peak %.1f GFLOP/s\n",
                human_bytes(params * 20).c_str(), human_bytes(eo.store.device_budget).c_str(),
                human_bytes(eo.store.pinned_budget).c_str(), human_bytes(model->activation_bytes()).c_str(),
                mo.checkpointing == ActivationCheckpointing::None ? "" : " (checkpointed per block)",
                static_cast<unsigned long long>(global_tokens), peak / 1e9);
    std::fflush(stdout);
  }

  const StopSignals stop_signals;
  const size_t local = static_cast<size_t>(micro) * shape.seq_len;
  std::vector<int32_t> x(local), y(local);
  double exposed_before = engine->stats().exposed_wait_s;
  auto moved_before = engine->stats().store.bytes_moved;
  int64_t saved_step = res.first_step;  // the checkpoint resumed from, if any
  for (int64_t step = res.first_step; step < cfg.strata.steps; ++step) {
    const double t0 = now_s();
    double loss = 0;
    for (int m = 0; m < accum; ++m) {
      data.batch(pos, rank, world, micro, x.data(), y.data());
      pos = data.advance(pos, world * micro);
      engine->begin_micro_step();
      loss += model->forward_backward(*engine, x.data(), y.data());
    }
    comm->all_reduce(std::span<double>(&loss, 1)).wait();
    loss /= static_cast<double>(world * accum);
    StepRecord rec;
    rec.lr = lr_schedule.lr_at(engine->optimizer_steps());
    engine->set_learning_rate(rec.lr);
    rec.stepped = engine->step();
    rec.step = engine->optimizer_steps();
    if (!rec.stepped) rec.step = step + 1;
    rec.loss = loss;
    rec.seconds = now_s() - t0;
    rec.tokens_per_s = static_cast<double>(global_tokens) / rec.seconds;
    rec.mfu = flops_per_token * static_cast<double>(global_tokens) / rec.seconds / peak;
    EngineStats st = engine->stats();
    rec.exposed_s = st.exposed_wait_s - exposed_before + st.optimizer_wait_s;
    exposed_before = st.exposed_wait_s;
    rec.optimizer_s = st.optimizer_s;
    res.steps.push_back(rec);
    const auto moved_now = st.store.bytes_moved;
    if (!std::isfinite(loss))
      throw Error("step " + std::to_string(step + 1) + ": the loss is " + std::to_string(loss) +
                  "; lower the learning rate or set gradient_clipping");

    if (rank == 0) {
      const auto& t = st.store.tiers;
      const auto tier = [&](Tier k) {
        const TierUsage& u = t[static_cast<int>(k)];
        return human_bytes(u.used) + "/" + human_bytes(u.budget);
      };
      if (!topts.quiet && (rec.step % std::max(1, cfg.steps_per_print) == 0 || step + 1 == cfg.strata.steps)) {
        std::printf("step %5lld  loss %.4f  lr %.3e  %8.0f tok/s  MFU %.2f  device %s  pinned %s  nvme %s  exposed %.3fs  "
                    "step %.2fs%s\n",
                    static_cast<long long>(rec.step), loss, rec.lr, rec.tokens_per_s, rec.mfu, tier(Tier::Device).c_str(),
                    tier(Tier::Pinned).c_str(), tier(Tier::Nvme).c_str(), rec.exposed_s, rec.seconds,
                    rec.stepped ? "" : "  (skipped: non-finite gradients)");
        std::fflush(stdout);
      }
      if (metrics.is_open()) {
        nlohmann::json j = {{"step", rec.step},          {"loss", loss},           {"lr", rec.lr},
                            {"seconds", rec.seconds},    {"tokens_per_s", rec.tokens_per_s},
                            {"mfu", rec.mfu},            {"exposed_s", rec.exposed_s},
                            {"optimizer_s", rec.optimizer_s}, {"grad_norm", st.last_grad_norm},
                            {"stepped", rec.stepped}};
        for (int k = 0; k < kTierCount; ++k) {
          const char* name = to_string(static_cast<Tier>(k));
          j["used"][name] = t[k].used;
          j["peak"][name] = t[k].peak;
          j["budget"][name] = t[k].budget;
        }
        // Bytes moved between tiers in this step, by link ("nvme->pinned", ...).
        for (int from = 0; from < kTierCount; ++from)
          for (int to = 0; to < kTierCount; ++to) {
            const uint64_t b = st.store.bytes_moved[from][to] - moved_before[from][to];
            if (b) j["moved"][std::string(to_string(static_cast<Tier>(from))) + "->" + to_string(static_cast<Tier>(to))] = b;
          }
        metrics << j.dump() << "\n";
        metrics.flush();
      }
    }
    moved_before = moved_now;
    // A stop signal on any rank stops every rank after this step (they must agree: the
    // save below is collective).
    double stop = g_stop_signal;
    if (world > 1) comm->all_reduce(std::span<double>(&stop, 1), coll::ReduceOp::Max).wait();
    res.stop_signal = static_cast<int>(stop);
    // A skipped step leaves optimizer_steps() unchanged: never save the same step twice.
    if ((cfg.strata.checkpoint_every > 0 || res.stop_signal) && !cfg.strata.checkpoint_dir.empty() &&
        rec.step != saved_step &&
        (res.stop_signal || rec.step % cfg.strata.checkpoint_every == 0 || step + 1 == cfg.strata.steps)) {
      saved_step = rec.step;
      nlohmann::json extra = {{"data", pos.to_json()}, {"loss", loss}};
      res.last_checkpoint = save_checkpoint(*engine, *comm, cfg.strata.checkpoint_dir, cfg.raw, extra, group_names);
      if (rank == 0 && !topts.quiet) std::printf("  saved %s\n", res.last_checkpoint.c_str());
    }
    if (res.stop_signal) {
      if (rank == 0)
        std::printf("stopped by signal %d (%s) after step %lld: %s\n", res.stop_signal, strsignal(res.stop_signal),
                    static_cast<long long>(rec.step),
                    cfg.strata.checkpoint_dir.empty()
                        ? "no checkpoint was written (strata.checkpoint_dir is not set)"
                        : ("continue with --resume from " + res.last_checkpoint).c_str());
      std::fflush(stdout);
      break;
    }
  }

  if (topts.eval_batches > 0 && !res.stop_signal) {
    double sum = 0;
    int n = 0;
    for (int b = 0; b < topts.eval_batches; ++b) {
      if (!data.heldout_batch(b, rank, world, micro, x.data(), y.data())) break;
      sum += model->forward_loss(*engine, x.data(), y.data());
      ++n;
    }
    double both[2] = {sum, static_cast<double>(n)};
    comm->all_reduce(std::span<double>(both, 2)).wait();
    if (both[1] > 0) res.eval_loss = both[0] / both[1];
    if (rank == 0 && !topts.quiet && res.eval_loss >= 0) std::printf("held-out loss %.6f\n", res.eval_loss);
  }
  res.stats = engine->stats();
  return res;
}

}  // namespace strata
