// The ZeRO engine's schedule on the sim backend (docs/architecture.md, "The sim backend
// and the trace"). The real engine, tiered store and prefetcher run a synthetic model whose
// operations take the cost model's time on a virtual clock, so the tests assert what a
// step's time must be from first principles, deterministically:
//  - with ample bandwidth, transfers hide behind compute: step time = compute time;
//  - with one scarce link, the step takes the time that link needs for the step's bytes,
//    counted here from the sizes and the cost model, not from the engine;
//  - without prefetch the same step is slower; peak bytes per tier stay in budget; two
//    runs give bit-identical times; the Chrome trace holds the lanes and the waits.
// Only virtual time is asserted, never the wall clock.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "strata/collectives/communicator.hpp"
#include "strata/runtime/plan/sim_step.hpp"

using namespace strata;

namespace {

constexpr int kGroups = 8;
constexpr uint64_t kNumel = uint64_t{1} << 22;  // 4 Mi parameters per group: 16 MiB in fp32
constexpr double kTokens = 8192;                // per micro-batch

std::vector<SimGroup> model(double tokens = kTokens) {
  std::vector<SimGroup> m;
  for (int g = 0; g < kGroups; ++g) m.push_back({"block." + std::to_string(g), kNumel, 2.0 * kNumel * tokens});
  return m;
}

// Every link 1000x the default, latencies ~0: nothing but compute should take time.
SimCostModel ample() {
  SimCostModel c;
  c.device_flops = 100e12;
  c.device_bandwidth *= 1000;
  c.h2d_bandwidth *= 1000;
  c.d2h_bandwidth *= 1000;
  c.nvme_read_bandwidth *= 1000;
  c.nvme_write_bandwidth *= 1000;
  c.collective_bandwidth *= 1000;
  c.host_bandwidth *= 1000;
  c.pcie_latency = c.nvme_latency = c.collective_latency = 1e-7;
  return c;
}

// ZeRO-3, parameters and optimizer states on NVMe, one optimizer sub-group per group.
SimRunOptions nvme_run(const SimCostModel& cost, int world = 1) {
  SimRunOptions o;
  o.steps = 4;
  o.world = world;
  o.cost = cost;
  o.engine.stage = 3;
  o.engine.param_home = Tier::Nvme;
  o.engine.optimizer_home = Tier::Nvme;
  o.engine.sub_group_elems = kNumel;
  o.engine.prefetch_bucket_elems = 3 * kNumel;
  o.engine.store.device_budget = 256ull << 20;
  o.engine.store.pinned_budget = 512ull << 20;
  return o;
}

double compute_time(const std::vector<SimGroup>& m, const SimCostModel& c) {
  double flops = 0;
  for (const SimGroup& g : m) flops += 3 * g.forward_flops;  // forward + backward (2x)
  return flops / c.device_flops;
}

// The steady state: every step after the first (which starts from an idle machine).
const SimStepStats& steady(const SimRunResult& r) { return r.steps.back(); }

void expect_in_budget(const SimRunResult& r, const std::string& label) {
  for (int t = 0; t < kTierCount; ++t) {
    EXPECT_GT(r.tiers[t].peak, 0u) << label << ": nothing was ever held in the " << to_string(Tier(t)) << " tier";
    EXPECT_LE(r.tiers[t].peak, r.tiers[t].budget) << label << ", " << to_string(Tier(t));
  }
}

void report(const std::string& what, double step, double reference, const char* ref_name) {
  std::cout << "[ figures  ] " << what << ": step " << step * 1e3 << " ms, " << ref_name << " " << reference * 1e3
            << " ms (" << (step / reference - 1) * 100 << "%)\n";
}

}  // namespace

