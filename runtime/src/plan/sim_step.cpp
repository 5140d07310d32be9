#include "strata/runtime/plan/sim_step.hpp"

#include "sim_run.hpp"
#include "strata/collectives/sim_communicator.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/engine/parted_source.hpp"

namespace strata {

namespace {

// The simulator's model of arbitrary groups (the simple form of SimGpt: no head, no
// recompute, groups whole): forward g = 0..G-1 acquire_params, compute, release_params;
// backward g = G-1..0 acquire_params, gradient_buffer, compute (2x), release_params,
// grads_ready. Its kernels are Stream::compute of the group's FLOPs, which its thread
// waits for.
class SyntheticModel final : public SimModel {
 public:
  SyntheticModel(std::vector<SimGroup> groups, double device_flops, Stream& compute)
      : groups_(std::move(groups)), device_flops_(device_flops), compute_(compute) {}

  StepResult step(ZeroEngine& engine, WeightSource& source, int micro_batches) override {
    return run_step(engine, micro_batches, [&](int, float) {
      forward_backward(source);
      return 0.0;
    });
  }
  double take_compute_s() override {
    const double s = flops_ / device_flops_;
    flops_ = 0;
    return s;
  }

 private:
  void forward_backward(WeightSource& ws) {
    const int n = static_cast<int>(groups_.size());
    for (int g = 0; g < n; ++g) {
      ws.acquire_params(g);
      run_group(groups_[g].forward_flops);
      ws.release_params(g);
    }
    for (int g = n - 1; g >= 0; --g) {
      ws.acquire_params(g);
      ws.gradient_buffer(g);
      run_group(2 * groups_[g].forward_flops);
      ws.release_params(g);
      ws.grads_ready(g);
    }
  }
  void run_group(double flops) {
    compute_.compute(flops, [] {});
    compute_.record().wait();  // the model's thread goes on once its kernels are done
    flops_ += flops;
  }
  std::vector<SimGroup> groups_;
  double device_flops_;
  Stream& compute_;
  double flops_ = 0;  // since take_compute_s
};

void check_groups(const std::vector<SimGroup>& groups) {
  if (groups.empty()) throw ConfigError("synthetic model: no parameter groups");
  for (const SimGroup& g : groups) {
    if (g.numel == 0) throw ConfigError("synthetic model: group '" + g.name + "' has no parameters");
    if (g.forward_flops < 0) throw ConfigError("synthetic model: group '" + g.name + "' has negative FLOPs");
  }
}

SimStepStats step_stats(const StepResult& r, double seconds, double compute_s) {
  SimStepStats s;
  s.time_s = seconds;
  s.compute_s = compute_s;
  s.exposed_wait_s = r.after.exposed_wait_s - r.before.exposed_wait_s;
  s.optimizer_s = r.after.optimizer_s;
  s.optimizer_wait_s = r.after.optimizer_wait_s;
  s.speculation_wait_s = r.after.speculation_wait_s;
  for (int a = 0; a < kTierCount; ++a)
    for (int b = 0; b < kTierCount; ++b)
      s.bytes_moved[a][b] = r.after.store.bytes_moved[a][b] - r.before.store.bytes_moved[a][b];
  return s;
}

}  // namespace

SimRunResult run_simulation(const SimModelSpec& model, const SimRunOptions& opts) {
  if (opts.steps < 1) throw ConfigError("simulate_training: steps must be at least 1");
  EngineOptions eo = opts.engine;
  const bool on_nvme = eo.optimizer_home == Tier::Nvme || (eo.stage == 3 && eo.param_home == Tier::Nvme) ||
                       eo.checkpoints.home == Tier::Nvme;
  if (on_nvme && eo.store.nvme.paths.empty()) eo.store.nvme.paths = {"(simulated nvme)"};
  eo.optimizer_threads = 1;  // the optimizer's math never runs on sim

  auto device = make_sim_device(opts.cost);
  const int shard = opts.shard_ranks > 0 ? opts.shard_ranks : opts.world;
  if (shard > opts.world || opts.world % shard != 0)
    throw ConfigError("simulate_training: " + std::to_string(shard) + " ranks a shard group in a world of " +
                      std::to_string(opts.world));
  auto comm = coll::make_sim_communicator(opts.rank % shard, shard, opts.cost);
  auto sub = [&](int ranks, int rank, double bandwidth) {
    SimCostModel c = opts.cost;
    if (bandwidth > 0) c.collective_bandwidth = bandwidth;
    return coll::make_sim_communicator(rank, ranks, c);
  };
  std::unique_ptr<coll::Communicator> replicas, hpz;
  if (shard < opts.world) replicas = sub(opts.world / shard, opts.rank / shard, opts.replica_bandwidth);
  if (eo.hpz_partition_size > 1) hpz = sub(eo.hpz_partition_size, comm->rank() % eo.hpz_partition_size,
                                           opts.secondary_bandwidth);
  auto compute = device->create_stream("compute");
  std::unique_ptr<SimModel> net = model.make(*compute);
  ZeroEngine engine(*device, *comm, *comm, eo, model.groups, opts.ablation, replicas.get(), hpz.get());
  if (!model.schedule.empty()) engine.set_schedule(model.schedule);
  std::unique_ptr<PartedSource> parted;
  if (!model.parts.empty()) parted = std::make_unique<PartedSource>(engine, model.parts);
  WeightSource& source = parted ? static_cast<WeightSource&>(*parted) : engine;

  SimRunResult out;
  out.device = device->description();
  double t_prev = device->now();
  for (int step = 0; step < opts.steps; ++step) {
    const StepResult r = net->step(engine, source, eo.gradient_accumulation_steps);
    const double t = device->now();
    out.steps.push_back(step_stats(r, t - t_prev, net->take_compute_s()));
    t_prev = t;
  }
  out.engine = engine.stats();
  out.tiers = out.engine.store.tiers;
  return out;
}

SimRunResult simulate_training(const std::vector<SimGroup>& groups, const SimRunOptions& opts) {
  check_groups(groups);
  SimModelSpec spec;
  for (const SimGroup& g : groups) spec.groups.push_back({g.name, g.numel, InitKind::Normal, 0.02f, {}});
  if (opts.give_schedule) {
    const int n = static_cast<int>(groups.size());
    for (int g = 0; g < n; ++g) spec.schedule.push_back(g);
    for (int g = n - 1; g >= 0; --g) spec.schedule.push_back(g);
  }
  spec.make = [&](Stream& compute) {
    return std::make_unique<SyntheticModel>(groups, opts.cost.device_flops, compute);
  };
  return run_simulation(spec, opts);
}

}  // namespace strata
