// `strata plan --simulate` (plan.hpp): the real ZeroEngine, TieredStore and prefetcher
// on the sim backend, driven in the GPT's own acquire order (gpt_schedule) with the
// plan's kernel times. This is sim_step.hpp's SyntheticModel with two things it lacks and
// the GPT does: the tied head (group 0 acquired a second time, its gradient buffer held
// from the head's backward to the embedding's) and the recompute of checkpointed blocks.
#include <sys/resource.h>

#include <chrono>

#include "strata/collectives/sim_communicator.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"
#include "strata/runtime/plan/plan_detail.hpp"
#include "strata/runtime/engine/parted_source.hpp"
#include "strata/runtime/train/train.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata::plan {

namespace {

class GptDriver {
 public:
  // parted: blocks are read in parts (WeightSource::num_parts), each part's share of the
  // block's kernel time in proportion to its elements, as the cpu model reads them: parts
  // in order forward, and with checkpointing the recompute releases each part after use
  // and the backward gathers it again (parts in reverse order, each gradient handed back
  // when written).
  GptDriver(std::vector<GroupTimes> times, bool tied, double flops, Stream& compute, bool parted, bool recompute)
      : times_(std::move(times)), tied_(tied), flops_(flops), compute_(compute), parted_(parted),
        recompute_(recompute) {}

  // One micro-batch in gpt_schedule's order: 0, 1..L, L+1, 0 (tied head), L..1; with the
  // engine holding the activation checkpoints, in the order gpt_driver.hpp uses them
  // (checkpoint i is block i's input, L the final residual; group i + 1 is block i).
  double forward_backward(WeightSource& ws) {
    const int n = static_cast<int>(times_.size());
    const int last = n - 1;
    ActivationStore* cp = ws.activation_store();
    seconds_ = 0;
    for (int g = 0; g < n; ++g) {
      if (cp && g < last) cp->begin_write(g);  // the embeddings' output, then each block's
      if (parted_ && g > 0 && g < last) {
        forward_parts(ws, g);
      } else {
        ws.acquire_params(g);
        kernel(times_[g].forward_s);
        if (g != last) ws.release_params(g);
      }
      if (cp && g > 0 && g < last) cp->end_forward(g - 1, true);
    }
    // Final norm (still held) and the head (tied: group 0; untied: in the final group):
    // forward, loss, backward.
    if (tied_) {
      ws.acquire_params(0);
      ws.gradient_buffer(0);
    }
    ws.gradient_buffer(last);
    kernel(times_[tied_ ? 0 : last].head_s + times_[last].backward_s);
    if (tied_) ws.release_params(0);
    ws.release_params(last);
    if (cp) cp->end_forward(last - 1, false);  // the final residual
    ws.grads_ready(last);
    for (int g = last - 1; g >= 1; --g) {
      if (cp) cp->read(g - 1);
      if (parted_) {
        backward_parts(ws, g);
        if (cp) cp->finish(g - 1);
        continue;
      }
      ws.acquire_params(g);
      ws.gradient_buffer(g);
      kernel(times_[g].backward_s);
      ws.release_params(g);
      if (cp) cp->finish(g - 1);
      ws.grads_ready(g);
    }
    if (!tied_) ws.gradient_buffer(0);
    kernel(times_[0].backward_s);  // the embedding's scatter: no weights needed
    ws.grads_ready(0);
    return seconds_;
  }

 private:
  double share(WeightSource& ws, int g, int p) const {
    const uint64_t b = ws.part_begin(g, p), e = p + 1 < ws.num_parts(g) ? ws.part_begin(g, p + 1) : ws.group_numel(g);
    return double(e - b) / double(ws.group_numel(g));
  }
  void forward_parts(WeightSource& ws, int g) {
    for (int p = 0; p < ws.num_parts(g); ++p) {
      ws.acquire_part(g, p);
      kernel(times_[g].forward_s * share(ws, g, p));
      ws.release_part(g, p);
    }
  }
  // The block's backward time holds its recompute (one forward) when checkpointing.
  void backward_parts(WeightSource& ws, int g) {
    const double fwd = recompute_ ? times_[g].forward_s : 0.0;
    if (recompute_) forward_parts(ws, g);
    for (int p = ws.num_parts(g) - 1; p >= 0; --p) {
      ws.acquire_part(g, p);
      ws.part_gradient(g, p);
      kernel((times_[g].backward_s - fwd) * share(ws, g, p));
      ws.release_part(g, p);
      ws.part_grads_ready(g, p);
    }
  }
  void kernel(double s) {
    if (s <= 0) return;
    compute_.compute(s * flops_, [] {});
    compute_.record().wait();
    seconds_ += s;
  }
  std::vector<GroupTimes> times_;
  bool tied_;
  double flops_;
  Stream& compute_;
  bool parted_ = false, recompute_ = false;
  double seconds_ = 0;
};

}  // namespace

