// The analytic planner (plan.hpp): bytes per tier from the engine's layout, step time
// from the load on each lane of the engine's pipeline.
#include "strata/runtime/plan/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/model/attention_plan.hpp"
#include "strata/runtime/plan/plan_detail.hpp"
#include "strata/runtime/train/train.hpp"

namespace strata::plan {

namespace {

constexpr double GiB = 1024.0 * 1024 * 1024;

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, bytes >= 100 * GiB ? "%.0f GiB" : bytes >= 10 * GiB ? "%.1f GiB" : "%.2f GiB",
                bytes / GiB);
  return buf;
}

}  // namespace

// ----------------------------------------------------------------------------------------

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

// One make_plan call: the strategy, the engine's layout and the lanes the sections share.
// make_plan runs the sections in order; each fills its part of the Plan.
class Planner {
 public:
  Planner(Plan& p, const Strategy& st)
      : p_(p), st_(st), cl_(p.cluster), s_(p.shape), R_(resolve_plan(p, st)), L_(R_.layout) {
    w_ = p.world;
    A_ = st.grad_accum;
    G_ = static_cast<int>(L_.groups.size());
    // The layout's groups are the model's, or parts of them (gpt_parts), or their frozen
    // and trained shares: which is whose.
    model_of_ = plan_groups(p.shape, st).model_of;
    M_ = static_cast<int>(plan_parts(p.shape, st).size());
    STRATA_CHECK(static_cast<int>(model_of_.size()) == G_, "the planner's parts and layout disagree");
    s3_ = st.stage == 3;
    param_home_ = s3_ ? home_tier(st.offload_param) : Tier::Device;
    opt_home_ = home_tier(st.offload_optimizer);
    gpu_opt_ = !cl_.cpu_backend && (opt_home_ == Tier::Device || st.optimizer_ratio < 1.0);
    // Bytes per element from the layout: working parameters and gradients (w), the
    // reduced gradient the optimizer reads (g), fp32 optimizer states.
    wb_ = double(L_.elem_bytes(StateRole::GatherBuffer));
    gb_ = double(L_.elem_bytes(StateRole::Grad));
    mp4_ = wb_ * L_.max_padded;
    ms4_ = wb_ * L_.max_shard;
    sh0_ = wb_ * L_.groups[0].shard;
    pd0_ = wb_ * L_.groups[0].padded;
    params_move_ = s3_ && param_home_ != Tier::Device;
    grads_move_ = opt_home_ != Tier::Device;
  }

  void cannot_run();         // problems no budget fixes
  void count_bytes();        // p.tiers, their problems, p.fits
  void set_engine();         // p.cost and p.engine: what simulate_plan runs
  void micro_step_lanes();   // forward and backward of one micro-step, per lane
  void checkpoint_lanes();   // of which the activation checkpoints' moves off the device
  void group_collectives(const GroupLayout& lg, double pd4, bool again_in_backward, bool part_of_block);
  void boundary_lanes();     // stage 1's reduction, the optimizer, the refresh
  void step_time();          // p.*_s, tokens, MFU
  void link_loads();         // p.links
  void explain();            // p.bottleneck

 private:
  // A communicator's ranks, whether they span nodes, and the bandwidth its ring gets:
  // the node's collective bus within a node, collective_bandwidth() across nodes (each
  // rank's share of the node's network, or the bus if slower).
  struct Comm {
    int ranks = 1;
    bool inter = false;
    double bw = 1, lat = 0;
    double ring() const { return ranks > 1 ? (ranks - 1.0) / ranks : 0.0; }
  };
  Comm comm_of(int ranks) const;
  // Seconds of a collective of `bytes` (the whole buffer) on c, and (count) the bytes one
  // rank sends in it, `times` per step, into the engine's counter and the inter-node total.
  double on(const Comm& c, double bytes) const { return c.ranks > 1 ? c.lat + c.ring() * bytes / c.bw : 0.0; }
  void sent(const Comm& c, double bytes, double times, double& counter) {
    counter += times * c.ring() * bytes;
    if (c.inter) p_.inter_node_bytes += times * c.ring() * bytes;
  }
  double coll(double bytes) const { return on(shard_, bytes); }
  void tier_problem(const TierPlan& t);

