// `strata plan`: bytes per tier, fit, link loads, step time and bottleneck for a model on a
// cluster under a strategy; --search over strategies; --simulate with the real engine on
// the sim backend (runtime/plan.hpp, docs/plan.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/core/byte_count.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "cli.hpp"

#include "strata/runtime/plan/plan.hpp"

namespace strata::cli {

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;

// Rates and factors: "25GB/s", "125T", "12e9", "0.5", "-3": a number with an optional
// decimal (K, M, G, T, P) or binary (Ki, Mi, Gi, Ti) multiplier and an optional unit ("B",
// "B/s", "FLOPS", "FLOP/s"). Negative values pass, so that validate() can name them. The
// figures that are sizes (--hbm, ...) are byte counts, read by parse_byte_count as every
// size flag and key is.
// Element counts are unsigned: CLI11 would wrap "-5" around to 2^64 - 5.
const CLI::Validator kElements(
    [](std::string& v) {
      return v.find_first_not_of(" \t") != std::string::npos && v[v.find_first_not_of(" \t")] == '-'
                 ? std::string("must be a whole number of elements, 0 or more, not ") + v
                 : std::string();
    },
    "ELEMENTS>=0");

double parse_quantity(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw ConfigError(flag + " '" + text + "' is not a number; give e.g. 32GiB, 25GB/s or 125e12");
  }
  std::string rest = text.substr(pos);
  for (const char* unit : {"B/s", "FLOP/s", "FLOPS", "B"})
    if (rest.size() >= std::strlen(unit) && rest.compare(rest.size() - std::strlen(unit), std::string::npos, unit) == 0) {
      rest.resize(rest.size() - std::strlen(unit));
      break;
    }
  static const std::pair<const char*, double> mult[] = {
      {"", 1},          {"K", 1e3},  {"M", 1e6},  {"G", 1e9},  {"T", 1e12}, {"P", 1e15},
      {"Ki", 1024.0}, {"Mi", 1024.0 * 1024}, {"Gi", GiB}, {"Ti", GiB * 1024}};
  for (const auto& [s, m] : mult)
    if (rest == s) return v * m;
  throw ConfigError(flag + " '" + text + "': unknown unit '" + rest + "'; use K, M, G, T, P (powers of 1000) or Ki, Mi, "
                    "Gi, Ti (powers of 1024), optionally followed by B or B/s");
}

bool is_byte_count_figure(const std::string& flag) {
  return flag == "--hbm" || flag == "--device-reserve" || flag == "--host-ram" || flag == "--nvme-capacity";
}

OffloadDevice parse_offload(const std::string& flag, const std::string& v) {
  if (v == "none") return OffloadDevice::None;
  if (v == "cpu") return OffloadDevice::Cpu;
  if (v == "nvme") return OffloadDevice::Nvme;
  throw ConfigError(flag + " '" + v + "' is not an offload target; give none, cpu or nvme");
}

struct PlanArgs {
  std::string model = "gpt-1.3b";
  std::optional<int> layers, d_model, heads, seq, vocab;
  std::string cluster = "dgx-2";
  std::optional<int> gpus_per_node, nodes;
  std::map<std::string, std::string> figures;  // flag -> text, applied over the preset
  std::string nvme_dir;
  int stage = 3;
  std::string offload_param = "none", offload_optimizer = "cpu";
  int micro_batch = 1, grad_accum = 1, prefetch_groups = 2;
  uint64_t sub_group = 0;
  std::string precision = "f32";
  bool no_checkpointing = false;
  bool cpu_checkpointing = false;
  int tile_factor = 1;
  uint64_t tile_size = 0;
  uint64_t bucket_elems = 0;
  bool speculative = false;
  double optimizer_ratio = 1.0;
  double frozen_fraction = 0.0;
  int mics_shard_size = 0;
  int hpz = 1;
  bool qwz = false, qgz = false;
  int quantized_block = 256;
  bool search = false, simulate = false, json = false;
  int simulate_steps = 3;
  bool largest = false;
  int layer_step = 1, max_layers = plan::kMaxLadderLayers;
};