TEST(SimEngine, WithAmpleBandwidthAStepTakesTheComputeTime) {
  const auto m = model();
  SimRunResult r = simulate_training(m, nvme_run(ample()));
  const double compute = compute_time(m, ample());
  const SimStepStats& s = steady(r);
  report("ample bandwidth", s.time_s, compute, "compute");
  EXPECT_DOUBLE_EQ(s.compute_s, compute);
  EXPECT_NEAR(s.time_s, compute, 0.05 * compute);
  EXPECT_GE(s.time_s, compute) << "a step cannot beat its own compute";
  EXPECT_GT(s.bytes_moved[2][1], 0u) << "nothing came from NVMe: the test would not test offload";
  EXPECT_GT(r.engine.prefetched, 0u);
  expect_in_budget(r, "ample bandwidth");
}

TEST(SimEngine, WithScarceNvmeReadBandwidthAStepTakesTheReadTime) {
  SimCostModel c = ample();
  c.nvme_read_bandwidth = 1e9;  // 1 GB/s: the one slow link
  c.nvme_latency = 100e-6;
  const auto m = model();
  SimRunResult r = simulate_training(m, nvme_run(c));
  // What a step must read from NVMe, from the layout alone: each group's parameter shard
  // once (forward; backward finds it cached), and per optimizer sub-group both moments
  // (the gradient arrives from the device and is still in pinned memory). In fp32 with
  // one sub-group per group and both homes on NVMe the shard is the master weights
  // (GroupLayout::master_in_shard): the optimizer finds it where the backward pass left
  // it, and no second copy is read. World size 1: a shard is the whole group.
  const double shard_bytes = 4.0 * kNumel;
  const int reads = kGroups /* params, the master weights */ + 2 * kGroups /* exp_avg, exp_avg_sq */;
  const double transfer = reads * (c.nvme_latency + shard_bytes / c.nvme_read_bandwidth);
  const SimStepStats& s = steady(r);
  report("scarce NVMe read bandwidth", s.time_s, transfer, "NVMe read time");
  EXPECT_EQ(s.bytes_moved[2][1], static_cast<uint64_t>(reads * shard_bytes))
      << "the engine read other bytes than the layout says it must";
  EXPECT_NEAR(s.time_s, transfer, 0.05 * transfer);
  EXPECT_GE(s.time_s, transfer) << "a step cannot beat its slowest link";
  EXPECT_GT(s.time_s, 10 * s.compute_s) << "the test means transfers to dominate";
  expect_in_budget(r, "scarce NVMe read bandwidth");
}

TEST(SimEngine, WithScarceCollectiveBandwidthAStepTakesTheCollectiveTime) {
  SimCostModel c = ample();
  c.collective_bandwidth = 10e9;  // 10 GB/s per rank on the ring
  c.collective_latency = 30e-6;
  const int world = 8;
  const auto m = model(2048);
  SimRunResult r = simulate_training(m, nvme_run(c, world));
  // Per step: an all_gather of every group forward, again backward except the last
  // group (used twice in a row, so kept), a reduce_scatter of every gradient, and the
  // all_reduce of one double (the gradient norm). A ring moves (n-1)/n of the buffer.
  const double ring = (world - 1.0) / world;
  const double gather = c.collective_latency + ring * 4.0 * kNumel / c.collective_bandwidth;
  const double norm = c.collective_latency + 2 * ring * 8.0 / c.collective_bandwidth;
  const double transfer = (2 * kGroups - 1) * gather + kGroups * gather + norm;
  const SimStepStats& s = steady(r);
  report("scarce collective bandwidth (world 8)", s.time_s, transfer, "collective time");
  EXPECT_EQ(r.engine.gathers, static_cast<uint64_t>(r.steps.size() * (2 * kGroups - 1)));
  EXPECT_NEAR(s.time_s, transfer, 0.05 * transfer);
  EXPECT_GE(s.time_s, transfer);
  expect_in_budget(r, "scarce collective bandwidth");
}

