// `strata train`, `strata sample` and `strata eval`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "strata/bench/cli_checks.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/output_guard.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/model/data.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "cli.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/formats/export.hpp"
#include "strata/runtime/train/train.hpp"

namespace strata::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  int steps = 0;
  bool resume = false;
  std::string resume_from;
  std::string init_from;
  std::string lora_init;
  std::string metrics;
  bool metrics_optional = false;
  int eval_batches = 0;
  bool quiet = false;
} g_train;

struct SampleArgs {
  std::string checkpoint;
  std::string prompt = "\n";
  int tokens = 200;
  double temperature = 0.8;
  int top_k = 0;
  uint64_t seed = 1;
} g_sample;

struct EvalArgs {
  std::string checkpoint;
  std::string data;
  std::string format = "auto";
  int seq = 0;             // 0: the model's context
  uint64_t max_windows = 0;  // 0: all
  int batch = 8;
  std::string precision;   // "": what the run trained in
  bool heldout = false;    // the held-out windows only, as train's --eval-batches
  bool json = false;
} g_eval;

int run_train() {
  std::vector<std::string> sets = g_train.sets;
  if (g_train.steps > 0) sets.push_back("strata.steps=" + std::to_string(g_train.steps));
  if (!g_train.lora_init.empty()) sets.push_back("strata.lora.init=" + nlohmann::json(g_train.lora_init).dump());
  const Config c = load_config(g_train.config, sets);
  // Appended to for the whole run: never a device, a FIFO or a checkpoint's file.
  if (!g_train.metrics.empty()) {
    check_output_path(g_train.metrics, "--metrics");
    check_output_writable(g_train.metrics, "--metrics");
  }
  TrainOptions o;
  o.resume = g_train.resume;
  o.resume_from = g_train.resume_from;
  o.init_from = g_train.init_from;
  o.metrics_path = g_train.metrics;
  o.metrics_optional = g_train.metrics_optional;
  o.config_path = g_train.config;
  o.eval_batches = g_train.eval_batches;
  o.quiet = g_train.quiet;
  TrainResult r = train(c, o);
  if (r.stop_signal) return 128 + r.stop_signal;  // as if the signal had ended the process
  if (r.steps.empty()) std::printf("nothing to do: the checkpoint is already at step %lld of %d\n",
                                   static_cast<long long>(r.first_step), c.strata.steps);
  return 0;
}

// A checkpoint directory, or a checkpoint root (its latest complete checkpoint).
std::string resolve_checkpoint(const std::string& path) {
  try {
    read_checkpoint_info(path);
    return path;
  } catch (const Error&) {
    if (auto latest = latest_checkpoint(path)) return *latest;
    throw;
  }
}


// A checkpoint's fp32 master weights in host memory, for sample and eval. Only the
// model's shape is read from its config: a checkpoint is complete on its own, so the
// run's nvme_path, data file and budgets need not exist here (export reads it the same
// way).
struct LoadedCheckpoint {
  std::string dir;
  CheckpointInfo info;
  GptShape shape;
  DType precision = DType::F32;  // what the model computes in
  std::vector<std::vector<float>> groups;
};

// precision: f32, bf16 or fp16, or "" for the one the run trained in. The weights are
// checked to be finite and to fit it (read_checkpoint_group). `other_inputs`: what else
// the command reads, which its standard output must not be.
LoadedCheckpoint load_weights(const std::string& path, const std::string& precision,
                              std::vector<RunPath> other_inputs) {
  LoadedCheckpoint c;
  c.dir = resolve_checkpoint(path);
  for (RunPath& p : files_in(c.dir, "the checkpoint (--checkpoint)")) other_inputs.push_back(std::move(p));
  other_inputs.push_back({c.dir, "the checkpoint (--checkpoint)"});
  check_outputs_replace_no_input(other_inputs, {standard_output()});
  c.info = read_checkpoint_info(c.dir);
  c.shape = checkpoint_gpt_shape(c.info);
  c.precision = parse_precision(precision.empty() ? c.info.precision : precision);
  for (int g = 0; g < static_cast<int>(gpt_groups(c.shape).size()); ++g)
    c.groups.push_back(read_checkpoint_group(c.info, g, c.precision));
  return c;
}

