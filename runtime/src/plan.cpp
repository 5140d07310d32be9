// The analytic planner (plan.hpp): bytes per tier from the engine's layout, step time
// from the load on each lane of the engine's pipeline.
#include "strata/runtime/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "strata/core/error.hpp"
#include "strata/runtime/plan_detail.hpp"

namespace strata::plan {

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;
constexpr uint64_t kShardAlign = 1024;   // the engine's shard alignment, elements
constexpr uint64_t kTierAlign = 4096;    // tier allocations, bytes

double aligned(double bytes) { return std::ceil(bytes / kTierAlign) * kTierAlign; }

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, bytes >= 100 * GiB ? "%.0f GiB" : bytes >= 10 * GiB ? "%.1f GiB" : "%.2f GiB",
                bytes / GiB);
  return buf;
}

}  // namespace

std::string Strategy::describe() const {
  std::ostringstream os;
  os << "stage " << stage;
  if (stage == 3) os << ", params " << to_string(offload_param);
  os << ", optimizer " << to_string(offload_optimizer) << ", micro-batch " << micro_batch;
  if (grad_accum > 1) os << " x " << grad_accum << " accumulated";
  os << (checkpointing ? ", checkpointing" : ", no checkpointing");
  return os.str();
}

void validate(const Strategy& s) {
  if (s.stage < 1 || s.stage > 3)
    throw ConfigError("--stage " + std::to_string(s.stage) + " is not a ZeRO stage; give 1, 2 or 3");
  if (s.stage < 3 && s.offload_param != OffloadDevice::None)
    throw ConfigError("--offload-param " + std::string(to_string(s.offload_param)) + " needs --stage 3 (stages 1 and 2 "
                      "keep every parameter on the device); give --stage 3 or --offload-param none");
  if (s.micro_batch < 1) throw ConfigError("--micro-batch must be at least 1, not " + std::to_string(s.micro_batch));
  if (s.seq_len < 0) throw ConfigError("--seq must be positive (or 0 for the model's), not " + std::to_string(s.seq_len));
  if (s.grad_accum < 1) throw ConfigError("--grad-accum must be at least 1, not " + std::to_string(s.grad_accum));
  if (s.prefetch_groups < 0) throw ConfigError("--prefetch-groups must be 0 or more");
}

double activation_bytes(const GptShape& s, int micro_batch, bool checkpointing) {
  // fp32, per token of the micro-batch. A block saves for backward: ln_1's input and
  // output, q, k, v, the attention output, the residual, ln_2's output, the MLP's input
  // to GELU and its output (4d each), and per head the softmax statistics: 16 d + 2 heads
  // values. Attention is computed block-wise (no [seq, seq] scores) and the head in row
  // chunks (no full logits), as the cpu model does (model/gpt.hpp).
  const double T = double(micro_batch) * s.seq_len;
  const double d = s.d_model;
  const double block = (16 * d + 2.0 * s.heads) * 4 * T;
  const double boundary = 3 * d * 4 * T;  // embedding output, final norm in and out
  const double logits_chunk = std::min<double>(T, 1024) * s.vocab * 4 * 2;  // a chunk and its gradient
  const double blocks = checkpointing ? s.layers * d * 4 * T + block : s.layers * block;
  // Backward keeps one block's activation gradients alive on top (about 4 d per token).
  return blocks + boundary + logits_chunk + 4 * d * 4 * T;
}

// ----------------------------------------------------------------------------------------

