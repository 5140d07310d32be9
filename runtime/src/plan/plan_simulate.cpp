// `strata plan --simulate` (plan.hpp): the real ZeroEngine, TieredStore and prefetcher
// on the sim backend, driven by SimGpt (the GPT's own acquire order, gpt_driver.hpp, with
// the plan's kernel times) through the step driver, on the one simulation path
// (sim_run.hpp) that simulate_training runs too.
#include <sys/resource.h>

#include <chrono>

#include "sim_gpt.hpp"
#include "sim_run.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"
#include "strata/runtime/plan/plan_detail.hpp"
#include "strata/runtime/train/train.hpp"

namespace strata::plan {

namespace {

// SimGpt with the token buffers it is handed (zeros: it reads none).
class SimGptRun final : public SimModel {
 public:
  SimGptRun(const Plan& plan, bool checkpoints_from_source, Stream& compute)
      : gpt_(plan.shape, options(plan, checkpoints_from_source), group_times(plan.shape, plan.cluster, plan.strategy),
             plan.cost.device_flops, compute),
        batches_(gpt_, 1) {}

  StepResult step(ZeroEngine& engine, WeightSource& source, int micro_batches) override {
    batches_.micro_batches = micro_batches;
    return run_step(engine, gpt_, source, batches_);
  }
  double take_compute_s() override { return gpt_.take_compute_s(); }

 private:
  static GptOptions options(const Plan& plan, bool checkpoints_from_source) {
    GptOptions o;
    o.micro_batch = plan.strategy.micro_batch;
    o.checkpointing = plan.strategy.checkpointing ? ActivationCheckpointing::PerBlock : ActivationCheckpointing::None;
    o.precision = plan.engine.precision;
    o.checkpoints_from_source = checkpoints_from_source;
    return o;
  }
  SimGpt gpt_;
  TokenBatches batches_;
};

}  // namespace

SimulateReport simulate_plan(const Plan& plan, int steps) {
  if (steps < 1) throw ConfigError("--simulate-steps must be at least 1");
  if (plan.strategy.frozen_fraction > 0)
    throw ConfigError("--simulate runs strata train's model, whose groups are all trained: drop --frozen-fraction "
                      "to simulate, or plan without --simulate");
  if (plan.strategy.qwz || plan.strategy.qgz)
    throw ConfigError("--simulate runs the engine on the sim backend, and qwZ and qgZ quantize on the host, which it "
                      "cannot time: drop --quantized-weights and --quantized-gradients to simulate, or plan without "
                      "--simulate");
  const auto t0 = std::chrono::steady_clock::now();
  SimRunOptions o;
  o.steps = steps;
  o.world = plan.world;
  o.cost = plan.cost;
  o.engine = plan.engine;
  o.ablation = plan.ablation;
  // MiCS's groups and hpZ's, as the planner sees their links (plan.cost's bandwidth is the
  // shard group's).
  const ClusterSpec& cl = plan.cluster;
  const int n = plan.strategy.mics_shard_size;
  if (n > 0 && n < plan.world) {
    o.shard_ranks = n;
    o.replica_bandwidth = plan.world > cl.gpus_per_node ? cl.collective_bandwidth() : cl.intra_node;
  }
  if (plan.strategy.hpz > 1) o.secondary_bandwidth = plan.strategy.hpz > cl.gpus_per_node ? cl.collective_bandwidth()
                                                                                             : cl.intra_node;
  SimModelSpec spec;
  spec.parts = plan_parts(plan.shape, plan.strategy);
  spec.groups = gpt_group_specs(plan.shape, spec.parts);  // as strata train cuts them
  // Parts: the engine learns their order in the first step, as in strata train.
  if (spec.groups.size() == spec.parts.size()) spec.schedule = gpt_schedule(plan.shape);
  const bool checkpoints_from_source = plan.engine.checkpoints.count > 0;  // the engine holds them
  spec.make = [&](Stream& compute) { return std::make_unique<SimGptRun>(plan, checkpoints_from_source, compute); };
  const SimRunResult run = run_simulation(spec, o);

  SimulateReport r;
  r.steps = steps;
  r.device_budget_less_activations = plan.model_activations;
  r.device = run.device;
  for (const SimStepStats& s : run.steps) r.step_s.push_back(s.time_s);
  const SimStepStats& last = run.steps.back();
  r.step_s_steady = last.time_s;
  r.compute_s = last.compute_s;
  r.exposed_s = last.exposed_wait_s + last.optimizer_wait_s + last.speculation_wait_s;
  r.optimizer_wait_s = last.optimizer_wait_s;
  r.speculation_wait_s = last.speculation_wait_s;
  r.optimizer_s = last.optimizer_s;
  r.bytes_moved = last.bytes_moved;
  r.shard_collective_bytes = double(run.engine.shard_collective_bytes) / steps;
  r.replica_collective_bytes = double(run.engine.replica_collective_bytes) / steps;
  r.secondary_collective_bytes = double(run.engine.secondary_collective_bytes) / steps;
  r.node_collective_bytes = double(run.engine.node_collective_bytes) / steps;
  r.cross_collective_bytes = double(run.engine.cross_collective_bytes) / steps;
  for (int t = 0; t < kTierCount; ++t) {
    r.peak[t] = run.tiers[t].peak;
    r.budget[t] = run.tiers[t].budget;
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  r.peak_rss_bytes = double(ru.ru_maxrss) * 1024;
  return r;
}

}  // namespace strata::plan