int run_sample() {
  LoadedCheckpoint ck = load_weights(g_sample.checkpoint, "f32", {});
  const std::string& dir = ck.dir;
  const CheckpointInfo& info = ck.info;
  const GptShape shape = ck.shape;
  HostWeights w(std::move(ck.groups));
  Gpt model(shape, {1, ActivationCheckpointing::None});

  const bool bytes = shape.vocab == 256;
  std::vector<int32_t> ctx;
  if (bytes) {
    for (unsigned char ch : g_sample.prompt) ctx.push_back(ch);
  } else {
    // Token files carry ids of a tokenizer Strata does not have: the prompt is ids.
    size_t i = 0;
    while (i < g_sample.prompt.size()) {
      size_t used = 0;
      try {
        ctx.push_back(std::stoi(g_sample.prompt.substr(i), &used));
      } catch (const std::exception&) {  // std::invalid_argument, std::out_of_range
        throw ConfigError("--prompt '" + g_sample.prompt + "': '" + g_sample.prompt.substr(i, 20) +
                          "' is not a token id; this model reads token ids, e.g. --prompt 464,3290");
      }
      i += used;
      while (i < g_sample.prompt.size() && (g_sample.prompt[i] == ',' || g_sample.prompt[i] == ' ')) ++i;
    }
  }
  if (ctx.empty()) throw ConfigError("--prompt is empty: give at least one character");
  for (int32_t t : ctx)
    if (t < 0 || t >= shape.vocab)
      throw ConfigError("--prompt token " + std::to_string(t) + " is outside the vocabulary [0, " +
                        std::to_string(shape.vocab) + ")");
  std::mt19937_64 rng(g_sample.seed);
  std::vector<float> logits(shape.vocab);
  std::vector<double> p(shape.vocab);
  std::fprintf(stderr, "sampling from %s (step %lld)\n", dir.c_str(), static_cast<long long>(info.step));
  if (bytes) std::fwrite(g_sample.prompt.data(), 1, g_sample.prompt.size(), stdout);
  for (int n = 0; n < g_sample.tokens; ++n) {
    const int len = std::min<int>(static_cast<int>(ctx.size()), shape.seq_len);
    model.next_token_logits(w, ctx.data() + ctx.size() - len, len, logits.data());
    int next = 0;
    if (g_sample.temperature <= 0) {
      for (int v = 1; v < shape.vocab; ++v)
        if (logits[v] > logits[next]) next = v;
    } else {
      float cut = -INFINITY;
      if (g_sample.top_k > 0 && g_sample.top_k < shape.vocab) {
        std::vector<float> sorted(logits);
        std::nth_element(sorted.begin(), sorted.begin() + (g_sample.top_k - 1), sorted.end(), std::greater<>());
        cut = sorted[g_sample.top_k - 1];
      }
      const float mx = *std::max_element(logits.begin(), logits.end());
      for (int v = 0; v < shape.vocab; ++v)
        p[v] = logits[v] < cut ? 0.0 : std::exp((logits[v] - mx) / g_sample.temperature);
      std::discrete_distribution<int> pick(p.begin(), p.end());
      next = pick(rng);
    }
    ctx.push_back(next);
    if (bytes)
      std::fputc(next, stdout);
    else
      std::printf("%d ", next);
    std::fflush(stdout);
  }
  std::printf("\n");
  return 0;
}