  Plan& p_;
  const Strategy& st_;
  const ClusterSpec& cl_;
  const GptShape& s_;
  const ResolvedLayout R_;  // what the engine would run (resolve.hpp)
  const ShardLayout& L_;    // R_.layout
  int w_ = 1, A_ = 1, G_ = 0, M_ = 0;  // layout groups (parts), model groups
  std::vector<int> model_of_;          // per layout group: its model group
  bool s3_ = false, params_move_ = false, grads_move_ = false;
  Tier param_home_ = Tier::Device, opt_home_ = Tier::Device;
  double wb_ = 4, gb_ = 4;                        // bytes per working element, per reduced-gradient element
  double mp4_ = 0, ms4_ = 0, sh0_ = 0, pd0_ = 0;  // bytes: largest padded group and shard, group 0's
  double home_[kTierCount] = {0, 0, 0};          // bytes of home copies per tier
  double dev_budget_ = 0;
  double ring_ = 0, cbw_ = 1, clat_ = 0;         // the shard ring (shard_'s)
  // The communicators: the ranks the states are sharded over (the world, or a MiCS
  // group), the world, MiCS's replicas (the other groups' ranks with this shard) and
  // hpZ's secondary groups.
  Comm shard_, world_, replicas_, secondary_;
  bool mics_ = false, hpz_ = false;
  // ZeRO++'s quantized collectives: qwZ (the gathers from the primary shards), qgZ (the
  // reduce-scatters), in two hops over node_ (a node's ranks) and cross_ (one rank a node).
  bool qwz_ = false, qgz_ = false, qgz_two_hops_ = false;
  Comm node_, cross_;
  uint64_t qblock_ = 256;
  // Bytes of a gather from the primary shards, and seconds of a group's reduce-scatter.
  double gather_bytes(const GroupLayout& lg) const {
    return qwz_ ? double(shard_.ranks) * double(quantized_bytes(lg.shard, qblock_)) : wb_ * double(lg.padded);
  }
  double reduce_s(const GroupLayout& lg) const;
  void reduce_sent(const GroupLayout& lg, double times);
  // Seconds of a gather from the primary shards (qwZ: its chunks' latencies too).
  double gather_s(const GroupLayout& lg) const {
    if (!qwz_) return coll(gather_bytes(lg));
    const uint64_t chunks = qwz_chunks(lg.shard, shard_.ranks, qblock_, L_.strategy.quantized_scratch).count(lg.shard);
    return coll(gather_bytes(lg)) + double(chunks - 1) * shard_.lat;
  }
  // MiCS: the step's all-reduces across the groups, on a lane of their own in the last
  // micro-step's backward, each behind its group's reduce-scatter and accumulation on the
  // engine's one reduce stream (gradient_reducer.cpp): the lane starts a group's backward
  // in and the first group's (the tied embeddings', or the first block's) ends the step.
  double replica_lane_ = 0, replica_tail_ = 0;
  // Per micro-step lanes: forward, backward.
  Lane f_coll_, f_h2d_, f_nvr_, f_d2h_, f_nvw_, b_coll_, b_h2d_, b_d2h_, b_nvr_, b_nvw_;
  double fwd_compute_ = 0, bwd_compute_ = 0, fwd_ = 0, bwd_ = 0, tail_ = 0, grad_spill_ = 0;
  // At the step boundary: stage 1's reduction, the optimizer, the refresh.
  Lane s1_d2h_, o_nvr_, o_nvw_, o_h2d_;
  double stage1_ = 0, per_param_ = 0, opt_compute_ = 0, opt_ = 0, refresh_ = 0, write_lane_ = 0;
  double opt_serial_ = 0;  // work the optimizer's thread waits for, per sub-group, summed
  bool gpu_opt_ = false;   // offload_optimizer none or ratio < 1 on GPUs: the GPU optimizer steps in HBM
  double opt_host_elems_ = 0, opt_device_elems_ = 0;  // shard elements CPU Adam and the GPU optimizer step
  double opt_host_bytes_ = 0, opt_device_bytes_ = 0;  // the bytes each streams
  double shard_cache_ = 0;  // pinned bytes of parameter shards the optimizer finds there
};

void Planner::cannot_run() {
  if ((opt_home_ == Tier::Nvme || param_home_ == Tier::Nvme) && cl_.nvme_capacity <= 0)
    p_.problems.push_back("offloading to NVMe on a cluster without NVMe: give --nvme-capacity and its bandwidths" +
                          std::string(cl_.cpu_backend ? " (or --nvme-dir to measure a disk)" : "") +
                          ", or offload to cpu");
}

void Planner::count_bytes() {
  // The engine's homes (shard_layout.hpp), per tier and purpose.
  TierBytes tb[kTierCount];
  for (int t = 0; t < kTierCount; ++t) {
    tb[t].params = double(L_.need[t].params);
    tb[t].grads = double(L_.need[t].grads);
    tb[t].optimizer = double(L_.need[t].optimizer);
    tb[t].activations = double(L_.need[t].activations);  // the checkpoints' homes
    home_[t] = double(L_.need[t].homes());
  }
  TierBytes &dev = tb[0], &pin = tb[1], &nvme = tb[2];
  // Device buffers: the engine's working set for the groups in use (with a tied head,
  // the embeddings' gradient held through backward: ShardStrategy::first_gradient_held),
  // the look-ahead of gathered groups, and what the runtime cannot use.
  const double lookahead = s3_ ? st_.prefetch_groups * mp4_ : 0.0;
  p_.lookahead_bytes = lookahead;
  dev.buffers = double(L_.device_working) + lookahead + cl_.device_reserve;
  dev.activations += p_.model_activations;  // resolve_plan's
  // Pinned staging: the optimizer's sub-groups passing through (as the engine reserves
  // it) and parameter shards on their way from NVMe.
  pin.buffers = double(L_.pinned_staging) + (param_home_ == Tier::Nvme ? (st_.prefetch_groups + 1) * ms4_ : 0.0);
  // NVMe: the swap space the engine sizes from the layout, beyond the homes.
  if (home_[int(Tier::Nvme)] > 0) nvme.buffers = double(L_.nvme_capacity()) - home_[int(Tier::Nvme)];

  p_.tiers[0] = {Tier::Device, dev, cl_.hbm};
  p_.tiers[1] = {Tier::Pinned, pin, cl_.pinned_per_rank()};
  p_.tiers[2] = {Tier::Nvme, nvme, cl_.nvme_per_rank()};
  for (const TierPlan& t : p_.tiers)
    if (!t.fits()) tier_problem(t);
  if (cl_.cpu_backend && dev.total() + pin.total() > cl_.host_ram * 0.9)
    p_.problems.push_back("device arena and pinned pool together need " + gib(dev.total() + pin.total()) +
                          " of this machine's " + gib(cl_.host_ram) + " RAM: offload to nvme or shrink the model");
  // The engine's own checks (resolve.hpp) are looser than the planner's; where even they
  // fail, the engine would refuse to start.
  if (!R_.unfit.empty() && p_.problems.empty()) p_.problems.push_back("the engine would refuse it: " + R_.unfit);
  p_.fits = p_.problems.empty();
}

