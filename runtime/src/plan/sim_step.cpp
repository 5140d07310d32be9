#include "strata/runtime/plan/sim_step.hpp"

#include "strata/collectives/sim_communicator.hpp"
#include "strata/core/error.hpp"

namespace strata {

SyntheticModel::SyntheticModel(std::vector<SimGroup> groups, Stream& compute)
    : groups_(std::move(groups)), compute_(compute) {
  if (groups_.empty()) throw ConfigError("synthetic model: no parameter groups");
  for (const SimGroup& g : groups_) {
    if (g.numel == 0) throw ConfigError("synthetic model: group '" + g.name + "' has no parameters");
    if (g.forward_flops < 0) throw ConfigError("synthetic model: group '" + g.name + "' has negative FLOPs");
  }
}

std::vector<GroupSpec> SyntheticModel::group_specs() const {
  std::vector<GroupSpec> specs;
  for (const SimGroup& g : groups_) specs.push_back({g.name, g.numel, InitKind::Normal, 0.02f, {}});
  return specs;
}

std::vector<int> SyntheticModel::schedule() const {
  const int n = static_cast<int>(groups_.size());
  std::vector<int> s;
  for (int g = 0; g < n; ++g) s.push_back(g);
  for (int g = n - 1; g >= 0; --g) s.push_back(g);
  return s;
}

double SyntheticModel::run_group(double flops) {
  compute_.compute(flops, [] {});
  compute_.record().wait();  // the model's thread goes on once its kernels are done
  return flops;
}

double SyntheticModel::forward_backward(WeightSource& ws) {
  const int n = static_cast<int>(groups_.size());
  double flops = 0;
  for (int g = 0; g < n; ++g) {
    ws.acquire_params(g);
    flops += run_group(groups_[g].forward_flops);
    ws.release_params(g);
  }
  for (int g = n - 1; g >= 0; --g) {
    ws.acquire_params(g);
    ws.gradient_buffer(g);
    flops += run_group(2 * groups_[g].forward_flops);
    ws.release_params(g);
    ws.grads_ready(g);
  }
  return flops;
}

SimRunResult simulate_training(const std::vector<SimGroup>& model, const SimRunOptions& opts) {
  if (opts.steps < 1) throw ConfigError("simulate_training: steps must be at least 1");
  EngineOptions eo = opts.engine;
  const bool on_nvme = eo.optimizer_home == Tier::Nvme || (eo.stage == 3 && eo.param_home == Tier::Nvme);
  if (on_nvme && eo.store.nvme.paths.empty()) eo.store.nvme.paths = {"(simulated nvme)"};
  eo.optimizer_threads = 1;  // the optimizer's math never runs on sim

  auto device = make_sim_device(opts.cost);
  auto comm = coll::make_sim_communicator(opts.rank, opts.world, opts.cost);
  auto compute = device->create_stream("compute");
  SyntheticModel net(model, *compute);
  ZeroEngine engine(*device, *comm, *comm, eo, net.group_specs());
  if (opts.give_schedule) engine.set_schedule(net.schedule());

  SimRunResult out;
  out.device = device->description();
  double t_prev = device->now();
  EngineStats prev = engine.stats();
  for (int step = 0; step < opts.steps; ++step) {
    double flops = 0;
    for (int m = 0; m < eo.gradient_accumulation_steps; ++m) {
      engine.begin_micro_step();
      flops += net.forward_backward(engine);
    }
    engine.step();
    const double t = device->now();
    EngineStats now = engine.stats();
    SimStepStats s;
    s.time_s = t - t_prev;
    s.compute_s = flops / opts.cost.device_flops;
    s.exposed_wait_s = now.exposed_wait_s - prev.exposed_wait_s;
    s.optimizer_s = now.optimizer_s;
    s.optimizer_wait_s = now.optimizer_wait_s;
    s.speculation_wait_s = now.speculation_wait_s;
    for (int a = 0; a < kTierCount; ++a)
      for (int b = 0; b < kTierCount; ++b)
        s.bytes_moved[a][b] = now.store.bytes_moved[a][b] - prev.store.bytes_moved[a][b];
    out.steps.push_back(s);
    t_prev = t;
    prev = now;
  }
  out.engine = engine.stats();
  out.tiers = out.engine.store.tiers;
  return out;
}

}  // namespace strata