// The mean next-token cross-entropy over the data file's windows of seq + 1 tokens at
// token offsets 0, seq, 2 seq, ... (each predicts its last seq tokens), in file order, the
// first --max-windows of them when given: the loss of every token predicted, averaged.
// A context shorter than the model's uses the first seq rows of its position table, as
// PyTorch's GPT-2 does for a shorter input. It computes in the precision the run trained in
// (the weights its masters rounded to it, 16-bit activations as in training), or --precision.
int run_eval() {
  // The trained precision by default, as --eval-batches evaluates and export writes.
  LoadedCheckpoint ck = load_weights(g_eval.checkpoint, g_eval.precision, {{g_eval.data, "--data"}});
  GptShape shape = ck.shape;
  const int seq = g_eval.seq > 0 ? g_eval.seq : shape.seq_len;
  if (seq > shape.seq_len)
    throw ConfigError("--seq " + std::to_string(seq) + " is longer than the model's context of " +
                      std::to_string(shape.seq_len) + " tokens: give --seq " + std::to_string(shape.seq_len) +
                      " or less");
  // GPT-2's group 0 is wte [vocab, d] then wpe [seq_len, d]: its first seq rows of wpe
  // remain. (Llama's positions are rotary: nothing to cut.)
  shape.seq_len = seq;
  if (!shape.llama())
    ck.groups[0].resize(static_cast<size_t>(shape.vocab + seq) * static_cast<size_t>(shape.d_model));
  const DType precision = ck.precision;
  HostWeights w(std::move(ck.groups), precision);
  // --heldout: the split training holds out (its default fraction), else every window.
  const TokenDataset data = g_eval.heldout
                                ? TokenDataset(g_eval.data, parse_data_format(g_eval.format), seq, shape.vocab, 0)
                                : TokenDataset(g_eval.data, parse_data_format(g_eval.format), seq, shape.vocab, 0, 0.0);
  const uint64_t begin = g_eval.heldout ? data.train_windows() : 0;
  const uint64_t available = g_eval.heldout ? data.heldout_windows() : data.windows();
  if (available == 0)
    throw ConfigError("--heldout: the data's held-out split has 0 windows (the last 5% of its " +
                      std::to_string(data.windows()) + " windows of " + std::to_string(seq + 1) +
                      " tokens, rounded down): nothing to evaluate; use a longer data file, or leave out --heldout");
  const uint64_t windows = g_eval.max_windows > 0 ? std::min<uint64_t>(g_eval.max_windows, available) : available;
  const int batch = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(g_eval.batch), windows));
  std::unique_ptr<Gpt> model =
      std::make_unique<Gpt>(shape, GptOptions{batch, ActivationCheckpointing::None, precision});
  std::vector<int32_t> x(static_cast<size_t>(batch) * seq), y(x.size());
  double sum = 0;  // of the per-token losses
  for (uint64_t first = 0; first < windows; first += static_cast<uint64_t>(batch)) {
    const int n = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(batch), windows - first));
    if (n != model->options().micro_batch)  // the last, shorter batch
      model = std::make_unique<Gpt>(shape, GptOptions{n, ActivationCheckpointing::None, precision});
    for (int i = 0; i < n; ++i)
      data.window(begin + first + i, x.data() + static_cast<size_t>(i) * seq, y.data() + static_cast<size_t>(i) * seq);
    sum += model->forward_loss(w, x.data(), y.data()) * n * seq;
  }
  const uint64_t tokens = windows * static_cast<uint64_t>(seq);
  const double loss = sum / static_cast<double>(tokens);
  if (g_eval.json) {
    std::printf("{\"loss\": %.17g, \"windows\": %llu, \"tokens\": %llu, \"precision\": \"%s\", \"heldout\": %s}\n",
                loss, static_cast<unsigned long long>(windows), static_cast<unsigned long long>(tokens),
                precision_name(precision), g_eval.heldout ? "true" : "false");
  } else {
    std::printf("eval of %s (step %lld) on %s in %s: loss %.6f over %llu %swindows of %d tokens (%llu tokens "
                "predicted)\n",
                ck.dir.c_str(), static_cast<long long>(ck.info.step), g_eval.data.c_str(), precision_name(precision),
                loss, static_cast<unsigned long long>(windows), g_eval.heldout ? "held-out " : "", seq + 1,
                static_cast<unsigned long long>(tokens));
  }
  return 0;
}

}  // namespace