void Planner::tier_problem(const TierPlan& t) {
  std::ostringstream os;
  os << to_string(t.tier) << " short by " << gib(t.short_by()) << ": needs " << gib(t.need.total())
     << " per rank (params " << gib(t.need.params) << ", gradients " << gib(t.need.grads) << ", optimizer "
     << gib(t.need.optimizer) << ", activations " << gib(t.need.activations) << ", buffers " << gib(t.need.buffers)
     << "), has " << gib(t.budget);
  if (t.tier == Tier::Device && s3_ && t.need.buffers > t.need.activations && !st_.parted())
    os << "; the buffers are whole gathered blocks in " << precision_name(st_.precision) << " (" << gib(mp4_) << " each: the group in use, its "
       << "gradient and " << st_.prefetch_groups << " prefetched): --tile-factor and --bucket-elems gather a "
       << "block in parts, or lower --prefetch-groups";
  else if (t.tier == Tier::Device && s3_ && t.need.buffers > t.need.activations && pd0_ >= mp4_)
    os << "; the buffers are gathered parts in " << precision_name(st_.precision) << ", the largest the embedding "
       << "table (" << gib(mp4_) << ": gathered whole, its gradient and " << st_.prefetch_groups
       << " prefetched; tiles split block linears only, not the embeddings): lower --prefetch-groups, or a smaller "
       << "vocabulary or d_model";
  else if (t.tier == Tier::Device && s3_ && t.need.buffers > t.need.activations)
    os << "; the buffers are gathered parts in " << precision_name(st_.precision) << " (the largest " << gib(mp4_)
       << ": the one in use, its gradient and " << st_.prefetch_groups << " prefetched): a larger --tile-factor "
       << "or smaller --bucket-elems, or lower --prefetch-groups";
  else if (t.tier == Tier::Device && t.need.activations > p_.model_activations)
    os << "; --cpu-checkpointing moves the " << gib(t.need.activations - p_.model_activations)
       << " of activation checkpoints off the device" << (s3_ ? ", or offload more" : "");
  else if (t.tier == Tier::Device)
    os << (s3_ ? "; offload more, lower --micro-batch, turn on checkpointing, or add GPUs"
               : "; use --stage 3 with --offload-param, or add GPUs");
  else if (t.tier == Tier::Pinned)
    os << "; offload to nvme instead, or add nodes";
  else
    os << "; add NVMe capacity or nodes";
  p_.problems.push_back(os.str());
}

void Planner::set_engine() {
  SimCostModel& c = p_.cost;
  c.device_flops = cl_.gpu_flops * cl_.matmul_efficiency;
  c.device_bandwidth = cl_.hbm_bandwidth;
  c.h2d_bandwidth = c.d2h_bandwidth = cl_.pcie;
  c.pcie_latency = cl_.pcie_latency;
  c.nvme_read_bandwidth = cl_.nvme_read > 0 ? cl_.nvme_read_per_rank() : 1e9;
  c.nvme_write_bandwidth = cl_.nvme_write > 0 ? cl_.nvme_write_per_rank() : 1e9;
  c.nvme_latency = cl_.nvme_latency;
  c.collective_bandwidth = cl_.collective_bandwidth();
  c.collective_latency = cl_.collective_latency;
  c.host_bandwidth = cl_.host_bandwidth_per_rank();
  world_ = comm_of(w_);
  mics_ = st_.mics_shard_size > 0 && st_.mics_shard_size < w_;
  hpz_ = s3_ && st_.hpz > 1;
  shard_ = mics_ ? comm_of(st_.mics_shard_size) : world_;
  if (mics_) {
    // The ranks holding one shard, one in each group: across nodes unless every group is
    // in one node.
    replicas_ = comm_of(w_ / st_.mics_shard_size);
    replicas_.inter = w_ > cl_.gpus_per_node;
    replicas_.bw = replicas_.inter ? cl_.collective_bandwidth() : cl_.intra_node;
  }
  if (hpz_) secondary_ = comm_of(st_.hpz);
  qwz_ = s3_ && st_.qwz;
  qgz_ = st_.stage >= 2 && st_.qgz;
  qblock_ = static_cast<uint64_t>(st_.quantized_block);
  qgz_two_hops_ = qgz_ && qgz_hierarchical(w_, cl_.nodes);
  if (qgz_two_hops_) {
    node_ = comm_of(cl_.gpus_per_node);
    cross_ = comm_of(cl_.nodes);
    cross_.inter = true;  // one rank a node
    cross_.bw = cl_.collective_bandwidth();
  }
  if ((qwz_ || qgz_) && !cl_.cpu_backend)
    p_.notes.push_back(std::string(qwz_ && qgz_ ? "qwZ and qgZ run" : qwz_ ? "qwZ runs" : "qgZ runs") +
                       " on the cpu backend only today (its quantization is host code): on GPUs this plan is what "
                       "they would give with quantization kernels, which Strata does not have yet");
  ring_ = shard_.ring();
  cbw_ = shard_.bw;
  clat_ = shard_.ranks > 1 ? shard_.lat : 0.0;
  c.collective_bandwidth = shard_.bw;
  // The engine's options are resolve_plan's; its device budget is this.
  dev_budget_ = cl_.hbm - cl_.device_reserve - p_.model_activations;
}

