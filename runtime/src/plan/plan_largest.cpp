// `strata plan --largest` (plan.hpp): the deepest model of one width whose plan fits,
// found by doubling the rung until a plan does not fit and bisecting between the last
// rung that fit and the first that did not.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"

namespace strata::plan {

namespace {

// The tier nearest its budget for a plan that fits ("nvme 97% of 64.0 GiB"); for one that
// does not, its first problem (which names the tier short and by how much, or what no
// budget fixes).
std::string binding_of(const Plan& p) {
  if (!p.fits) return p.problems.empty() ? std::string("does not fit") : p.problems.front();
  const TierPlan* most = nullptr;
  for (const TierPlan& t : p.tiers)
    if (t.budget > 0 && (!most || t.need.total() / t.budget > most->need.total() / most->budget)) most = &t;
  if (!most) return "no tier holds anything";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s %.0f%% of %.1f GiB", to_string(most->tier), 100 * most->need.total() / most->budget,
                most->budget / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace

LargestFit largest_fit(const GptShape& width, const ClusterSpec& cluster, const Strategy& strategy, int layer_step,
                       int max_layers) {
  if (layer_step < 1) throw ConfigError("--layer-step is " + std::to_string(layer_step) + ": give 1 or more layers");
  if (max_layers < layer_step || max_layers > kMaxLadderLayers)
    throw ConfigError("--max-layers is " + std::to_string(max_layers) + ": give from --layer-step (" +
                      std::to_string(layer_step) + ") to " + std::to_string(kMaxLadderLayers));
  LargestFit out;
  out.layer_step = layer_step;
  out.max_layers = max_layers;
  std::map<int, int> at;  // rung -> index in out.probed
  auto probe = [&](int k) {
    auto it = at.find(k);
    if (it != at.end()) return out.probed[it->second].fits;
    LadderRung r;
    r.rung = k;
    r.shape = width;
    r.shape.layers = k * layer_step;
    r.plan = make_plan(r.shape, cluster, strategy);  // throws ConfigError for a shape it refuses
    r.params = r.plan.params;
    r.fits = r.plan.fits;
    r.binding = binding_of(r.plan);
    at[k] = static_cast<int>(out.probed.size());
    out.probed.push_back(std::move(r));
    return out.probed.back().fits;
  };
  const int top = max_layers / layer_step;
  if (!probe(1)) {
    out.next = 0;
    return out;
  }
  // Double until a rung does not fit (or the top is reached), then bisect (lo fits, hi not).
  int lo = 1, hi = -1;
  while (hi < 0) {
    const int k = std::min(top, 2 * lo);
    if (k == lo) break;  // lo is the top rung and fits
    if (probe(k))
      lo = k;
    else
      hi = k;
  }
  while (hi > 0 && hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (probe(mid))
      lo = mid;
    else
      hi = mid;
  }
  out.largest = at[lo];
  out.next = hi > 0 ? at[hi] : -1;
  return out;
}

}  // namespace strata::plan