TEST(SimEngine, WithoutPrefetchTheSameStepIsSlower) {
  // Parameters on NVMe, optimizer states in pinned memory; balanced: one group's
  // parameter read (16 MiB at 24 GB/s, then PCIe) takes about its forward compute.
  SimCostModel c = ample();
  c.nvme_read_bandwidth = 24e9;
  c.h2d_bandwidth = 25e9;
  const auto m = model();
  SimRunOptions on = nvme_run(c);
  on.engine.optimizer_home = Tier::Pinned;
  on.engine.store.pinned_budget = 1ull << 30;
  SimRunOptions off = on;
  off.engine.prefetch = false;
  SimRunResult with = simulate_training(m, on);
  SimRunResult without = simulate_training(m, off);
  report("prefetch on", steady(with).time_s, compute_time(m, c), "compute");
  report("prefetch off", steady(without).time_s, steady(with).time_s, "prefetch on");
  EXPECT_EQ(without.engine.prefetched, 0u);
  EXPECT_GT(with.engine.prefetched, 0u);
  // With prefetch only the first group's read of each step is exposed (nothing is
  // fetched across the optimizer step); without it, every group's read is.
  EXPECT_LT(steady(with).time_s, 1.1 * compute_time(m, c));
  EXPECT_GT(steady(without).time_s, 1.2 * steady(with).time_s);
  EXPECT_GT(steady(without).exposed_wait_s, steady(with).exposed_wait_s);
  expect_in_budget(with, "prefetch on");
  expect_in_budget(without, "prefetch off");
}

TEST(SimEngine, TwoRunsGiveBitIdenticalTimes) {
  SimCostModel c = ample();
  c.nvme_read_bandwidth = 3e9;
  c.nvme_write_bandwidth = 2e9;
  SimRunOptions o = nvme_run(c);
  o.engine.store.pinned_budget = 192ull << 20;  // tight: eviction and write-back decide things
  const auto m = model();
  SimRunResult a = simulate_training(m, o);
  SimRunResult b = simulate_training(m, o);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].time_s, b.steps[i].time_s) << "step " << i;
    EXPECT_EQ(a.steps[i].exposed_wait_s, b.steps[i].exposed_wait_s) << "step " << i;
    EXPECT_EQ(a.steps[i].optimizer_s, b.steps[i].optimizer_s) << "step " << i;
    EXPECT_EQ(a.steps[i].bytes_moved, b.steps[i].bytes_moved) << "step " << i;
  }
  for (int t = 0; t < kTierCount; ++t) EXPECT_EQ(a.tiers[t].peak, b.tiers[t].peak);
  EXPECT_EQ(a.engine.store.evictions, b.engine.store.evictions);
  EXPECT_GT(a.engine.store.evictions, 0u) << "the budget was meant to make eviction decide things";
  std::cout << "[ figures  ] tight pinned budget: step " << steady(a).time_s * 1e3 << " ms, "
            << a.engine.store.evictions << " evictions, " << a.engine.store.writebacks << " write-backs\n";
  expect_in_budget(a, "tight pinned budget");
}

TEST(SimEngine, TheTraceHasEveryLaneAndItsWaitsAreTheExposedTime) {
  const auto path = std::filesystem::temp_directory_path() / ("strata-sim-trace-" + std::to_string(::getpid()) + ".json");
  SimCostModel c = ample();
  c.nvme_read_bandwidth = 3e9;
  SimRunOptions o = nvme_run(c, 2);
  o.engine.trace_path = path.string();
  SimRunResult r = simulate_training(model(), o);

  std::ifstream f(path);
  ASSERT_TRUE(f) << "no trace at " << path;
  nlohmann::json j = nlohmann::json::parse(f);  // throws on invalid JSON
  std::filesystem::remove(path);
  std::map<int, std::string> lane_of;
  for (const auto& e : j.at("traceEvents"))
    if (e["ph"] == "M" && e["name"] == "thread_name") lane_of[e["tid"]] = e["args"]["name"];
  std::set<std::string> lanes;
  double waits = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["pid"], 0) << "pid is the rank";
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const std::string lane = lane_of.at(e["tid"]);
    EXPECT_EQ(e["cat"], lane);
    lanes.insert(lane);
    if (lane == "wait") waits += e["dur"].get<double>() * 1e-6;
  }
  for (const char* l : {"compute", "wait", "gather", "collectives", "copy:h2d", "copy:d2h", "nvme:read", "nvme:write",
                        "optimizer"})
    EXPECT_TRUE(lanes.count(l)) << "no spans on lane " << l;
  // Every wait of the engine's thread is a span: their sum is the exposed time.
  double exposed = 0;
  for (const SimStepStats& s : r.steps) exposed += s.exposed_wait_s + s.optimizer_wait_s;
  EXPECT_GT(exposed, 0.0);
  EXPECT_NEAR(waits, exposed, 1e-6 * exposed + 1e-9);
}