std::string gib(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, b >= 1000 * GiB ? "%.0f GiB" : b >= 10 * GiB ? "%.1f GiB" : "%.2f GiB", b / GiB);
  return buf;
}
std::string secs(double s) {
  char buf[64];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}
std::string gbs(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GB/s", b / 1e9);
  return buf;
}

nlohmann::json tier_json(const plan::TierPlan& t) {
  return {{"tier", to_string(t.tier)},
          {"params", t.need.params},
          {"grads", t.need.grads},
          {"optimizer", t.need.optimizer},
          {"activations", t.need.activations},
          {"buffers", t.need.buffers},
          {"total", t.need.total()},
          {"budget", t.budget},
          {"fits", t.fits()},
          {"short_by", t.short_by()}};
}

nlohmann::json plan_json(const plan::Plan& p) {
  nlohmann::json j;
  j["model"] = model_json(p.shape);
  j["model"]["params"] = p.params;
  const plan::ClusterSpec& c = p.cluster;
  j["cluster"] = {{"name", c.name}, {"description", c.description}, {"gpus_per_node", c.gpus_per_node},
                  {"nodes", c.nodes}, {"hbm", c.hbm}, {"device_reserve", c.device_reserve},
                  {"gpu_flops", c.gpu_flops}, {"matmul_efficiency", c.matmul_efficiency},
                  {"hbm_bandwidth", c.hbm_bandwidth}, {"host_ram", c.host_ram}, {"host_bandwidth", c.host_bandwidth},
                  {"nvme_capacity", c.nvme_capacity}, {"nvme_read", c.nvme_read}, {"nvme_write", c.nvme_write},
                  {"pcie", c.pcie}, {"intra_node", c.intra_node}, {"network", c.network}, {"measured", c.measured}};
  const plan::Strategy& s = p.strategy;
  j["strategy"] = {{"stage", s.stage}, {"offload_param", to_string(s.offload_param)},
                   {"offload_optimizer", to_string(s.offload_optimizer)}, {"micro_batch", s.micro_batch},
                   {"grad_accum", s.grad_accum}, {"checkpointing", s.checkpointing},
                   {"checkpoints", s.checkpointing ? to_string(s.checkpoints) : "none"},
                   {"speculative", s.speculative}, {"optimizer_ratio", s.optimizer_ratio},
                   {"frozen_fraction", s.frozen_fraction},
                   {"mics_shard_size", s.mics_shard_size}, {"hpz", s.hpz},
                   {"quantized_weights", s.qwz}, {"quantized_gradients", s.qgz},
                   {"quantized_block", s.quantized_block},
                   {"prefetch_groups", s.prefetch_groups}, {"sub_group_elems", p.engine.sub_group_elems},
                   {"tile_factor", s.tile_factor}, {"tile_size", s.tile_size}, {"bucket_elems", s.part_elems}, {"describe", s.describe()}};
  j["world"] = p.world;
  for (const auto& t : p.tiers) j["tiers"].push_back(tier_json(t));
  j["fits"] = p.fits;
  j["problems"] = p.problems;
  j["time"] = {{"compute_s", p.compute_s}, {"forward_s", p.forward_s}, {"backward_s", p.backward_s},
               {"optimizer_s", p.optimizer_s}, {"boundary_s", p.boundary_s}, {"step_s", p.step_s},
               {"exposed_s", p.exposed_s}};
  j["tokens_per_step"] = p.tokens_per_step;
  j["tokens_per_s"] = p.tokens_per_s;
  j["collective_bytes"] = {{"shard", p.shard_collective_bytes},
                           {"replicas", p.replica_collective_bytes},
                           {"secondary", p.secondary_collective_bytes},
                           {"node", p.node_collective_bytes},
                           {"cross", p.cross_collective_bytes},
                           {"inter_node", p.inter_node_bytes}};
  j["notes"] = p.notes;
  j["mfu"] = p.mfu;
  for (const auto& l : p.links)
    j["links"].push_back({{"name", l.name}, {"bytes", l.bytes}, {"bandwidth", l.bandwidth}, {"busy_s", l.busy_s},
                          {"window_s", l.window_s}, {"needed", l.needed}});
  j["bottleneck"] = p.bottleneck;
  j["resolved_layout"] = p.resolved.describe();  // the engine's decisions, as bench step prints them
  // The budgets strata train is given for this plan (strata.device_budget, strata.pinned_budget).
  j["engine_budgets"] = {{"device", p.engine.store.device_budget}, {"pinned", p.engine.store.pinned_budget}};
  return j;
}