Layout layout(const GptShape& shape, const Strategy& st, int world) {
  Layout L;
  const uint64_t unit = uint64_t(world) * kShardAlign;
  for (const GptGroup& g : gpt_groups(shape)) {
    LayoutGroup lg;
    lg.name = g.name;
    lg.numel = g.numel;
    lg.padded = (g.numel + unit - 1) / unit * unit;
    lg.shard = lg.padded / world;
    lg.forward_flops_per_token = g.forward_flops_per_token;
    L.groups.push_back(lg);
    L.max_padded = std::max(L.max_padded, lg.padded);
    L.max_shard = std::max(L.max_shard, lg.shard);
    L.max_numel = std::max(L.max_numel, lg.numel);
    L.shard_total += lg.shard;
    L.padded_total += lg.padded;
  }
  uint64_t sub = st.sub_group_elems;
  if (sub == 0) sub = std::clamp<uint64_t>(L.max_shard / 4, uint64_t{1} << 20, uint64_t{100'000'000});
  L.sub_group = std::max(kShardAlign, sub / kShardAlign * kShardAlign);
  for (LayoutGroup& g : L.groups) {
    for (uint64_t off = 0; off < g.shard; off += L.sub_group) {
      const uint64_t n = std::min(L.sub_group, g.shard - off);
      g.chunks.push_back(n);
      L.max_chunk = std::max(L.max_chunk, n);
      ++L.chunk_count;
    }
  }
  return L;
}

std::vector<GroupTimes> group_times(const GptShape& s, const Layout& L, const ClusterSpec& c, const Strategy& st) {
  // Matmul FLOPs at the matmul rate, element-wise passes at device memory bandwidth:
  // about 80 d bytes per token per block forward (layer norms, GELU, residuals, bias
  // adds, read and written in fp32), twice that backward.
  const double T = double(st.micro_batch) * s.seq_len;
  const double flops = c.gpu_flops * c.matmul_efficiency;
  const double ew = 80.0 * s.d_model * T / c.hbm_bandwidth;
  const double lookup = 2.0 * 4 * s.d_model * T / c.hbm_bandwidth;  // embedding rows in, sum out
  std::vector<GroupTimes> out(L.groups.size());
  const int n = static_cast<int>(L.groups.size());
  for (int g = 0; g < n; ++g) {
    const double mm = L.groups[g].forward_flops_per_token * T / flops;
    GroupTimes& t = out[g];
    if (g == 0) {
      // Embeddings: the lookup forward, its scatter backward; the tied head's matmul runs
      // when group 0 is acquired the second time (forward 1x, backward 2x).
      t.forward_s = lookup;
      t.head_s = 3 * mm;
      t.backward_s = lookup;
    } else if (g == n - 1) {
      t.forward_s = ew / 8;   // final layer norm: about 10 d bytes per token
      t.backward_s = ew / 4;
    } else {
      t.forward_s = mm + ew;
      t.backward_s = 2 * (mm + ew) + (st.checkpointing ? mm + ew : 0.0);
    }
  }
  return out;
}

// ----------------------------------------------------------------------------------------

namespace {

struct Lane {
  double bytes = 0;
  double time = 0;  // seconds, latencies included
  void add(double b, double bw, double lat) {
    if (b <= 0) return;
    bytes += b;
    time += lat + b / bw;
  }
  void add_timed(double b, double t) {
    bytes += b;
    time += t;
  }
};

Tier tier_of(OffloadDevice d) { return home_tier(d); }

}  // namespace