TEST(SimEngine, ATrillionParameterModelRunsOnALaptop) {
  // 256 groups of 4 Gi parameters (1.1 trillion), rank 0 of 1024: 16 GiB gathered per
  // group on an 80 GiB device, 64 GiB pinned. Nothing is allocated for real.
  const uint64_t numel = uint64_t{1} << 32;
  std::vector<SimGroup> m;
  for (int g = 0; g < 256; ++g) m.push_back({"block." + std::to_string(g), numel, 2.0 * double(numel) * 4096});
  SimRunOptions o;
  o.steps = 1;
  o.world = 1024;
  o.engine.stage = 3;
  o.engine.param_home = Tier::Nvme;
  o.engine.optimizer_home = Tier::Nvme;
  o.engine.prefetch_bucket_elems = 2 * numel;
  o.engine.max_live_elems = 3 * numel;  // the group in use and the look-ahead (the default, 1e9, is below a group)
  o.engine.sub_group_elems = numel / 1024;
  o.engine.store.device_budget = 80ull << 30;
  o.engine.store.pinned_budget = 64ull << 30;
  SimRunResult r = simulate_training(m, o);
  const double compute = compute_time(m, o.cost);
  report("1.1T parameters, rank 0 of 1024 (default costs)", r.steps[0].time_s, compute, "compute");
  EXPECT_GE(r.steps[0].time_s, compute);
  EXPECT_TRUE(std::isfinite(r.steps[0].time_s));
  expect_in_budget(r, "1T");
}

TEST(EngineTrace, TheCpuBackendRecordsTheEnginesSpans) {
  // strata.trace on a real backend: the engine's own spans (gathers, optimizer
  // sub-groups, and its waits when there are any), in steady seconds.
  const auto path = std::filesystem::temp_directory_path() / ("strata-cpu-trace-" + std::to_string(::getpid()) + ".json");
  {
    auto device = make_device({});
    auto comm = coll::make_host_communicator(coll::HostBackend::Self);
    EngineOptions o;
    o.stage = 3;
    o.param_home = Tier::Pinned;  // gathered (on one rank, device shards are read in place)
    o.optimizer_threads = 1;
    o.store.device_budget = 8ull << 20;
    o.store.pinned_budget = 64ull << 20;
    o.trace_path = path.string();
    std::vector<GroupSpec> groups;
    for (int g = 0; g < 4; ++g) groups.push_back({.name = "block." + std::to_string(g), .numel = 1024});
    ZeroEngine engine(*device, *comm, *comm, o, groups);
    engine.set_schedule({0, 1, 2, 3, 3, 2, 1, 0});
    EXPECT_NE(trace::active(), nullptr);
    for (int step = 0; step < 2; ++step) {
      engine.begin_micro_step();
      for (int g = 0; g < 4; ++g) {
        engine.acquire_f32(g);
        engine.release_params(g);
      }
      for (int g = 3; g >= 0; --g) {
        engine.acquire_f32(g);
        float* grad = engine.gradient_f32(g);
        std::fill(grad, grad + 1024, 0.01f);
        engine.release_params(g);
        engine.grads_ready(g);
      }
      engine.step();
    }
  }
  EXPECT_EQ(trace::active(), nullptr) << "the engine hands tracing back when it goes";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "no trace at " << path;
  nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  std::map<std::string, int> spans;
  for (const auto& e : j.at("traceEvents"))
    if (e["ph"] == "X") ++spans[e["cat"]];
  EXPECT_EQ(spans["gather"], 2 * 7) << "one per all_gather: 4 forward + 3 backward per step";
  EXPECT_EQ(spans["optimizer"], 2 * 4) << "one per sub-group per step";
}

