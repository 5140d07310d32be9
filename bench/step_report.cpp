// The report of `strata bench step` (bench/bench_step.cpp measures, this file tells):
// the table's columns and rows, and the notes that say what each figure is against.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "step_bench.hpp"
#include "strata/model/cpu_sgemm.hpp"

namespace strata::bench::step {

namespace {

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
              device->description() + ")" + (b.peers.empty() ? "" : ", beside its peers");
  rep.config = {{"layers", a.shape.layers},   {"d_model", a.shape.d_model}, {"heads", a.shape.heads},
                {"seq_len", a.shape.seq_len}, {"vocab", a.shape.vocab},     {"parameters", params},
                {"micro_batch", a.micro_batch}, {"gradient_accumulation_steps", a.accum},
                {"tokens_per_step", tokens},  {"reps", a.reps},             {"warmup", a.warmup}, {"lead_in", a.lead_in},
                {"activation_checkpointing", a.checkpointing}, {"cpu_checkpointing", a.cpu_checkpointing},
                {"dir", a.dir}, {"backend", a.backend},
                {"precision", precision_name(precision)}, {"nvme", a.nvme}, {"threads", threads},
                {"speculative", a.speculative},
                {"speculation_inline", a.speculation_inline}, {"state_prefetch", !a.no_state_prefetch}, {"in_place", !a.no_in_place}, {"optimizer_threads", a.optimizer_threads},
                {"fp32_beside", !sixteen || a.f32_beside}, {"peers", a.peers}};
  if (!sixteen || a.f32_beside) rep.config["matmul_peak_gflops"] = peak_of(DType::F32) / 1e9;
  if (sixteen) rep.config[std::string("matmul_peak_gflops_") + precision_name(precision)] = peak_of(precision) / 1e9;
  if (sixteen && !b.cuda) rep.config[std::string("cpu_matmul_path_") + precision_name(precision)] = cpu_matmul_path(precision);
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
  if (!b.peers.empty()) {
    if (!a.nvme) {  // a peer's storage I/O is reported even without Strata's NVMe configuration
      rep.table.columns.push_back({"nvme_read_mib", "NVMe read MiB", "%.0f"});
      rep.table.columns.push_back({"nvme_written_mib", "NVMe written MiB", "%.0f"});
    }
    rep.table.columns.push_back({"peak_host_mib", "peak host MiB", "%.0f"});
    rep.table.columns.push_back({"strata_over_peer", "Strata x peer", "%.2f"});
  }
  return rep;
}

// A peer's row: its storage I/O and peak host memory, and the tokens/s of Strata's
// matching configuration (same precision; NVMe for ZeRO-Infinity, in memory otherwise)
// over the peer's.
void peer_row(const Bench& b, const Setup& s, nlohmann::json& row) {
  const PeerKind k = b.peers[s.peer].kind;
  row["peer"] = peer_id(k);
  if (!s.nvme_read.empty() && s.nvme_read.front() >= 0) {
    row["nvme_read_mib"] = summarize(s.nvme_read).median / (1 << 20);
    row["nvme_written_mib"] = summarize(s.nvme_written).median / (1 << 20);
  }
  double peak = 0;
  for (double p : s.peak_host) peak = std::max(peak, p);
  row["peak_host_mib"] = peak / (1 << 20);
  if (const Setup* strata = b.find(peer_on_nvme(k), s.precision)) {
    row["strata_configuration"] = strata->label;
    row["strata_over_peer"] = summarize(s.seconds).median / summarize(strata->seconds).median;
  }
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
    const Setup* f32 = s.engine ? find(s.nvme, DType::F32, s.speculative, s.gpu_optimizer, s.ratio, s.cpu_checkpointing)
                       : s.peer >= 0 ? nullptr : find(false, DType::F32);
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
    if (s.peer >= 0) peer_row(b, s, row);
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
                (cuda ? "cublasGemmEx on the tensor cores" : "the cpu model's own path, " + cpu_matmul_path(precision)) +
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

// The peers: what was skipped and why, what each ran, and Strata's ratio to each.
void report_peers(const Bench& b, Report& rep) {
  if (b.peers.empty()) return;
  nlohmann::json skipped = nlohmann::json::object(), ran = nlohmann::json::object(), ratios = nlohmann::json::object();
  for (const Peer& p : b.peers) {
    if (!p.process) {
      skipped[peer_id(p.kind)] = p.skipped;
      rep.notes.push_back(peer_title(p.kind) + " skipped: " + p.skipped);
      continue;
    }
    ran[peer_id(p.kind)] = p.process->info();
  }
  for (const Setup& s : b.setups) {
    if (s.peer < 0) continue;
    const PeerKind k = b.peers[s.peer].kind;
    const Setup* strata = b.find(peer_on_nvme(k), s.precision);
    if (!strata) continue;
    const double x = summarize(s.seconds).median / summarize(strata->seconds).median;
    ratios[peer_id(k)] = x;
    char line[320];
    std::snprintf(line, sizeof line, "Strata %s: %.2fx the tokens/s of %s.", strata->label.c_str(), x, s.label.c_str());
    rep.notes.push_back(line);
  }
  if (!ran.empty()) {
    const nlohmann::json& any = ran.begin().value();
    std::string line = "peers (bench/ref/peer_gpt_step.py, one process each, world size 1, torch " +
                       any.value("torch", std::string("?")) + "): the same GPT, tokens per step and precision.";
    for (const auto& [id, info] : ran.items()) {
      if (!info.contains("deepspeed")) continue;
      line += " DeepSpeed " + info.value("deepspeed", std::string("?")) +
              ": ZeRO-3 with Strata's 16M-element sub-groups and AdamW settings, " +
              info.value("optimizer", std::string("?")) + "; ZeRO-Offload with no persistent parameters and "
              "60M-element prefetches as Strata; ZeRO-Infinity with Hugging Face's \"auto\" prefetch bucket and "
              "persistence threshold (0.9 d^2, 10 d elements), parameters released after use and 8 swap buffers "
              "(with Strata's settings DeepSpeed stops: not enough swap buffers), DeepSpeed's default aio settings, "
              "its swap files in --dir beside Strata's.";
      break;
    }
    if (ran.contains("fsdp2"))
      line += std::string(" FSDP2: fully_shard on each block and the model, MixedPrecisionPolicy (parameters in the "
                          "precision, gradients reduced in fp32), CPUOffloadPolicy, torch.optim.AdamW") +
              (b.cuda ? "." : "; on the cpu backend the offload moves nothing (the parameters live in host memory).");
    rep.notes.push_back(line);
    rep.notes.push_back("a peer's NVMe MiB is its process's storage I/O in the step (/proc/self/io read_bytes and "
                        "write_bytes: what reached the block layer, O_DIRECT aio included, page-cache hits not); "
                        "Strata's is what its store moved to and from the NVMe tier. peak host MiB: the peer "
                        "process's peak resident memory over its steps (VmHWM, restarted when it was ready).");
  }
  char own[200];
  std::snprintf(own, sizeof own, "Strata's configurations share this one process: its peak resident memory was "
                "%.0f MiB (all configurations and models together).", process_peak_resident_bytes() / (1 << 20));
  rep.notes.push_back(own);
  rep.extra["peers"] = {{"ran", ran}, {"skipped", skipped}, {"strata_tokens_per_s_over_peer", ratios}};
}

}  // namespace

Report step_report(const Bench& b) {
  Report rep = report_head(b);
  report_rows(b, rep);
  report_measures(b, rep);
  report_options(b, rep);
  report_ratios(b, rep);
  report_peers(b, rep);
  return rep;
}

}  // namespace strata::bench::step