void print_plan(const plan::Plan& p) {
  const plan::ClusterSpec& c = p.cluster;
  std::printf("model    %s: %.4g parameters\n", describe(p.shape).c_str(), double(p.params));
  std::printf("cluster  %s: %s\n         %d node(s) x %d GPU(s) = %d ranks; %s HBM, %.4g TFLOP/s x %.2f per GPU\n",
              c.name.c_str(), c.description.c_str(), c.nodes, c.gpus_per_node, p.world, gib(c.hbm).c_str(),
              c.gpu_flops / 1e12, c.matmul_efficiency);
  for (const auto& m : c.measured) std::printf("         measured: %s\n", m.c_str());
  std::printf("strategy %s\n\n", p.strategy.describe().c_str());
  std::printf("per rank    %12s %12s %12s %12s %12s %12s %12s  %s\n", "params", "gradients", "optimizer", "activations",
              "buffers", "total", "budget", "fits");
  for (const auto& t : p.tiers) {
    std::printf("%-11s %12s %12s %12s %12s %12s %12s %12s  %s\n", to_string(t.tier), gib(t.need.params).c_str(),
                gib(t.need.grads).c_str(), gib(t.need.optimizer).c_str(), gib(t.need.activations).c_str(),
                gib(t.need.buffers).c_str(), gib(t.need.total()).c_str(), gib(t.budget).c_str(),
                t.fits() ? "yes" : ("SHORT by " + gib(t.short_by())).c_str());
  }
  std::printf("\n");
  if (p.fits) {
    std::printf("fits: yes\n");
  } else {
    std::printf("fits: NO\n");
    for (const auto& pr : p.problems) std::printf("  - %s\n", pr.c_str());
  }
  std::printf("\nlinks (per rank, per step)  %12s %12s %12s %14s\n", "bytes", "available", "busy", "to hide");
  for (const auto& l : p.links)
    std::printf("  %-25s %12s %12s %12s %14s\n", l.name.c_str(), gib(l.bytes).c_str(), gbs(l.bandwidth).c_str(),
                secs(l.busy_s).c_str(), l.window_s > 0 ? gbs(l.needed).c_str() : "-");
  std::printf("  collectives sent per rank: %s over the shard's ranks, %s across MiCS groups, %s within hpZ "
              "groups; %s of it between nodes\n",
              gib(p.shard_collective_bytes).c_str(), gib(p.replica_collective_bytes).c_str(),
              gib(p.secondary_collective_bytes).c_str(), gib(p.inter_node_bytes).c_str());
  if (p.node_collective_bytes + p.cross_collective_bytes > 0)
    std::printf("  qgZ's reduce-scatters in two hops: %s within the node, %s across the nodes\n",
                gib(p.node_collective_bytes).c_str(), gib(p.cross_collective_bytes).c_str());
  for (const auto& n : p.notes) std::printf("  note: %s\n", n.c_str());
  std::printf("\nstep (predicted)  %s: forward %s, backward %s, optimizer %s%s\n", secs(p.step_s).c_str(),
              secs(p.forward_s).c_str(), secs(p.backward_s).c_str(), secs(p.optimizer_s).c_str(),
              p.boundary_s > 0 ? (", stage 1/2 reduction and refresh " + secs(p.boundary_s)).c_str() : "");
  std::printf("  compute %s, exposed transfers %s\n", secs(p.compute_s).c_str(), secs(p.exposed_s).c_str());
  std::printf("  %.4g tokens/step, %.4g tokens/s, MFU %.1f%%\n", p.tokens_per_step, p.tokens_per_s, 100 * p.mfu);
  std::printf("bottleneck: %s\n", p.bottleneck.c_str());
  // What the engine would run (resolve.hpp), in the form bench step prints it too.
  std::printf("\n%s", p.resolved.describe().c_str());
}