SimulateReport simulate_plan(const Plan& plan, int steps) {
  if (steps < 1) throw ConfigError("--simulate-steps must be at least 1");
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<GptGroup> groups = gpt_groups(plan.shape);
  const std::vector<GroupTimes> times = group_times(plan.shape, plan.cluster, plan.strategy);
  // The gpt_schedule order must be the one the driver follows.
  std::vector<int> order = gpt_schedule(plan.shape);
  STRATA_CHECK(order.size() == 2 * groups.size() - (plan.shape.tied() ? 1 : 2),
               "gpt_schedule changed: the plan's driver follows 0, 1..L, L+1, 0 (tied head), L..1");

  EngineOptions eo = plan.engine;
  const bool on_nvme = eo.optimizer_home == Tier::Nvme || (eo.stage == 3 && eo.param_home == Tier::Nvme) ||
                       eo.checkpoints.home == Tier::Nvme;
  if (on_nvme) eo.store.nvme.paths = {"(simulated nvme)"};
  eo.optimizer_threads = 1;
  std::vector<std::vector<uint64_t>> parts = plan_parts(plan.shape, plan.strategy);
  const std::vector<GroupSpec> specs = gpt_group_specs(plan.shape, parts);  // as strata train cuts them
  const bool parted = specs.size() != groups.size();

  SimulateReport r;
  r.steps = steps;
  r.device_budget_less_activations = plan.model_activations;
  {
    auto device = make_sim_device(plan.cost);
    auto comm = coll::make_sim_communicator(0, plan.world, plan.cost);
    auto compute = device->create_stream("compute");
    GptDriver net(times, plan.shape.tied(), plan.cost.device_flops, *compute, parted, plan.strategy.checkpointing);
    ZeroEngine engine(*device, *comm, *comm, eo, specs, plan.ablation);
    if (!parted) engine.set_schedule(order);  // parts: the engine learns their order in the first step
    PartedSource source(engine, std::move(parts));
    r.device = device->description();
    double t_prev = device->now();
    EngineStats prev = engine.stats();
    for (int step = 0; step < steps; ++step) {
      double kernels = 0;
      for (int m = 0; m < eo.gradient_accumulation_steps; ++m) {
        engine.begin_micro_step();
        kernels += net.forward_backward(source);
      }
      engine.step();
      const double t = device->now();
      const EngineStats now = engine.stats();
      r.step_s.push_back(t - t_prev);
      if (step == steps - 1) {
        r.step_s_steady = t - t_prev;
        r.compute_s = kernels;
        r.exposed_s = now.exposed_wait_s - prev.exposed_wait_s + now.optimizer_wait_s + now.speculation_wait_s;
        r.optimizer_wait_s = now.optimizer_wait_s;
        r.speculation_wait_s = now.speculation_wait_s;
        r.optimizer_s = now.optimizer_s;
        for (int a = 0; a < kTierCount; ++a)
          for (int b = 0; b < kTierCount; ++b)
            r.bytes_moved[a][b] = now.store.bytes_moved[a][b] - prev.store.bytes_moved[a][b];
      }
      t_prev = t;
      prev = now;
    }
    for (int t = 0; t < kTierCount; ++t) {
      r.peak[t] = prev.store.tiers[t].peak;
      r.budget[t] = prev.store.tiers[t].budget;
    }
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  r.peak_rss_bytes = double(ru.ru_maxrss) * 1024;
  return r;
}

}  // namespace strata::plan