TEST(SimEngine, EveryStageAndOffloadRunsWithoutTouchingMemory) {
  // Sim memory is PROT_NONE: any code path that touched a byte would fault here.
  for (int stage : {1, 2, 3})
    for (Tier home : {Tier::Device, Tier::Pinned, Tier::Nvme}) {
      SimRunOptions o = nvme_run(SimCostModel{}, 2);
      o.steps = 2;
      o.engine.stage = stage;
      o.engine.param_home = stage == 3 ? home : Tier::Device;
      o.engine.optimizer_home = home;
      o.engine.gradient_accumulation_steps = 2;
      o.engine.gradient_clipping = 1.0f;
      o.engine.store.device_budget = 1ull << 30;
      o.engine.store.pinned_budget = 1ull << 30;
      const std::string label = "stage " + std::to_string(stage) + ", states in " + to_string(home);
      SimRunResult r = simulate_training(model(), o);
      for (const SimStepStats& s : r.steps) {
        EXPECT_GE(s.time_s, s.compute_s) << label;
        EXPECT_DOUBLE_EQ(s.compute_s, 2 * compute_time(model(), o.cost)) << label << ": two micro-batches";
      }
      EXPECT_GT(r.steps.back().optimizer_s, 0.0) << label << ": the optimizer took no time";
      for (int t = 0; t < kTierCount; ++t) EXPECT_LE(r.tiers[t].peak, r.tiers[t].budget) << label;
    }
}

TEST(SimEngine, PrefetchCountsTheShardsOfGathersInFlight) {
  // Parameters on slow NVMe, so gathers started ahead stay in flight, each holding its
  // shard on the device; a bucket as deep as the model and a device budget with room
  // beyond the plan for k gathered groups. Prefetch must count those shards too: it once
  // counted only the gathered buffers, and from k = 5 the backward pass found the device
  // full of acquired shards ("cannot place tensor 'block.7.grad'").
  SimCostModel c = ample();
  c.nvme_read_bandwidth = 1e9;
  c.nvme_latency = 100e-6;
  for (DType p : {DType::F32, DType::BF16})
    for (int k = 2; k <= 6; ++k) {
      SimRunOptions o = nvme_run(c);
      o.engine.precision = p;
      o.engine.checkpoints = {kGroups + 1, 8ull << 20};
      o.engine.prefetch_bucket_elems = kGroups * kNumel;
      std::vector<GroupSize> sizes;
      for (const SimGroup& g : model()) sizes.push_back({g.name, g.numel});
      const ShardLayout L = make_shard_layout(sizes, o.engine.shard_strategy(o.world));
      const uint64_t full = L.max_padded * L.elem_bytes(StateRole::GatherBuffer);
      o.engine.store.device_budget = L.need[int(Tier::Device)].homes() + L.device_working + k * full;
      const std::string label = std::string(to_string(p)) + ", room for " + std::to_string(k) + " gathered groups";
      SimRunResult r;
      ASSERT_NO_THROW(r = simulate_training(model(), o)) << label;
      EXPECT_GT(r.engine.prefetched, 0u) << label << ": nothing was prefetched, the test would not test prefetch";
      expect_in_budget(r, label);
    }
}
