// `strata plan --search` (plan.hpp): every strategy in the space, planned analytically,
// ranked by tokens/s among those that fit, and each rejected one with its reason.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"

namespace strata::plan {

namespace {

// The node layouts to try: the base's, then flat, MiCS and hpZ with a node a group where
// there are nodes, and ZeRO++'s quantized collectives flat and with hpZ (qwZ and qgZ; at
// stages 1 and 2 the search drops what does not apply).
struct NodeLayout {
  int mics = 0, hpz = 1;
  bool qwz = false, qgz = false;
  bool operator==(const NodeLayout&) const = default;
};

std::vector<NodeLayout> node_layouts(const ClusterSpec& cluster, const Strategy& base, const SearchSpace& space) {
  std::vector<NodeLayout> layouts{{base.mics_shard_size, base.hpz, base.qwz, base.qgz}};
  if (space.node_layouts && cluster.nodes > 1 && cluster.gpus_per_node > 1) {
    const int gpn = cluster.gpus_per_node;
    std::vector<NodeLayout> more{{0, 1}, {gpn, 1}, {0, gpn}};
    if (space.quantized) {
      more.push_back({0, 1, true, true});
      more.push_back({0, gpn, true, true});
    }
    for (const NodeLayout& l : more)
      if (std::find(layouts.begin(), layouts.end(), l) == layouts.end()) layouts.push_back(l);
  }
  return layouts;
}

// Each candidate's verdict, against the fastest that fits (the first, once sorted).
void explain(std::vector<Candidate>& out) {
  const Plan* best = out.empty() || !out.front().plan.fits ? nullptr : &out.front().plan;
  for (Candidate& c : out) {
    std::ostringstream v;
    if (best && &c.plan == best) {
      c.chosen = true;
      v << "chosen: fastest that fits";
    } else if (!c.plan.fits) {
      v << "doesn't fit: ";
      for (size_t i = 0; i < c.plan.problems.size(); ++i) {
        const std::string& p = c.plan.problems[i];
        v << (i ? "; " : "") << p.substr(0, p.find(" per rank"));  // "device short by 3.2 GiB: needs 35 GiB"
      }
    } else {
      const double slower = best->tokens_per_s / c.plan.tokens_per_s - 1;
      v.precision(3);
      v << "slower by " << 100 * slower << "% (" << c.plan.tokens_per_s << " vs " << best->tokens_per_s
        << " tokens/s; " << c.plan.bottleneck.substr(0, c.plan.bottleneck.find(':')) << " bound)";
    }
    c.verdict = v.str();
  }
}

}  // namespace

std::vector<Candidate> search(const GptShape& model, const ClusterSpec& cluster, const Strategy& base,
                              const SearchSpace& space) {
  validate(cluster);
  std::vector<Candidate> out;
  for (const NodeLayout& layout : node_layouts(cluster, base, space))
  for (int stage : space.stages)
    for (OffloadDevice pd : space.param)
      for (OffloadDevice od : space.optimizer)
        for (int mb : space.micro_batches)
          for (bool ckpt : space.checkpointing)
            for (double ratio : space.optimizer_ratios)
              for (OffloadDevice cps : space.checkpoints) {
              if (stage < 3 && pd != OffloadDevice::None) continue;  // not a configuration
              if (!ckpt && cps != OffloadDevice::None) continue;     // no checkpoints to move
              // A split needs a GPU optimizer and a host share.
              if (ratio < 1.0 && (od == OffloadDevice::None || cluster.cpu_backend)) continue;
              if (layout.hpz > 1 && stage != 3) continue;  // hpZ partitions stage 3's parameters
              // qwZ quantizes stage 3's gathers, qgZ the reduce-scatters of 2 and 3: a
              // quantized layout at a stage where neither applies, or only qgZ where the
              // plain qgZ layout is tried already, is the same as another.
              const bool qwz = layout.qwz && stage == 3, qgz = layout.qgz && stage >= 2;
              if ((layout.qwz || layout.qgz) && !(layout == NodeLayout{base.mics_shard_size, base.hpz, base.qwz, base.qgz}) &&
                  !qwz && !(qgz && layout.hpz == 1))
                continue;
              Strategy st = base;
              st.mics_shard_size = layout.mics;
              st.hpz = layout.hpz;
              st.qwz = qwz;
              st.qgz = qgz;
              st.stage = stage;
              st.offload_param = pd;
              st.offload_optimizer = od;
              st.micro_batch = mb;
              st.checkpointing = ckpt;
              st.optimizer_ratio = ratio;
              st.checkpoints = cps;
              // Tile factors (stage 3) where whole blocks do not fit: tiles add a gather per
              // tile and cannot win where the block fits.
              bool whole_fits = false;
              for (int tf : space.tile_factors) {
                if (tf > 1 && (stage != 3 || whole_fits)) continue;
                st.tile_factor = tf;
                // The base's look-ahead, then shallower ones while nothing fits.
                std::vector<int> depths{base.prefetch_groups};
                if (stage == 3)
                  for (int d : space.shallower_prefetch)
                    if (d >= 0 && d < depths.back()) depths.push_back(d);
                for (int depth : depths) {
                  st.prefetch_groups = depth;
                  Candidate c;
                  c.strategy = st;
                  try {
                    c.plan = make_plan(model, cluster, st);
                  } catch (const ConfigError&) {
                    break;  // a tile factor that does not divide this model's linears
                  }
                  // As planned: checkpoints asked for in pinned memory go to NVMe where it is short.
                  c.strategy = c.plan.strategy;
                  const bool fits = c.plan.fits;
                  // A shallower look-ahead can fit only where the device alone is short,
                  // by no more than the look-ahead's bytes.
                  bool closer = !fits && c.plan.tiers[0].short_by() <= c.plan.lookahead_bytes;
                  for (size_t t = 1; t < c.plan.tiers.size(); ++t) closer = closer && c.plan.tiers[t].fits();
                  if (tf == 1) whole_fits = whole_fits || fits;
                  // The resolved layout's per-group tensors are what a plan weighs (a 1T
                  // model in tiles: thousands of groups); a search keeps thousands of
                  // plans, so it keeps their figures and drops those (make_plan of the
                  // chosen strategy gives them again).
                  c.plan.resolved.layout.groups = {};
                  c.plan.resolved.layout.checkpoints = {};
                  out.push_back(std::move(c));
                  if (!closer) break;
                }
              }
            }
  // Fitting ones first, fastest (tokens/s) first; then the others, nearest to fitting first.
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.plan.fits != b.plan.fits) return a.plan.fits;
    if (a.plan.fits) return a.plan.tokens_per_s > b.plan.tokens_per_s;
    double sa = 0, sb = 0;
    for (const auto& t : a.plan.tiers) sa += t.short_by();
    for (const auto& t : b.plan.tiers) sb += t.short_by();
    return sa < sb;
  });
  explain(out);
  return out;
}

}  // namespace strata::plan