// A group's gradient reduce-scatter: plain over the shard's ranks, or qgZ's int8
// all-to-alls (one over the world; or within the node, then across the nodes, in turn).
// In chunks where the scratch would pass its cap (qgz_chunks): a latency more per chunk.
double Planner::reduce_s(const GroupLayout& lg) const {
  if (!qgz_) return coll(wb_ * double(lg.padded));
  const double q = double(quantized_bytes(lg.shard, qblock_));
  const double more = double(qgz_chunks(lg.shard, w_, qgz_two_hops_ ? cl_.nodes : 1, qblock_,
                                        L_.strategy.quantized_scratch)
                                 .count(lg.shard) -
                             1);
  if (!qgz_two_hops_) return on(shard_, shard_.ranks * q) + more * shard_.lat;
  return on(node_, double(w_) * q) + on(cross_, cross_.ranks * q) + more * (node_.lat + cross_.lat);
}

void Planner::reduce_sent(const GroupLayout& lg, double times) {
  if (!qgz_) {
    sent(shard_, wb_ * double(lg.padded), times, p_.shard_collective_bytes);
    return;
  }
  const double q = double(quantized_bytes(lg.shard, qblock_));
  if (!qgz_two_hops_) {
    sent(shard_, shard_.ranks * q, times, p_.shard_collective_bytes);
    return;
  }
  // Within the node: a part of one slice per node to each of its ranks; across: one slice.
  sent(node_, double(w_) * q, times, p_.node_collective_bytes);
  sent(cross_, cross_.ranks * q, times, p_.cross_collective_bytes);
}

Planner::Comm Planner::comm_of(int ranks) const {
  // Consecutive ranks from a node's first: within one node when they fit in it.
  Comm c;
  c.ranks = ranks;
  c.inter = ranks > cl_.gpus_per_node;
  c.bw = c.inter ? cl_.collective_bandwidth() : cl_.intra_node;
  c.lat = ranks > 1 ? cl_.collective_latency : 0.0;
  return c;
}

void Planner::micro_step_lanes() {
  const SimCostModel& c = p_.cost;
  const std::vector<GroupTimes> gt = group_times(s_, cl_, st_);
  // Free room for caches: what the engine's budgets leave after homes and working sets,
  // less the accumulating gradients the resolved layout keeps on the device.
  const double kept = double(R_.kept_grad_bytes);
  const double dev_room =
      std::max(0.0, dev_budget_ - home_[0] - double(L_.device_working) - kept - st_.prefetch_groups * mp4_);
  const double pin_room = std::max(0.0, p_.tiers[1].budget - home_[1] - p_.tiers[1].need.buffers);
  for (const GroupTimes& t : gt) {
    fwd_compute_ += t.forward_s;
    bwd_compute_ += t.backward_s + t.head_s;
  }
  // Forward: groups 0..G-1 gathered in order; the head re-gathers group 0 (counted in
  // backward, where its compute is); backward gathers the blocks again and
  // reduce-scatters every gradient.
  double blocks_s4 = 0;
  int block_parts = 0;
  for (int k = 0; k < G_; ++k) {
    const GroupLayout& lg = L_.groups[k];
    const int g = model_of_[k];
    const double sh4 = wb_ * lg.shard, pd4 = wb_ * lg.padded;
    const bool block = g > 0 && g < M_ - 1;
    block_parts += block;
    group_collectives(lg, pd4, (g == 0 && s_.tied()) || block, block);
    if (params_move_) {
      f_h2d_.add(sh4, c.h2d_bandwidth, c.pcie_latency);
      if (param_home_ == Tier::Nvme) f_nvr_.add(sh4, c.nvme_read_bandwidth, c.nvme_latency);
      if (block) blocks_s4 += sh4;
    }
    // Its gradient goes to the host (ratio: some stay); kept on the device, only in the
    // last micro-step (per micro-step, a share of 1 / A).
    const double share = kept > 0 ? 1.0 / A_ : 1.0;
    if (lg.optimizer_home != Tier::Device && st_.stage >= 2)
      for (const SubGroup& sg : lg.sub_groups) b_d2h_.add(gb_ * sg.n * share, c.d2h_bandwidth, c.pcie_latency * share);
  }
  if (params_move_) {
    // Backward fetches again what the caches could not keep (Belady keeps the blocks
    // needed first), and the head's second use of group 0.
    const double dev_miss = std::max(0.0, blocks_s4 + (s_.tied() ? sh0_ : 0.0) - dev_room);
    const double per = blocks_s4 / std::max(1, block_parts);
    const int transfers = static_cast<int>(std::ceil(dev_miss / std::max(per, 1.0)));
    if (dev_miss > 0) b_h2d_.add_timed(dev_miss, dev_miss / c.h2d_bandwidth + transfers * c.pcie_latency);
    if (dev_miss <= 0 && A_ > 1) {
      // Every shard stays cached on the device until the optimizer rewrites it: later
      // micro-steps fetch nothing (per micro-step, the first one's fetch spread over A).
      f_h2d_.bytes /= A_, f_h2d_.time /= A_;
      f_nvr_.bytes /= A_, f_nvr_.time /= A_;
    }
    if (param_home_ == Tier::Nvme) {
      const double pin_miss = std::max(0.0, dev_miss - pin_room);
      if (pin_miss > 0) b_nvr_.add_timed(pin_miss, pin_miss / c.nvme_read_bandwidth + transfers * c.nvme_latency);
    }
  }
  if (A_ > 1 && grads_move_ && st_.stage >= 2 && kept == 0)
    for (const GroupLayout& lg : L_.groups)  // micro-steps after the first fetch the accumulated gradient back
      for (const SubGroup& sg : lg.optimizer_home != Tier::Device ? lg.sub_groups : std::vector<SubGroup>{})
        b_h2d_.add(gb_ * sg.n * (A_ - 1) / A_, c.h2d_bandwidth, c.pcie_latency * (A_ - 1) / A_);
  // Gradients on their way to an NVMe home wait in pinned memory until the optimizer;
  // what does not fit is written back during backward and read again by the optimizer.
  if (opt_home_ == Tier::Nvme) {
    double S4 = 0;
    for (const GroupLayout& lg : L_.groups)
      if (lg.optimizer_home == Tier::Nvme && !lg.frozen) S4 += gb_ * lg.shard;
    grad_spill_ = std::max(0.0, S4 - std::max(0.0, pin_room - (params_move_ ? blocks_s4 : 0.0)));
    if (grad_spill_ > 0) b_nvw_.add(grad_spill_, c.nvme_write_bandwidth, c.nvme_latency);
    // Where a shard is its master weights, the optimizer finds it still in pinned memory
    // from the backward pass as far as the room the waiting gradients leave holds it.
    shard_cache_ = std::max(0.0, pin_room - (S4 - grad_spill_));
  }

  checkpoint_lanes();

  // What cannot overlap: the first group of every micro-step (nothing is fetched across
  // the step boundary) and the last reduction before the optimizer starts.
  double startup = s3_ ? gather_s(L_.groups[0]) : 0.0;
  if (params_move_) startup += c.pcie_latency + sh0_ / c.h2d_bandwidth;
  if (param_home_ == Tier::Nvme) startup += c.nvme_latency + sh0_ / c.nvme_read_bandwidth;
  tail_ = st_.stage >= 2 ? reduce_s(L_.groups[0]) : 0.0;
  if (mics_ && st_.stage >= 2) replica_tail_ = on(replicas_, 2 * gb_ * L_.groups[0].shard);
  if (grads_move_ && st_.stage >= 2) tail_ += c.pcie_latency + sh0_ / c.d2h_bandwidth;

  fwd_ = std::max({fwd_compute_, f_coll_.time, f_h2d_.time, f_nvr_.time, f_d2h_.time, f_nvw_.time}) + startup;
  // With pinned memory full (gradients spilling), a read into it waits for the eviction's
  // write-back: backward's NVMe reads and writes take turns instead of overlapping.
  const double b_nvme = grad_spill_ > 0 ? b_nvr_.time + b_nvw_.time : std::max(b_nvr_.time, b_nvw_.time);
  bwd_ = std::max({bwd_compute_, b_coll_.time, b_h2d_.time, b_d2h_.time, b_nvme});
}