nlohmann::json sim_json(const plan::SimulateReport& r, const plan::Plan& p) {
  nlohmann::json j;
  j["steps"] = r.steps;
  j["step_s"] = r.step_s;
  j["step_s_steady"] = r.step_s_steady;
  j["compute_s"] = r.compute_s;
  j["exposed_s"] = r.exposed_s;
  j["optimizer_s"] = r.optimizer_s;
  for (int t = 0; t < kTierCount; ++t)
    j["tiers"].push_back({{"tier", to_string(Tier(t))}, {"peak", r.peak[t]}, {"budget", r.budget[t]}});
  j["bytes_moved_last_step"] = r.bytes_moved;  // [from][to], tiers device, pinned, nvme
  j["device_budget_less_activations"] = r.device_budget_less_activations;
  j["wall_s"] = r.wall_s;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["device"] = r.device;
  j["analytic_over_simulated"] = p.step_s / r.step_s_steady;
  return j;
}

void print_sim(const plan::SimulateReport& r, const plan::Plan& p) {
  std::printf("\nsimulated (real engine on the sim backend, rank 0 of %d, %d steps; %s)\n", p.world, r.steps,
              r.device.c_str());
  std::printf("  the device budget given to the engine is the HBM less %s of reserve and %s of activations,\n"
              "  which the simulated model does not allocate\n",
              gib(p.cluster.device_reserve).c_str(), gib(r.device_budget_less_activations).c_str());
  std::printf("  steps:");
  for (double s : r.step_s) std::printf(" %s", secs(s).c_str());
  std::printf("\n  last step %s: compute %s, exposed waits %s, optimizer %s\n", secs(r.step_s_steady).c_str(),
              secs(r.compute_s).c_str(), secs(r.exposed_s).c_str(), secs(r.optimizer_s).c_str());
  const auto& m = r.bytes_moved;
  std::printf("  moved in the last step: nvme read %s, nvme write %s, h2d %s, d2h %s\n", gib(double(m[2][1])).c_str(),
              gib(double(m[1][2])).c_str(), gib(double(m[1][0])).c_str(), gib(double(m[0][1])).c_str());
  for (int t = 0; t < kTierCount; ++t)
    std::printf("  %-7s peak %12s of %12s budget%s\n", to_string(Tier(t)), gib(double(r.peak[t])).c_str(),
                gib(double(r.budget[t])).c_str(), r.peak[t] > r.budget[t] ? "  OVER BUDGET" : "");
  std::printf("  analytic / simulated step time: %.3f (%s vs %s)\n", p.step_s / r.step_s_steady, secs(p.step_s).c_str(),
              secs(r.step_s_steady).c_str());
  std::printf("  simulator: %.2f s real time, peak host memory %s (getrusage, the whole process)\n", r.wall_s,
              gib(r.peak_rss_bytes).c_str());
}

// The model: a preset with the flags' changes.
GptShape plan_shape(const PlanArgs& a) {
  GptShape shape = plan::find_model_preset(a.model).shape;
  if (a.layers) shape.layers = *a.layers;
  if (a.d_model) shape.d_model = *a.d_model;
  if (a.heads) shape.heads = *a.heads;
  if (a.seq) shape.seq_len = *a.seq;
  if (a.vocab) shape.vocab = *a.vocab;
  for (auto [v, flag] : {std::pair{shape.layers, "--layers"}, {shape.d_model, "--d-model"}, {shape.heads, "--heads"},
                         {shape.seq_len, "--seq"}, {shape.vocab, "--vocab"}})
    if (v < 1) throw ConfigError(std::string(flag) + " must be at least 1, not " + std::to_string(v));
  validate(shape);
  return shape;
}