void add_train(CLI::App& app) {
  auto* t = app.add_subcommand("train", "Train the GPT under the ZeRO engine (one process, or one per rank under mpirun)");
  t->add_option("--config,-c", g_train.config, "JSON configuration (DeepSpeed keys plus a strata section)")
      ->required()
      ->check(CLI::ExistingFile);
  t->add_option("--set", g_train.sets, "Override a key: --set strata.steps=50 (repeatable)");
  t->add_flag_callback("--list-keys", [] { std::fputs(config_keys_text().c_str(), stdout); throw CLI::Success(); },
                       "Print every config key with what it accepts, its default and meaning, and exit");
  t->add_option("--steps", g_train.steps, "Total optimizer steps (overrides strata.steps)")->check(cli_checks::at_least(1));
  auto* resume = t->add_flag("--resume", g_train.resume,
                             "Continue from the latest complete checkpoint in strata.checkpoint_dir");
  auto* resume_from = t->add_option("--resume-from", g_train.resume_from,
                "Continue from this checkpoint (a step-<N> directory); new checkpoints go to strata.checkpoint_dir")
      ->excludes(resume);
  t->add_option("--init-from", g_train.init_from,
                "Start from this checkpoint's weights (fine-tuning: fresh optimizer, step 0; e.g. one strata import "
                "wrote); a step-<N> directory or a directory of checkpoints (its latest)")
      ->excludes(resume)
      ->excludes(resume_from);
  t->add_option("--lora-init", g_train.lora_init,
                "Start strata.lora's adapters from this peft adapter directory (adapter_config.json and "
                "adapter_model.safetensors; its r, lora_alpha and target_modules must be strata.lora's); sets "
                "strata.lora.init")
      ->excludes(resume)
      ->excludes(resume_from);
  t->add_option("--metrics", g_train.metrics, "Append one JSON object per step to this file (rank 0)");
  t->add_flag("--metrics-optional", g_train.metrics_optional,
              "A --metrics write that fails (a full disk) warns once and the run goes on without it, instead of "
              "stopping the run");
  t->add_option("--eval-batches", g_train.eval_batches,
                "Held-out batches to evaluate after the last step (printed, and recorded in --metrics)")
      ->check(cli_checks::at_least(0));
  t->add_flag("--quiet", g_train.quiet, "No per-step lines");
  t->callback([] { selected() = run_train; });

  auto* s = app.add_subcommand("sample", "Generate text from a checkpoint");
  s->add_option("--checkpoint", g_sample.checkpoint, "A checkpoint directory, or the root holding several (latest used)")
      ->required();
  s->add_option("--prompt", g_sample.prompt, "Text to continue (byte-level models) or comma-separated token ids");
  s->add_option("--tokens", g_sample.tokens, "Tokens to generate")->check(cli_checks::at_least(1));
  s->add_option("--temperature", g_sample.temperature, "Softmax temperature; 0 = greedy")->check(cli_checks::finite_non_negative());
  s->add_option("--top-k", g_sample.top_k, "Sample among the k most likely tokens (0 = all)")->check(cli_checks::at_least(0));
  s->add_option("--seed", g_sample.seed, "Sampling seed");
  s->callback([] { selected() = run_sample; });

  auto* e = app.add_subcommand("eval", "Mean next-token loss of a checkpoint on a data file");
  e->add_option("--checkpoint", g_eval.checkpoint, "A checkpoint directory, or the root holding several (latest used)")
      ->required();
  e->add_option("--data", g_eval.data, "Data file (text or llm.c tokens, as strata.data)")->required();
  e->add_option("--format", g_eval.format, "auto, text or tokens")->capture_default_str();
  e->add_option("--seq", g_eval.seq, "Tokens predicted per window (default: the model's context)")
      ->check(cli_checks::at_least(1));
  e->add_option("--max-windows", g_eval.max_windows, "Evaluate the first N windows only (default: all)")
      ->check(cli_checks::at_least(1));
  e->add_option("--batch", g_eval.batch, "Windows per forward pass")->capture_default_str()->check(cli_checks::at_least(1));
  e->add_option("--precision", g_eval.precision, "f32, bf16 or fp16 (default: the precision the run trained in)");
  e->add_flag("--heldout", g_eval.heldout,
              "Only the held-out windows (the last 5%, never trained on): those train --eval-batches scores");
  e->add_flag("--json", g_eval.json, "Print {\"loss\": ..., \"windows\": ..., \"tokens\": ...}");
  e->callback([] { selected() = run_eval; });
}

}  // namespace strata::cli