// One group's collectives in a micro-step (per micro-step, as the lanes count; the
// counters per step): its gathers, from the primary shards or hpZ's secondaries, its
// reduce-scatter and MiCS's all-reduce across the groups.
void Planner::group_collectives(const GroupLayout& lg, double pd4, bool again_in_backward, bool part_of_block) {
  if (s3_) {
    // all_gather: from the primary shards; with hpZ only the step's first (the first
    // micro-step's forward; per micro-step, 1 / A of it), the rest from the secondary
    // partitions within the node. A persistent group has no secondary.
    // qwZ: the gathers from the primary shards move int8 blocks (gq bytes); those from
    // the secondaries stay in the working type.
    const bool secondary = hpz_ && !lg.persistent;
    const double gq = gather_bytes(lg);
    if (secondary) {
      f_coll_.add_timed(gq / A_ + pd4 * (A_ - 1.0) / A_, gather_s(lg) / A_ + on(secondary_, pd4) * (A_ - 1.0) / A_);
      sent(shard_, gq, 1, p_.shard_collective_bytes);
      sent(secondary_, pd4, A_ - 1, p_.secondary_collective_bytes);
    } else {
      f_coll_.add_timed(gq, gather_s(lg));
      sent(shard_, gq, A_, p_.shard_collective_bytes);
    }
    const Comm& again = secondary ? secondary_ : shard_;
    const double again_bytes = secondary ? pd4 : gq;
    double& again_counter = secondary ? p_.secondary_collective_bytes : p_.shard_collective_bytes;
    const double again_s = secondary ? on(secondary_, pd4) : gather_s(lg);
    if (again_in_backward) {  // again: tied head, backward
      b_coll_.add_timed(again_bytes, again_s);
      sent(again, again_bytes, A_, again_counter);
    }
    // Parts: the recompute releases each after use and the backward gathers it again.
    if (part_of_block && st_.parted() && st_.checkpointing) {
      b_coll_.add_timed(again_bytes, again_s);
      sent(again, again_bytes, A_, again_counter);
    }
  }
  if (st_.stage >= 2 && !lg.frozen) {  // reduce_scatter (none: frozen)
    b_coll_.add_timed(pd4, reduce_s(lg));
    reduce_sent(lg, A_);
    // MiCS: the step's reduced gradient shard all-reduced across the groups once, in the
    // last micro-step's backward (per micro-step, 1 / A of it), in the reduced type.
    if (mics_) {
      const double rb = 2 * gb_ * lg.shard;
      replica_lane_ += on(replicas_, rb);
      sent(replicas_, rb, 1, p_.replica_collective_bytes);
    }
  }
}

