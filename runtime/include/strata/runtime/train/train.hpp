// `strata train`: the GPT (model/gpt.hpp) trained under the ZeRO engine, one process per
// rank (mpirun/srun) or a single process. Each rank reads its own slice of every global
// batch; rank 0 prints one line per step and writes the metrics.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/model/gpt_layout.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata {

// The engine's parameter groups for a GPT: names and sizes from gpt_layout, GPT-2's
// initialisation (normal(0, init_std) weights, zero biases, unit layer-norm gains).
std::vector<GroupSpec> gpt_group_specs(const GptShape& shape, float init_std = 0.02f);
// The same cut in parts (gpt_parts; one engine group per part, named "<group>@<first
// element>" when a group has several), each initialised as its elements of the whole.
std::vector<GroupSpec> gpt_group_specs(const GptShape& shape, const std::vector<std::vector<uint64_t>>& parts,
                                       float init_std = 0.02f);

struct TrainOptions {
  bool resume = false;            // continue from the latest complete checkpoint
  std::string resume_from;        // continue from this step-<N> directory ("" = see resume)
  // Start from this checkpoint's weights only (fine-tuning): fresh optimizer moments,
  // step 0, the data from its start. A step-<N> directory or a checkpoint_dir (its latest
  // complete one). Excludes resume and resume_from.
  std::string init_from;
  std::string metrics_path;       // JSONL, one object per step (rank 0); "" = none
  // A write to metrics_path that fails (a full disk) warns once and the run goes on
  // without it; otherwise it stops the run after that step, with a checkpoint.
  bool metrics_optional = false;
  std::string config_path;        // the config file read, which no output may replace ("" = none)
  bool quiet = false;             // no per-step lines (tests)
  int eval_batches = 0;           // held-out batches evaluated after the last step (0 = none)
};

struct StepRecord {
  int64_t step = 0;               // optimizer steps taken after this one
  double loss = 0;                // mean over the global batch
  double lr = 0;                  // the learning rate this step ran with (scheduler)
  double seconds = 0;             // wall time of the step
  double tokens_per_s = 0;
  double mfu = 0;                 // model FLOPs / (time x measured matmul peak of all ranks)
  double exposed_s = 0;           // time the model waited for transfers in this step
  double optimizer_s = 0;         // optimizer step, waits for states included
  bool stepped = true;            // false when the step was skipped (non-finite gradients)
};

struct TrainResult {
  std::vector<StepRecord> steps;  // the steps this run took (after a resume: only those)
  int64_t first_step = 0;         // optimizer steps already taken at start (resume)
  double eval_loss = -1;          // held-out loss after the last step (-1: not evaluated, or no held-out batch)
  int eval_batches = 0;           // held-out global batches that loss is the mean of
  std::string last_checkpoint;    // "" when none was written
  int stop_signal = 0;            // SIGTERM/SIGINT/SIGUSR1 stopped the run early (0: it ran out)
  double peak_flops = 0;          // measured matmul peak, all ranks together
  EngineStats stats;              // at the end
};

// Trains for config.strata.steps optimizer steps in total (a resumed run continues to
// that number). SIGTERM, SIGINT or SIGUSR1 during the run stop it after the step in
// flight, with a checkpoint when strata.checkpoint_dir is set (stop_signal says which;
// the handlers are the caller's again on return). Throws ConfigError for bad configurations or data, OutOfBudget when the
// budgets cannot hold the model, IoError/CorruptionError for files.
// Before anything is built, with strata.checkpoint_dir set, rank 0 locks the directory for
// the run (lock_checkpoint_dir: a second run into it is refused, naming the holder's pid
// and host) and the start is decided (choose_start_checkpoint): a checkpoint_dir that is
// a checkpoint, an unwritable one, and step-<M> directories beyond the step the run
// starts from are refused then, with no step trained. So is an output (metrics, trace,
// standard output redirected to a file) that is one of the run's inputs (the config
// file, the data, the checkpoint it starts from, nvme_path) or another output
// (check_outputs_replace_no_input). A metrics write that fails stops the run after its
// step, with a checkpoint, and throws the IoError (metrics_optional: a warning).
TrainResult train(const Config& config, const TrainOptions& opts);

}  // namespace strata