Plan make_plan(const GptShape& model_in, const ClusterSpec& cluster, const Strategy& st) {
  validate(cluster);
  validate(st);
  GptShape s = model_in;
  if (st.seq_len > 0) s.seq_len = st.seq_len;
  validate(s);

  Plan p;
  p.shape = s;
  p.strategy = st;
  p.cluster = cluster;
  p.world = cluster.world();
  p.params = gpt_param_count(s);
  const int w = p.world;
  const int A = st.grad_accum;
  const Layout L = layout(s, st, w);
  const int G = static_cast<int>(L.groups.size());
  const bool s3 = st.stage == 3;
  const Tier param_home = s3 ? tier_of(st.offload_param) : Tier::Device;
  const Tier opt_home = tier_of(st.offload_optimizer);

  if (!cluster.cpu_backend && opt_home == Tier::Device)
    p.problems.push_back(
        "--offload-optimizer none needs a GPU optimizer, which Strata does not have on the cuda backend yet: "
        "give --offload-optimizer cpu or nvme");
  if ((opt_home == Tier::Nvme || param_home == Tier::Nvme) && cluster.nvme_capacity <= 0)
    p.problems.push_back("offloading to NVMe on a cluster without NVMe: give --nvme-capacity and its bandwidths" +
                         std::string(cluster.cpu_backend ? " (or --nvme-dir to measure a disk)" : "") +
                         ", or offload to cpu");

  // ---- bytes per rank in each tier -----------------------------------------------------
  const double S4 = 4.0 * L.shard_total;
  double home[kTierCount] = {0, 0, 0};
  TierBytes dev, pin, nvme;
  auto put = [&](Tier t, double TierBytes::*field, double bytes) {
    TierBytes& tb = t == Tier::Device ? dev : t == Tier::Pinned ? pin : nvme;
    tb.*field += bytes;
    home[int(t)] += bytes;
  };
  double chunk_bytes = 0;  // aligned, one of master/m/v/grad over every chunk
  for (const LayoutGroup& g : L.groups)
    for (uint64_t n : g.chunks) chunk_bytes += aligned(4.0 * n);
  double shard_bytes = 0, padded_bytes = 0;
  for (const LayoutGroup& g : L.groups) {
    shard_bytes += aligned(4.0 * g.shard);
    padded_bytes += aligned(4.0 * g.padded);
  }
  if (s3)
    put(param_home, &TierBytes::params, shard_bytes);
  else
    put(Tier::Device, &TierBytes::params, padded_bytes);
  if (st.stage == 1) put(Tier::Device, &TierBytes::grads, padded_bytes);  // the full accumulated gradient
  put(opt_home, &TierBytes::grads, chunk_bytes);
  put(opt_home, &TierBytes::optimizer, 3 * chunk_bytes);

  // Device buffers: the engine's working set for the group in use, the look-ahead of
  // gathered groups, the embeddings' gradient held through backward (the tied head's
  // gradient arrives first, the lookup's last), and what the runtime cannot use.
  const double mp4 = 4.0 * L.max_padded, ms4 = 4.0 * L.max_shard;
  const double working = s3 ? 2 * mp4 + 3 * ms4 : mp4 + 2 * ms4;
  const double lookahead = s3 ? st.prefetch_groups * mp4 : 0.0;
  const double emb_grad = 4.0 * L.groups[0].padded;
  dev.buffers = working + lookahead + emb_grad + cluster.device_reserve;
  dev.activations = activation_bytes(s, st.micro_batch, st.checkpointing);
  // Pinned staging: the optimizer's sub-groups passing through (as the engine reserves
  // it) and parameter shards on their way from NVMe.
  const double pinned_working = opt_home == Tier::Device ? ms4 : 4.0 * L.max_chunk * 8 + ms4;
  pin.buffers = pinned_working + (param_home == Tier::Nvme ? (st.prefetch_groups + 1) * ms4 : 0.0);
  // NVMe: the engine sizes its swap space at the homes plus an eighth plus 64 MiB.
  const double nvme_home = home[int(Tier::Nvme)];
  if (nvme_home > 0) nvme.buffers = nvme_home / 8 + 64.0 * 1024 * 1024;

  p.tiers[0] = {Tier::Device, dev, cluster.hbm};
  p.tiers[1] = {Tier::Pinned, pin, cluster.pinned_per_rank()};
  p.tiers[2] = {Tier::Nvme, nvme, cluster.nvme_per_rank()};
  for (const TierPlan& t : p.tiers)
    if (!t.fits()) {
      std::ostringstream os;
      os << to_string(t.tier) << " short by " << gib(t.short_by()) << ": needs " << gib(t.need.total())
         << " per rank (params " << gib(t.need.params) << ", gradients " << gib(t.need.grads) << ", optimizer "
         << gib(t.need.optimizer) << ", activations " << gib(t.need.activations) << ", buffers "
         << gib(t.need.buffers) << "), has " << gib(t.budget);
      if (t.tier == Tier::Device && s3 && t.need.buffers > t.need.activations)
        os << "; the buffers are whole gathered blocks in fp32 (" << gib(mp4) << " each: the group in use, its "
           << "gradient and " << st.prefetch_groups << " prefetched; Strata gathers a block at once, it does not tile "
           << "operators): lower --prefetch-groups, or a narrower model (smaller --d-model, more --layers)";
      else if (t.tier == Tier::Device)
        os << (s3 ? "; offload more, lower --micro-batch, turn on checkpointing, or add GPUs"
                  : "; use --stage 3 with --offload-param, or add GPUs");
      else if (t.tier == Tier::Pinned)
        os << "; offload to nvme instead, or add nodes";
      else
        os << "; add NVMe capacity or nodes";
      p.problems.push_back(os.str());
    }
  if (cluster.cpu_backend && dev.total() + pin.total() > cluster.host_ram * 0.9)
    p.problems.push_back("device arena and pinned pool together need " + gib(dev.total() + pin.total()) +
                         " of this machine's " + gib(cluster.host_ram) + " RAM: offload to nvme or shrink the model");
  p.fits = p.problems.empty();

  // ---- the engine and the cost model this plan stands for ---------------------------------
  SimCostModel& c = p.cost;
  c.device_flops = cluster.gpu_flops * cluster.matmul_efficiency;
  c.device_bandwidth = cluster.hbm_bandwidth;
  c.h2d_bandwidth = c.d2h_bandwidth = cluster.pcie;
  c.pcie_latency = cluster.pcie_latency;
  c.nvme_read_bandwidth = cluster.nvme_read > 0 ? cluster.nvme_read_per_rank() : 1e9;
  c.nvme_write_bandwidth = cluster.nvme_write > 0 ? cluster.nvme_write_per_rank() : 1e9;
  c.nvme_latency = cluster.nvme_latency;
  c.collective_bandwidth = cluster.collective_bandwidth();
  c.collective_latency = cluster.collective_latency;
  c.host_bandwidth = cluster.host_bandwidth_per_rank();
  EngineOptions& e = p.engine;
  e.stage = st.stage;
  e.param_home = param_home;
  e.optimizer_home = opt_home;
  e.gradient_accumulation_steps = A;
  e.prefetch_bucket_elems = std::max<uint64_t>(1, uint64_t(st.prefetch_groups) * L.max_numel);
  e.max_live_elems = uint64_t{1} << 62;
  e.persistence_threshold_elems = 0;
  e.max_reuse_distance_elems = 0;
  e.sub_group_elems = L.sub_group;
  e.prefetch = st.prefetch_groups > 0;
  // What the engine may use on the device: the HBM less what the runtime cannot use and
  // less the activations, which the engine does not hold (the model does).
  const double dev_budget = cluster.hbm - cluster.device_reserve - dev.activations;
  e.store.device_budget = dev_budget > 0 ? static_cast<uint64_t>(dev_budget) : 0;
  e.store.pinned_budget = static_cast<uint64_t>(cluster.pinned_per_rank());

  // ---- time ---------------------------------------------------------------------------
  const std::vector<GroupTimes> gt = group_times(s, L, cluster, st);
  const double ring = w > 1 ? (w - 1.0) / w : 0.0;
  const double cbw = c.collective_bandwidth, clat = w > 1 ? c.collective_latency : 0.0;
  auto coll = [&](double bytes) { return w > 1 ? clat + ring * bytes / cbw : 0.0; };
  const bool params_move = s3 && param_home != Tier::Device;
  const bool grads_move = opt_home != Tier::Device;

  // Free room for caches: what the engine's budgets leave after homes and working sets.
  const double dev_room = std::max(0.0, dev_budget - home[0] - working - st.prefetch_groups * mp4 - emb_grad);
  const double pin_room = std::max(0.0, p.tiers[1].budget - home[1] - pin.buffers);

  double fwd_compute = 0, bwd_compute = 0;
  for (int g = 0; g < G; ++g) {
    fwd_compute += gt[g].forward_s;
    bwd_compute += gt[g].backward_s + gt[g].head_s;
  }
  // Per micro-step, per lane. Forward: groups 0..G-1 gathered in order; the head
  // re-gathers group 0 (counted in backward, where its compute is); backward gathers the
  // blocks again and reduce-scatters every gradient.
  Lane f_coll, f_h2d, f_nvr, b_coll, b_h2d, b_d2h, b_nvr, b_nvw;
  double blocks_s4 = 0;
  for (int g = 0; g < G; ++g) {
    const LayoutGroup& lg = L.groups[g];
    const double sh4 = 4.0 * lg.shard, pd4 = 4.0 * lg.padded;
    const bool block = g > 0 && g < G - 1;
    if (s3) {
      f_coll.add_timed(pd4, coll(pd4));                          // all_gather
      if (g == 0 || block) b_coll.add_timed(pd4, coll(pd4));     // again for the head and backward
    }
    if (st.stage >= 2) b_coll.add_timed(pd4, coll(pd4));         // reduce_scatter
    if (params_move) {
      f_h2d.add(sh4, c.h2d_bandwidth, c.pcie_latency);
      if (param_home == Tier::Nvme) f_nvr.add(sh4, c.nvme_read_bandwidth, c.nvme_latency);
      if (block) blocks_s4 += sh4;
    }
    if (grads_move && st.stage >= 2)
      for (uint64_t n : lg.chunks) b_d2h.add(4.0 * n, c.d2h_bandwidth, c.pcie_latency);
  }
  if (params_move) {
    // Backward fetches again what the caches could not keep (Belady keeps the blocks
    // needed first), and the head's second use of group 0.
    const double sh0 = 4.0 * L.groups[0].shard;
    const double dev_miss = std::max(0.0, blocks_s4 + sh0 - dev_room);
    const double per = blocks_s4 / std::max(1, G - 2);
    const int transfers = static_cast<int>(std::ceil(dev_miss / std::max(per, 1.0)));
    if (dev_miss > 0) b_h2d.add_timed(dev_miss, dev_miss / c.h2d_bandwidth + transfers * c.pcie_latency);
    if (dev_miss <= 0 && A > 1) {
      // Every shard stays cached on the device until the optimizer rewrites it: later
      // micro-steps fetch nothing (per micro-step, the first one's fetch spread over A).
      f_h2d.bytes /= A, f_h2d.time /= A;
      f_nvr.bytes /= A, f_nvr.time /= A;
    }
    if (param_home == Tier::Nvme) {
      const double pin_miss = std::max(0.0, dev_miss - pin_room);
      if (pin_miss > 0) b_nvr.add_timed(pin_miss, pin_miss / c.nvme_read_bandwidth + transfers * c.nvme_latency);
    }
  }
  if (A > 1 && grads_move && st.stage >= 2)
    for (const LayoutGroup& lg : L.groups)  // micro-steps after the first fetch the accumulated gradient back
      for (uint64_t n : lg.chunks) b_h2d.add(4.0 * n * (A - 1) / A, c.h2d_bandwidth, c.pcie_latency * (A - 1) / A);
  // Gradients on their way to an NVMe home wait in pinned memory until the optimizer;
  // what does not fit is written back during backward and read again by the optimizer.
  double grad_spill = 0;
  if (opt_home == Tier::Nvme) {
    grad_spill = std::max(0.0, S4 - std::max(0.0, pin_room - (params_move ? blocks_s4 : 0.0)));
    if (grad_spill > 0) b_nvw.add(grad_spill, c.nvme_write_bandwidth, c.nvme_latency);
  }

  // What cannot overlap: the first group of every micro-step (nothing is fetched across
  // the step boundary) and the last reduction before the optimizer starts.
  const double sh0 = 4.0 * L.groups[0].shard, pd0 = 4.0 * L.groups[0].padded;
  double startup = s3 ? coll(pd0) : 0.0;
  if (params_move) startup += c.pcie_latency + sh0 / c.h2d_bandwidth;
  if (param_home == Tier::Nvme) startup += c.nvme_latency + sh0 / c.nvme_read_bandwidth;
  double tail = st.stage >= 2 ? coll(pd0) : 0.0;
  if (grads_move && st.stage >= 2) tail += c.pcie_latency + sh0 / c.d2h_bandwidth;

  const double fwd = std::max({fwd_compute, f_coll.time, f_h2d.time, f_nvr.time}) + startup;
  // With pinned memory full (gradients spilling), a read into it waits for the eviction's
  // write-back: backward's NVMe reads and writes take turns instead of overlapping.
  const double b_nvme = grad_spill > 0 ? b_nvr.time + b_nvw.time : std::max(b_nvr.time, b_nvw.time);
  const double bwd = std::max({bwd_compute, b_coll.time, b_h2d.time, b_d2h.time, b_nvme});

  // Stage 1: all-reduce of the full gradient at the step, then its shard to the optimizer.
  double stage1 = 0;
  Lane s1_d2h;
  if (st.stage == 1) {
    for (const LayoutGroup& lg : L.groups) stage1 += coll(2 * 4.0 * lg.padded);
    if (grads_move)
      for (const LayoutGroup& lg : L.groups)
        for (uint64_t n : lg.chunks) s1_d2h.add(4.0 * n, c.d2h_bandwidth, c.pcie_latency);
    stage1 = std::max(stage1, s1_d2h.time) + (grads_move ? c.pcie_latency + sh0 / c.d2h_bandwidth : 0.0);
  }

  // Optimizer: per sub-group, read its states while the previous one is updated and the
  // one before written back. The update streams 28 bytes per parameter, 8 more to scale
  // the gradient (world x accumulation > 1) and 8 more to copy into the parameter shard
  // (stage 3) through the host.
  const double scale_bytes = (double(w) * A != 1.0) ? 8.0 : 0.0;
  const double per_param = 28.0 + scale_bytes + (s3 ? 8.0 : 0.0);
  const double opt_compute = per_param * L.shard_total / c.host_bandwidth;
  Lane o_nvr, o_nvw, o_h2d;
  double opt_serial = 0;  // work the optimizer's thread waits for, per sub-group
  for (const LayoutGroup& lg : L.groups) {
    for (uint64_t n : lg.chunks) {
      const double b = 4.0 * n;
      if (opt_home == Tier::Nvme) {
        o_nvr.add(3 * b, c.nvme_read_bandwidth, 3 * c.nvme_latency);  // master, exp_avg, exp_avg_sq
        o_nvw.add(4 * b, c.nvme_write_bandwidth, 4 * c.nvme_latency);  // and the gradient, written back
      }
      if (!s3) opt_serial += opt_home == Tier::Device ? 2 * b / c.device_bandwidth : c.pcie_latency + b / c.h2d_bandwidth;
    }
    if (s3 && param_home == Tier::Nvme) o_nvw.add(4.0 * lg.shard, c.nvme_write_bandwidth, c.nvme_latency);
    if (s3 && param_home == Tier::Device && opt_home != Tier::Device)
      o_h2d.add(4.0 * lg.shard, c.h2d_bandwidth, c.pcie_latency);
  }
  if (grad_spill > 0) o_nvr.add(grad_spill, c.nvme_read_bandwidth, 0);
  const double first_read = o_nvr.time / std::max<uint64_t>(1, L.chunk_count);
  // Write-back runs behind the updates, but pinned memory is reused lowest address first
  // and only once its write-back has finished (the store's fences), so the next
  // sub-group's states wait for the last one's writes: the write lane paces the loop.
  const double opt = std::max({opt_compute + opt_serial, o_nvr.time, o_h2d.time, o_nvw.time}) + first_read;
  // Stages 1 and 2: every rank's updated slice gathered into the replicated parameters.
  double refresh = 0;
  if (!s3)
    for (const LayoutGroup& lg : L.groups) refresh += coll(4.0 * lg.padded);

  p.forward_s = A * fwd;
  p.backward_s = A * bwd + tail;
  p.optimizer_s = opt;
  p.boundary_s = stage1 + refresh;
  p.compute_s = A * (fwd_compute + bwd_compute);
  p.step_s = p.forward_s + p.backward_s + p.optimizer_s + p.boundary_s;
  // The NVMe writes of the optimizer run on into the next step's forward and backward.
  const double write_lane = o_nvw.time + A * b_nvw.time;
  if (write_lane > p.step_s) p.step_s = write_lane;
  p.exposed_s = std::max(0.0, p.step_s - p.compute_s - opt_compute);
  p.tokens_per_step = double(w) * A * st.micro_batch * s.seq_len;
  p.tokens_per_s = p.tokens_per_step / p.step_s;
  p.model_flops_per_token = gpt_flops_per_token(s);
  p.mfu = p.tokens_per_s * p.model_flops_per_token / (double(w) * cluster.gpu_flops);

  // ---- links: load, and the bandwidth that would hide it behind the compute ---------------
  const double fb_window = p.compute_s;
  auto link = [&](const std::string& name, double bytes, double bw, double busy, double window) {
    if (bytes <= 0) return;
    p.links.push_back({name, bytes, bw, busy, window, window > 0 ? bytes / window : 0.0});
  };
  link("nvme read", A * (f_nvr.bytes + b_nvr.bytes) + o_nvr.bytes, c.nvme_read_bandwidth,
       A * (f_nvr.time + b_nvr.time) + o_nvr.time, fb_window + opt_compute);
  link("nvme write", A * b_nvw.bytes + o_nvw.bytes, c.nvme_write_bandwidth, write_lane, fb_window + opt_compute);
  link("pcie h2d", A * (f_h2d.bytes + b_h2d.bytes) + o_h2d.bytes, c.h2d_bandwidth,
       A * (f_h2d.time + b_h2d.time) + o_h2d.time, fb_window);
  link("pcie d2h", A * b_d2h.bytes + s1_d2h.bytes, c.d2h_bandwidth, A * b_d2h.time + s1_d2h.time, fb_window);
  link("collectives", A * (f_coll.bytes + b_coll.bytes) * ring, cbw, A * (f_coll.time + b_coll.time) + stage1 + refresh,
       fb_window);
  link("cpu optimizer", per_param * L.shard_total, c.host_bandwidth, opt_compute, 0);

  // ---- the bottleneck, in words ------------------------------------------------------------
  std::ostringstream why;
  why.precision(3);
  const double hidden_frac = p.compute_s / p.step_s;
  const LinkLoad* worst = nullptr;
  for (const LinkLoad& l : p.links)
    if (l.name != "cpu optimizer" && (!worst || l.busy_s > worst->busy_s)) worst = &l;
  if (opt_compute > 0.3 * p.step_s && (!worst || opt_compute >= worst->busy_s)) {
    why << "the CPU optimizer: " << per_param << " bytes per parameter over " << cluster.host_bandwidth_per_rank() / 1e9
        << " GB/s of host memory per rank takes " << opt_compute << " s of the " << p.step_s
        << " s step; a larger micro-batch spreads it over more tokens";
  } else if (worst && worst->busy_s > p.compute_s) {
    why << worst->name << ": " << worst->bytes / GiB << " GiB per rank per step at " << worst->bandwidth / 1e9
        << " GB/s takes " << worst->busy_s << " s, longer than the " << p.compute_s << " s of compute; hiding it needs "
        << worst->needed / 1e9 << " GB/s per rank";
  } else {
    why << "compute: transfers hide behind the " << p.compute_s << " s of kernels ("
        << static_cast<int>(100 * hidden_frac + 0.5) << "% of the step)";
  }
  p.bottleneck = why.str();
  return p;
}

}  // namespace strata::plan