// The cluster: a preset, or this machine measured (cpu), with the flags' figures.
plan::ClusterSpec plan_cluster(const PlanArgs& a, const GptShape& shape) {
  plan::ClusterSpec c = a.cluster == "cpu" ? plan::measure_cpu(shape, a.nvme_dir, a.micro_batch)
                                           : plan::find_cluster_preset(a.cluster, a.nvme_dir);
  if (a.gpus_per_node) c.gpus_per_node = *a.gpus_per_node;
  if (a.nodes) c.nodes = *a.nodes;
  for (const auto& [flag, text] : a.figures) {
    const double v = is_byte_count_figure(flag) ? static_cast<double>(parse_byte_count(text, flag))
                                                : parse_quantity(flag, text);
    if (flag == "--hbm") c.hbm = v;
    else if (flag == "--device-reserve") c.device_reserve = v;
    else if (flag == "--hbm-bw") c.hbm_bandwidth = v;
    else if (flag == "--gpu-flops") c.gpu_flops = v;
    else if (flag == "--matmul-efficiency") c.matmul_efficiency = v;
    else if (flag == "--host-ram") c.host_ram = v;
    else if (flag == "--host-bw") c.host_bandwidth = v;
    else if (flag == "--nvme-capacity") c.nvme_capacity = v;
    else if (flag == "--nvme-read-bw") c.nvme_read = v;
    else if (flag == "--nvme-write-bw") c.nvme_write = v;
    else if (flag == "--pcie-bw") c.pcie = v;
    else if (flag == "--intra-node-bw") c.intra_node = v;
    else if (flag == "--network-bw") c.network = v;
  }
  if (!a.figures.empty()) c.name += " (with overrides)";
  plan::validate(c);
  return c;
}

// The strategy, as the flags give it.
plan::Strategy plan_strategy(const PlanArgs& a) {
  plan::Strategy st;
  st.stage = a.stage;
  st.offload_param = parse_offload("--offload-param", a.offload_param);
  st.offload_optimizer = parse_offload("--offload-optimizer", a.offload_optimizer);
  st.micro_batch = a.micro_batch;
  st.grad_accum = a.grad_accum;
  st.checkpointing = !a.no_checkpointing;
  st.checkpoints = a.cpu_checkpointing ? OffloadDevice::Cpu : OffloadDevice::None;
  st.tile_factor = a.tile_factor;
  st.tile_size = a.tile_size;
  st.part_elems = a.bucket_elems;
  st.speculative = a.speculative;
  st.optimizer_ratio = a.optimizer_ratio;
  st.frozen_fraction = a.frozen_fraction;
  st.mics_shard_size = a.mics_shard_size;
  st.hpz = a.hpz;
  st.qwz = a.qwz;
  st.qgz = a.qgz;
  st.quantized_block = a.quantized_block;
  st.prefetch_groups = a.prefetch_groups;
  st.sub_group_elems = a.sub_group;
  st.precision = parse_precision(a.precision);
  plan::validate(st);
  return st;
}

nlohmann::json rung_json(const plan::LadderRung& r) {
  nlohmann::json j = {{"rung", r.rung},         {"layers", r.shape.layers}, {"params", r.params},
                      {"fits", r.fits},         {"binding", r.binding},     {"step_s", r.plan.step_s},
                      {"model", model_json(r.shape)}};
  j["engine_budgets"] = {{"device", r.plan.engine.store.device_budget}, {"pinned", r.plan.engine.store.pinned_budget}};
  for (const auto& t : r.plan.tiers) j["tiers"].push_back(tier_json(t));
  return j;
}