void Planner::checkpoint_lanes() {
  const SimCostModel& c = p_.cost;
  // Checkpoints off the device: each block's input but the last goes home after its
  // forward and comes back one block ahead of its backward (TieredActivationStore).
  if (const auto& cps = L_.strategy.checkpoints; cps.count > 0 && cps.home != Tier::Device) {
    const double moved = double(cps.bytes), n = std::max(0, cps.count - 2);
    for (int i = 0; i < n; ++i) {
      f_d2h_.add(moved, c.d2h_bandwidth, c.pcie_latency);
      b_h2d_.add(moved, c.h2d_bandwidth, c.pcie_latency);
      if (cps.home == Tier::Nvme) {
        f_nvw_.add(moved, c.nvme_write_bandwidth, c.nvme_latency);
        b_nvr_.add(moved, c.nvme_read_bandwidth, c.nvme_latency);
      }
    }
  }
}

void Planner::boundary_lanes() {
  const SimCostModel& c = p_.cost;
  // Stage 1: all-reduce of the full gradient at the step, then its shard to the optimizer.
  if (st_.stage == 1) {
    for (const GroupLayout& lg : L_.groups) {
      if (lg.frozen) continue;
      // All-reduced within the group (the world when flat), then across MiCS's groups.
      stage1_ += coll(2 * gb_ * lg.padded) + (mics_ ? on(replicas_, 2 * gb_ * lg.padded) : 0.0);
      sent(shard_, 2 * gb_ * lg.padded, 1, p_.shard_collective_bytes);
      if (mics_) sent(replicas_, 2 * gb_ * lg.padded, 1, p_.replica_collective_bytes);
    }
    for (const GroupLayout& lg : L_.groups)
      if (lg.optimizer_home != Tier::Device)
        for (const SubGroup& sg : lg.sub_groups) s1_d2h_.add(gb_ * sg.n, c.d2h_bandwidth, c.pcie_latency);
    stage1_ = std::max(stage1_, s1_d2h_.time) + (grads_move_ ? c.pcie_latency + sh0_ / c.d2h_bandwidth : 0.0);
  }

  // Optimizer: per sub-group, read its states while the previous one is updated and the
  // one before written back. The update streams 24 bytes of fp32 states per parameter
  // and the reduced gradient (scaled as it is read), and writes the 16-bit working copy
  // in the same pass; in fp32, stage 3 copies the master weights into the parameter shard
  // (8 more) unless the shard is the master weights (GroupLayout::master_in_shard).
  // The GPU optimizer (offload_optimizer none on GPUs, or the groups past ratio) streams
  // the same bytes through HBM, at the same time as CPU Adam steps the others.
  for (const GroupLayout& lg : L_.groups) {
    if (lg.frozen) continue;  // never stepped
    const double pp = 24.0 + gb_ + (wb_ < 4 ? wb_ : s3_ && !lg.master_in_shard ? 8.0 : 0.0);
    const bool on_device = gpu_opt_ && lg.optimizer_home == Tier::Device;
    (on_device ? opt_device_elems_ : opt_host_elems_) += double(lg.shard);
    (on_device ? opt_device_bytes_ : opt_host_bytes_) += pp * double(lg.shard);
  }
  per_param_ = (opt_host_bytes_ + opt_device_bytes_) / std::max(1.0, opt_host_elems_ + opt_device_elems_);
  opt_compute_ = std::max(opt_host_bytes_ / c.host_bandwidth, opt_device_bytes_ / c.device_bandwidth);
  double& opt_serial = opt_serial_;
  for (const GroupLayout& lg : L_.groups) {
    if (lg.frozen) continue;  // its parameters are not rewritten
    const Tier home = lg.optimizer_home;
    for (const SubGroup& sg : lg.sub_groups) {
      const double b = 4.0 * sg.n;  // one fp32 state
      if (home == Tier::Nvme) {
        // master, exp_avg, exp_avg_sq; where the shard is the master weights, what the
        // backward pass left of it in pinned memory is not read again (shard_cache_).
        const double hit = lg.master_in_shard ? std::min(b, shard_cache_) : 0.0;
        shard_cache_ -= hit;
        o_nvr_.add(3 * b - hit, c.nvme_read_bandwidth, (hit < b ? 3 : 2) * c.nvme_latency);
        o_nvw_.add(3 * b, c.nvme_write_bandwidth, 3 * c.nvme_latency);  // the gradient is dead: not written
      }
      if (!s3_ && home != Tier::Device) opt_serial += c.pcie_latency + b / c.h2d_bandwidth;
      if (!s3_ && home == Tier::Device && !gpu_opt_) opt_serial += 2 * b / c.device_bandwidth;
    }
    if (s3_ && param_home_ == Tier::Nvme && !lg.master_in_shard)  // else written above, as the master
      o_nvw_.add(wb_ * lg.shard, c.nvme_write_bandwidth, c.nvme_latency);
    if (s3_ && param_home_ == Tier::Device && home != Tier::Device)
      o_h2d_.add(wb_ * lg.shard, c.h2d_bandwidth, c.pcie_latency);
  }
  if (grad_spill_ > 0) o_nvr_.add(grad_spill_, c.nvme_read_bandwidth, 0);
  const double first_read = o_nvr_.time / std::max<uint64_t>(1, L_.sub_group_count);
  // Write-back runs behind the updates, but pinned memory is reused lowest address first
  // and only once its write-back has finished (the store's fences), so the next
  // sub-group's states wait for the last one's writes: the write lane paces the loop.
  opt_ = std::max({opt_compute_ + opt_serial, o_nvr_.time, o_h2d_.time, o_nvw_.time}) + first_read;
  // Stages 1 and 2: every rank's updated slice gathered into the replicated parameters.
  if (!s3_)
    for (const GroupLayout& lg : L_.groups) {
      if (lg.frozen) continue;
      refresh_ += coll(wb_ * lg.padded);
      sent(shard_, wb_ * lg.padded, 1, p_.shard_collective_bytes);
    }
}