// --largest: the ladder at the model's width, the rungs planned, the answer and its next rung.
int run_largest(const PlanArgs& a, const GptShape& width, const plan::ClusterSpec& c, const plan::Strategy& st) {
  if (a.layers) throw ConfigError("--largest walks the layers (rung k has k x --layer-step): drop --layers");
  if (a.search || a.simulate) throw ConfigError("--largest plans one strategy per rung: drop --search and --simulate");
  const plan::LargestFit f = plan::largest_fit(width, c, st, a.layer_step, a.max_layers);
  std::vector<plan::LadderRung> rungs = f.probed;
  std::sort(rungs.begin(), rungs.end(), [](const auto& x, const auto& y) { return x.rung < y.rung; });
  if (a.json) {
    nlohmann::json out;
    out["ladder"] = {{"width", model_json(width)}, {"layer_step", f.layer_step}, {"max_layers", f.max_layers}};
    out["cluster"] = c.name;
    out["strategy"] = st.describe();
    for (const auto& r : rungs) out["probed"].push_back(rung_json(r));
    out["largest"] = f.largest >= 0 ? rung_json(f.probed[f.largest]) : nlohmann::json();
    out["next"] = f.next >= 0 ? rung_json(f.probed[f.next]) : nlohmann::json();
    out["bounded"] = f.bounded();
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("ladder   %s, layers in steps of %d up to %d\ncluster  %s\nstrategy %s\n\n", describe(width).c_str(),
                f.layer_step, f.max_layers, c.name.c_str(), st.describe().c_str());
    std::printf("  %6s %12s %6s  %s\n", "layers", "parameters", "fits", "binding");
    for (const auto& r : rungs)
      std::printf("  %6d %12.4g %6s  %s\n", r.shape.layers, double(r.params), r.fits ? "yes" : "no", r.binding.c_str());
    if (f.largest >= 0) {
      const plan::LadderRung& r = f.probed[f.largest];
      std::printf("\nlargest: %d layers, %.4g parameters (%s); binding: %s\n", r.shape.layers, double(r.params),
                  describe(r.shape).c_str(), r.binding.c_str());
      if (f.bounded())
        std::printf("every rung up to --max-layers %d fits: the largest is at least this\n", f.max_layers);
      else
        std::printf("next rung: %d layers, %.4g parameters, does not fit: %s\n", f.probed[f.next].shape.layers,
                    double(f.probed[f.next].params), f.probed[f.next].binding.c_str());
    }
  }
  if (f.largest < 0) {
    std::fflush(stdout);
    std::fprintf(stderr, "strata: not even %d layer(s) of this width fit %s: %s. Give a smaller --d-model, a "
                 "--layer-step below %d, or offload more (--offload-param, --offload-optimizer)\n",
                 f.layer_step, c.name.c_str(), f.probed.front().binding.c_str(), f.layer_step);
    return 3;
  }
  return 0;
}

int run_plan(const PlanArgs& a) {
  const GptShape shape = plan_shape(a);
  const plan::ClusterSpec c = plan_cluster(a, shape);
  const plan::Strategy st = plan_strategy(a);
  if (a.largest) return run_largest(a, shape, c, st);

  nlohmann::json out;
  plan::Plan chosen;
  if (a.search) {
    std::vector<plan::Candidate> cands = plan::search(shape, c, st);
    if (!a.json) {
      std::printf("search: %zu strategies for %.4g parameters on %s (%d ranks)\n\n", cands.size(),
                  double(cands.front().plan.params), c.name.c_str(), c.world());
      int width = 66;  // the longest strategy's description
      for (const auto& k : cands) width = std::max(width, static_cast<int>(k.strategy.describe().size()));
      std::printf("  %-*s %12s %8s  %s\n", width, "strategy", "step", "MFU", "verdict");
      for (const auto& k : cands)
        std::printf("  %-*s %12s %7.1f%%  %s\n", width, k.strategy.describe().c_str(),
                    k.plan.fits ? secs(k.plan.step_s).c_str() : "-", k.plan.fits ? 100 * k.plan.mfu : 0.0,
                    k.verdict.c_str());
    }
    for (const auto& k : cands) out["search"].push_back({{"strategy", k.strategy.describe()}, {"fits", k.plan.fits},
                                                         {"step_s", k.plan.step_s}, {"tokens_per_s", k.plan.tokens_per_s},
                                                         {"mfu", k.plan.mfu}, {"verdict", k.verdict}});
    if (!cands.front().plan.fits) {
      if (a.json) std::cout << out.dump(2) << "\n";
      std::fflush(stdout);
      std::fprintf(stderr,
                   "strata: no strategy fits %.4g parameters on %s; the nearest is '%s': %s. Add GPUs or nodes "
                   "(--nodes), host RAM or NVMe.\n",
                   double(cands.front().plan.params), c.name.c_str(), cands.front().strategy.describe().c_str(),
                   cands.front().plan.problems.empty() ? "" : cands.front().plan.problems.front().c_str());
      return 3;
    }
    chosen = plan::make_plan(shape, c, cands.front().strategy);  // search keeps candidates without their layouts
    if (!a.json) std::printf("\nthe chosen strategy:\n\n");
  } else {
    chosen = plan::make_plan(shape, c, st);
  }
  out["plan"] = plan_json(chosen);
  if (!a.json) print_plan(chosen);
  if (a.simulate) {
    if (!chosen.fits) {
      std::fflush(stdout);
      std::fprintf(stderr, "strata: not simulating: the configuration does not fit (%s)\n",
                   chosen.problems.front().c_str());
    } else {
      if (!a.json) {
        std::printf("\nsimulating...\n");
        std::fflush(stdout);
      }
      plan::SimulateReport r = plan::simulate_plan(chosen, a.simulate_steps);
      out["simulate"] = sim_json(r, chosen);
      if (!a.json) print_sim(r, chosen);
    }
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  return chosen.fits ? 0 : 3;
}

}  // namespace