void Planner::step_time() {
  p_.forward_s = A_ * fwd_;
  // The last micro-step's backward, with MiCS's all-reduces on their lane: they start
  // once the first gradient (one group's backward) is in.
  const double first_grad = bwd_compute_ / std::max(1, G_);
  const double bwd_last = std::max(bwd_, replica_lane_ > 0 ? first_grad + replica_lane_ : 0.0);
  p_.backward_s = (A_ - 1) * bwd_ + bwd_last + tail_ + replica_tail_;
  p_.optimizer_s = opt_;
  if (st_.speculative) {
    // The engine steps a group's sub-groups when the backward pass hands in the next
    // group's gradient: all but the last two groups the backward pass reaches (the last
    // acquires of the schedule) are stepped during the last micro-step's backward. Stage 3
    // steps them on the engine's optimizer lane, a host worker beside the model's thread,
    // so their compute runs beside the backward pass's; stages 1 and 2 on the thread that
    // drives the model, so it adds to it. Their NVMe and PCIe traffic shares backward's
    // lanes and runs behind the rest of it (write-back, the next sub-group's reads).
    const std::vector<int> order = gpt_schedule(s_);
    std::vector<int> last;
    for (auto it = order.rbegin(); it != order.rend() && last.size() < 2; ++it)
      if (std::find(last.begin(), last.end(), *it) == last.end()) last.push_back(*it);
    // Of the shard, the sub-groups that speculate (those with a Next set in the resolved
    // layout) outside the last two groups.
    double early = 0;
    for (int g = 0; g < G_; ++g)
      if (std::find(last.begin(), last.end(), model_of_[g]) == last.end())
        for (const SubGroup& sg : L_.groups[g].sub_groups) early += sg.speculative ? double(sg.n) : 0.0;
    const double f = std::clamp(early / double(std::max<uint64_t>(1, L_.trained_shard_total)), 0.0, 1.0);
    const double b_nvme_r = b_nvr_.time + f * o_nvr_.time, b_nvme_w = b_nvw_.time + f * o_nvw_.time;
    const double speculated = f * (opt_compute_ + opt_serial_);
    const bool lane = R_.lane;
    const double compute = lane ? bwd_compute_ : bwd_compute_ + speculated;
    const double b_nvme = grad_spill_ > 0 ? b_nvme_r + b_nvme_w : std::max(b_nvme_r, b_nvme_w);
    const double last_bwd =
        std::max({compute, b_coll_.time, b_h2d_.time + f * o_h2d_.time, b_d2h_.time, b_nvme, bwd_last});
    p_.backward_s = (A_ - 1) * bwd_ + last_bwd + tail_ + replica_tail_;
    p_.optimizer_s = (1.0 - f) * opt_;  // what is left for step(): the last groups' share
    // The lane is handed work as gradients come in and no faster: what it has not begun by
    // the end of the backward pass is stepped plainly at step().
    if (lane && speculated > last_bwd) p_.optimizer_s += (speculated - last_bwd) / speculated * f * opt_;
  }
  // Checkpoints on their way to NVMe in forward queue behind the optimizer's write-back
  // still running into the step, and a block's forward waits for the one two before to
  // have left (TieredActivationStore): the first micro-step's forward is paced by that queue.
  if (f_nvw_.time > 0) {
    const double queued = std::max(0.0, o_nvw_.time - opt_) + f_nvw_.time;
    p_.forward_s += std::max(0.0, queued - fwd_);
  }
  p_.boundary_s = stage1_ + refresh_;
  p_.compute_s = A_ * (fwd_compute_ + bwd_compute_);
  p_.step_s = p_.forward_s + p_.backward_s + p_.optimizer_s + p_.boundary_s;
  // The NVMe writes of the optimizer run on into the next step's forward and backward.
  write_lane_ = o_nvw_.time + A_ * (b_nvw_.time + f_nvw_.time);
  if (write_lane_ > p_.step_s) p_.step_s = write_lane_;
  p_.exposed_s = std::max(0.0, p_.step_s - p_.compute_s - opt_compute_);
  p_.tokens_per_step = double(w_) * A_ * st_.micro_batch * s_.seq_len;
  p_.tokens_per_s = p_.tokens_per_step / p_.step_s;
  p_.model_flops_per_token = gpt_flops_per_token(s_);
  p_.mfu = p_.tokens_per_s * p_.model_flops_per_token / (double(w_) * cl_.gpu_flops);
}