void add_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* p = app.add_subcommand("plan", "Plan a run: bytes per tier, fit, link loads, step time, bottleneck");
  std::string models, clusters;
  for (const auto& m : plan::model_presets()) models += (models.empty() ? "" : ", ") + m.name;
  for (const auto& c : plan::cluster_presets()) clusters += (clusters.empty() ? "" : ", ") + c.name;
  p->add_option("--model", args->model, "model preset: " + models)->capture_default_str();
  p->add_option("--layers", args->layers, "transformer blocks (overrides the preset)");
  p->add_option("--d-model", args->d_model, "hidden size");
  p->add_option("--heads", args->heads, "attention heads");
  p->add_option("--seq", args->seq, "sequence length (context)");
  p->add_option("--vocab", args->vocab, "vocabulary size");
  p->add_option("--cluster", args->cluster, "cluster preset: " + clusters)->capture_default_str();
  p->add_option("--gpus-per-node", args->gpus_per_node, "GPUs (ranks) per node");
  p->add_option("--nodes", args->nodes, "nodes");
  for (const char* f : {"--hbm", "--device-reserve", "--hbm-bw", "--gpu-flops", "--matmul-efficiency", "--host-ram",
                        "--host-bw", "--nvme-capacity", "--nvme-read-bw", "--nvme-write-bw", "--pcie-bw",
                        "--intra-node-bw", "--network-bw"}) {
    const std::string flag = f;
    p->add_option_function<std::string>(
        flag, [args, flag](const std::string& v) { args->figures[flag] = v; },
        is_byte_count_figure(flag) ? std::string("cluster figure in bytes (e.g. 32GiB; ") + kByteCountUnits + ")"
                                   : std::string("cluster figure (e.g. 25GB/s, 125T: K, M, G, T, P in powers of 1000; Ki, Mi, Gi, Ti of 1024)"));
  }
  p->add_option("--nvme-dir", args->nvme_dir, "cpu cluster: a directory whose disk is measured as the NVMe tier");
  p->add_option("--stage", args->stage, "ZeRO stage 1, 2 or 3")->capture_default_str();
  p->add_option("--offload-param", args->offload_param, "none, cpu or nvme (stage 3)")->capture_default_str();
  p->add_option("--offload-optimizer", args->offload_optimizer, "none, cpu or nvme")->capture_default_str();
  p->add_option("--micro-batch", args->micro_batch, "sequences per rank per micro-step")->capture_default_str();
  p->add_option("--grad-accum", args->grad_accum, "micro-steps per optimizer step")->capture_default_str();
  p->add_flag("--no-checkpointing", args->no_checkpointing, "keep every block's activations (no recompute)");
  p->add_flag("--cpu-checkpointing", args->cpu_checkpointing,
              "activation_checkpointing.cpu_checkpointing: the checkpoints in pinned memory between forward and "
              "backward (on NVMe when pinned memory is short and params or optimizer are on nvme)");
  p->add_option("--tile-factor", args->tile_factor,
                "strata.tile_factor: every block linear gathered and computed in this many tiles of output rows "
                "(stage 3)")
      ->capture_default_str();
  p->add_option("--tile-size", args->tile_size,
                "strata.tile_size: block linears larger than this many elements gathered and computed in the fewest "
                "tiles of output rows of at most that many (0: off; stage 3)")
      ->check(kElements)
      ->capture_default_str();
  p->add_option("--bucket-elems", args->bucket_elems,
                "zero_optimization.stage3_prefetch_bucket_size as a gather bound: blocks larger than this many "
                "elements are gathered in parts of at most that many (0: whole blocks)")
      ->check(kElements)
      ->capture_default_str();
  p->add_flag("--speculative", args->speculative,
              "the speculative optimizer (strata.speculative_optimizer): sub-groups stepped during the last "
              "backward pass, a second set of optimizer states");
  p->add_option("--optimizer-ratio", args->optimizer_ratio,
                "offload_optimizer.ratio: the fraction of the optimizer states on --offload-optimizer (CPU Adam); the "
                "rest stay on the GPUs and step there at the same time")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  p->add_option("--frozen-fraction", args->frozen_fraction,
                "the fraction of the parameters that is frozen (not trained: 0.99 for a LoRA-like run); frozen "
                "parameters hold their working weights alone, no gradient, master weights or optimizer states")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  p->add_option("--mics-shard-size", args->mics_shard_size,
                 "MiCS (zero_optimization.mics_shard_size): the states sharded within groups of this many ranks, "
                 "replicated across them (0: over every rank)")
      ->capture_default_str();
  p->add_option("--hpz", args->hpz,
                "ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size, stage 3): a secondary partition of the "
                "parameters over this many ranks of a node (1: off)")
      ->capture_default_str();
  p->add_flag("--quantized-weights", args->qwz,
              "ZeRO++ qwZ (zero_optimization.zero_quantized_weights, stage 3): the gathers from the primary shards "
              "as int8 blocks");
  p->add_flag("--quantized-gradients", args->qgz,
              "ZeRO++ qgZ (zero_optimization.zero_quantized_gradients, stages 2 and 3): the reduce-scatters as int8 "
              "all-to-alls, within the node then across the nodes");
  p->add_option("--quantized-block", args->quantized_block,
                "elements per int8 block of qwZ and qgZ, each with an fp32 scale (strata.quantized_weights_block, "
                "strata.quantized_gradients_block)")
      ->capture_default_str();
  p->add_option("--prefetch-groups", args->prefetch_groups, "gathered groups ahead of use")->capture_default_str();
  p->add_option("--sub-group", args->sub_group, "optimizer sub-group, elements (0: chosen)")
      ->check(kElements);
  p->add_option("--precision", args->precision, "working parameters and gradients: f32, bf16 or fp16")
      ->capture_default_str();
  p->add_flag("--search", args->search, "find the fastest strategy that fits, and say why the others lost");
  p->add_flag("--simulate", args->simulate, "also run the real engine on the sim backend for this configuration");
  p->add_option("--simulate-steps", args->simulate_steps, "optimizer steps to simulate")->capture_default_str();
  p->add_flag("--largest", args->largest,
              "the largest model of --model's width that fits: every field but the depth kept (d_model, heads, "
              "kv_heads, ffn, vocab, seq; the family), rung k has k x --layer-step layers; doubling then bisection "
              "finds the rung that fits whose next rung does not; prints its layers, parameters and binding tier");
  p->add_option("--layer-step", args->layer_step, "--largest: layers per rung of the ladder")->capture_default_str();
  p->add_option("--max-layers", args->max_layers, "--largest: the deepest rung tried")->capture_default_str();
  p->add_flag("--json", args->json, "JSON instead of tables");
  p->callback([args] { selected() = [args] { return run_plan(*args); }; });
}

}  // namespace strata::cli