// Each link's load, and the bandwidth that would hide it behind the compute.
void Planner::link_loads() {
  const SimCostModel& c = p_.cost;
  const double fb_window = p_.compute_s;
  auto link = [&](const std::string& name, double bytes, double bw, double busy, double window) {
    if (bytes <= 0) return;
    p_.links.push_back({name, bytes, bw, busy, window, window > 0 ? bytes / window : 0.0});
  };
  link("nvme read", A_ * (f_nvr_.bytes + b_nvr_.bytes) + o_nvr_.bytes, c.nvme_read_bandwidth,
       A_ * (f_nvr_.time + b_nvr_.time) + o_nvr_.time, fb_window + opt_compute_);
  link("nvme write", A_ * (b_nvw_.bytes + f_nvw_.bytes) + o_nvw_.bytes, c.nvme_write_bandwidth, write_lane_,
       fb_window + opt_compute_);
  link("pcie h2d", A_ * (f_h2d_.bytes + b_h2d_.bytes) + o_h2d_.bytes, c.h2d_bandwidth,
       A_ * (f_h2d_.time + b_h2d_.time) + o_h2d_.time, fb_window);
  link("pcie d2h", A_ * (b_d2h_.bytes + f_d2h_.bytes) + s1_d2h_.bytes, c.d2h_bandwidth,
       A_ * (b_d2h_.time + f_d2h_.time) + s1_d2h_.time, fb_window);
  link("collectives",
       p_.shard_collective_bytes + p_.replica_collective_bytes + p_.secondary_collective_bytes +
           p_.node_collective_bytes + p_.cross_collective_bytes,
       cbw_,
       A_ * (f_coll_.time + b_coll_.time) + stage1_ + refresh_, fb_window);
  // Of them, what crosses between nodes: each rank's share of the node's network.
  if (cl_.nodes > 1 && p_.inter_node_bytes > 0)
    link("network", p_.inter_node_bytes, cl_.collective_bandwidth(), p_.inter_node_bytes / cl_.collective_bandwidth(),
         fb_window);
  if (opt_host_elems_ > 0)
    link("cpu optimizer", opt_host_bytes_, c.host_bandwidth, opt_host_bytes_ / c.host_bandwidth, 0);
  if (opt_device_elems_ > 0)
    link("gpu optimizer", opt_device_bytes_, c.device_bandwidth, opt_device_bytes_ / c.device_bandwidth, 0);
}

void Planner::explain() {
  std::ostringstream why;
  why.precision(3);
  const double hidden_frac = p_.compute_s / p_.step_s;
  const LinkLoad* worst = nullptr;
  for (const LinkLoad& l : p_.links)
    if (l.name != "cpu optimizer" && l.name != "gpu optimizer" && (!worst || l.busy_s > worst->busy_s)) worst = &l;
  if (gpu_opt_ && opt_compute_ > 0.3 * p_.step_s && (!worst || opt_compute_ >= worst->busy_s)) {
    why << "the GPU optimizer: " << per_param_ << " bytes per parameter over " << cl_.hbm_bandwidth / 1e9
        << " GB/s of HBM takes " << opt_compute_ << " s of the " << p_.step_s
        << " s step; a larger micro-batch spreads it over more tokens";
  } else if (opt_compute_ > 0.3 * p_.step_s && (!worst || opt_compute_ >= worst->busy_s)) {
    why << "the CPU optimizer: " << per_param_ << " bytes per parameter over " << cl_.host_bandwidth_per_rank() / 1e9
        << " GB/s of host memory per rank takes " << opt_compute_ << " s of the " << p_.step_s
        << " s step; a larger micro-batch spreads it over more tokens";
  } else if (worst && worst->busy_s > p_.compute_s) {
    why << worst->name << ": " << worst->bytes / GiB << " GiB per rank per step at " << worst->bandwidth / 1e9
        << " GB/s takes " << worst->busy_s << " s, longer than the " << p_.compute_s << " s of compute; hiding it needs "
        << worst->needed / 1e9 << " GB/s per rank";
  } else {
    why << "compute: transfers hide behind the " << p_.compute_s << " s of kernels ("
        << static_cast<int>(100 * hidden_frac + 0.5) << "% of the step)";
  }
  p_.bottleneck = why.str();
}

}  // namespace

Plan make_plan(const GptShape& model_in, const ClusterSpec& cluster, const Strategy& st) {
  validate(cluster);
  validate(st);
  const int world = cluster.world(), gpn = cluster.gpus_per_node;
  if (const int n = st.mics_shard_size; n > 0 && (world % n != 0 || (gpn % n != 0 && n % gpn != 0)))
    throw ConfigError("--mics-shard-size " + std::to_string(n) + " on " + std::to_string(cluster.nodes) + " node(s) of " +
                      std::to_string(gpn) + " GPUs: give a divisor of the world (" + std::to_string(world) +
                      ") that divides a node's GPUs or is a multiple of them");
  if (const int n = st.hpz; n > 1 && (world % n != 0 || gpn % n != 0))
    throw ConfigError("--hpz " + std::to_string(n) + " on nodes of " + std::to_string(gpn) +
                      " GPUs: give a divisor of a node's GPUs (and of the world, " + std::to_string(world) + ")");
  GptShape s = model_in;
  if (st.seq_len > 0) s.seq_len = st.seq_len;
  validate(s);

  auto plan_with = [&](const Strategy& strat) {
    Plan p;
    p.shape = s;
    p.strategy = strat;
    p.cluster = cluster;
    p.world = cluster.world();
    p.params = gpt_param_count(s);
    Planner planner(p, p.strategy);
    planner.cannot_run();
    planner.count_bytes();
    planner.set_engine();
    planner.micro_step_lanes();
    planner.boundary_lanes();
    planner.step_time();
    planner.link_loads();
    planner.explain();
    return p;
  };
  return plan_with(st);
}

}  // namespace strata::plan
