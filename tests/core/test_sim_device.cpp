// The sim backend: operations take the cost model's time on a virtual clock, memory is
// never touched, and waits move only the waiting thread's clock. Every assertion is on
// virtual time, never on the wall clock.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/core/trace.hpp"

using namespace strata;

namespace {

SimCostModel round_costs() {
  SimCostModel c;
  c.device_flops = 1e12;       // 1 TFLOP/s
  c.device_bandwidth = 1e11;   // 100 GB/s
  c.h2d_bandwidth = 1e9;       // 1 GB/s
  c.d2h_bandwidth = 2e9;
  c.pcie_latency = 1e-3;
  c.host_bandwidth = 4e9;
  return c;
}

constexpr double kEps = 1e-12;

}  // namespace

TEST(SimDevice, IsMadeByMakeDeviceAndReportsItsBackend) {
  auto dev = make_device({Backend::Sim});
  EXPECT_EQ(dev->backend(), Backend::Sim);
  ASSERT_NE(dev->cost_model(), nullptr);
  EXPECT_EQ(make_device({})->cost_model(), nullptr) << "the cpu backend runs for real";
  SimCostModel bad;
  bad.nvme_read_bandwidth = 0;
  EXPECT_THROW(make_sim_device(bad), ConfigError);
}

TEST(SimDevice, TerabytesOfMemoryCostNothingAndAreNeverTouched) {
  auto dev = make_sim_device(round_costs());
  const size_t tb = size_t{1} << 40;
  void* d = dev->allocate(2 * tb);
  bool locked = false;
  void* h = dev->allocate_host(tb, 0, true, &locked);
  ASSERT_NE(d, nullptr);
  ASSERT_NE(h, nullptr);
  auto s = dev->create_stream("s");
  s->copy_async(d, h, tb);  // would fault if a byte were moved
  s->fill(static_cast<float*>(d), 1.0f, tb / 4);
  s->synchronize();
  EXPECT_NEAR(dev->now(), 1e-3 + double(tb) / 1e9 + double(tb) / 1e11, 1e-6);
  dev->deallocate_host(h, tb);
  dev->deallocate(d, 2 * tb);
}

TEST(SimStream, OpsTakeTheirCostAndOnlyWaitsMoveTheThreadsClock) {
  auto dev = make_sim_device(round_costs());
  void* d = dev->allocate(1 << 30);
  bool locked;
  void* h = dev->allocate_host(1 << 30, -1, false, &locked);
  auto s = dev->create_stream("copy");
  EXPECT_EQ(dev->now(), 0.0);
  s->copy_async(d, h, 1'000'000);  // h2d: 1 ms latency + 1 ms
  s->copy_async(h, d, 2'000'000);  // d2h: 1 ms latency + 1 ms
  Event e = s->record();
  EXPECT_EQ(dev->now(), 0.0) << "submitting does not wait";
  EXPECT_NEAR(sim::time_of(e), 4e-3, kEps);
  EXPECT_EQ(dev->now(), 0.0) << "time_of asks, it does not wait";
  EXPECT_FALSE(e.result());
  EXPECT_EQ(dev->now(), 0.0) << "result() asks, it does not wait";
  e.wait();
  EXPECT_NEAR(dev->now(), 4e-3, kEps);
  // Work submitted now starts now, not at the stream's idle time in the past.
  dev->host_compute(4e6, [] { FAIL() << "host work must not run on sim"; });  // 1 ms at 4 GB/s
  EXPECT_NEAR(dev->now(), 5e-3, kEps);
  s->compute(2e9, [] { FAIL() << "kernels must not run on sim"; });  // 2 ms at 1 TFLOP/s
  EXPECT_NEAR(sim::time_of(s->record()), 7e-3, kEps);
  dev->deallocate_host(h, 1 << 30);
  dev->deallocate(d, 1 << 30);
}

TEST(SimStream, StreamsOverlapButShareTheLinkOfADirection) {
  auto dev = make_sim_device(round_costs());
  void* d = dev->allocate(1 << 30);
  bool locked;
  void* h = dev->allocate_host(1 << 30, -1, false, &locked);
  auto a = dev->create_stream("a"), b = dev->create_stream("b"), c = dev->create_stream("c");
  a->copy_async(d, h, 1'000'000);  // h2d [0, 2 ms)
  b->copy_async(d, h, 1'000'000);  // h2d too: waits for the link, [2, 4 ms)
  c->copy_async(h, d, 2'000'000);  // d2h: its own link, [0, 2 ms)
  EXPECT_NEAR(sim::time_of(a->record()), 2e-3, kEps);
  EXPECT_NEAR(sim::time_of(b->record()), 4e-3, kEps);
  EXPECT_NEAR(sim::time_of(c->record()), 2e-3, kEps);
  // Cross-stream order: c waits for b, then computes.
  c->wait(b->record());
  c->compute(1e9, {});
  EXPECT_NEAR(sim::time_of(c->record()), 5e-3, kEps);
  dev->deallocate_host(h, 1 << 30);
  dev->deallocate(d, 1 << 30);
}

TEST(SimStream, AFailedWaitFailsTheNextRecordOnly) {
  auto dev = make_sim_device(round_costs());
  auto s = dev->create_stream("s");
  s->wait(sim::event_at(1.0, std::make_exception_ptr(IoError("read", "/x", 0, 4096, 5))));
  Event bad = s->record();
  EXPECT_THROW(bad.wait(), IoError);
  EXPECT_NEAR(dev->now(), 1.0, kEps) << "a failed event still happened at its time";
  EXPECT_NO_THROW(s->record().wait());
  s->host_task([] { throw std::runtime_error("host task"); });
  EXPECT_THROW(s->record().wait(), std::runtime_error);
}

TEST(SimStream, HostTasksRunAtTheStreamsTime) {
  auto dev = make_sim_device(round_costs());
  auto s = dev->create_stream("s");
  s->compute(3e9, {});  // 3 ms
  double seen = -1;
  s->host_task([&] { seen = sim::now(); });
  EXPECT_NEAR(seen, 3e-3, kEps);
  EXPECT_EQ(dev->now(), 0.0) << "the submitting thread did not wait";
}

TEST(SimEvents, JoinsMergeToTheLatestTimeAndFencesNeverFail) {
  sim::reset_clocks();
  Event j = when_all({sim::event_at(2.0), Event(), sim::event_at(5.0), sim::event_at(1.0)});
  ASSERT_NE(j.impl(), nullptr);
  EXPECT_EQ(j.impl()->virtual_time(), 5.0);
  // Joining a join again and again stays one event (fences over many uses).
  Event acc;
  for (int i = 0; i < 1000; ++i) acc = when_all({acc, sim::event_at(i * 1e-3)});
  EXPECT_NEAR(sim::time_of(acc), 0.999, kEps);

  Event failed = sim::event_at(3.0, std::make_exception_ptr(std::runtime_error("lost")));
  Event both = when_all({failed, sim::event_at(4.0)});
  EXPECT_THROW(both.wait(), std::runtime_error);
  EXPECT_NEAR(sim::now(), 4.0, kEps);
  Event fence = when_done(both);
  EXPECT_FALSE(fence.result());
  EXPECT_NEAR(sim::time_of(fence), 4.0, kEps);

  // Real-time parts that are complete drop out; pending ones stay.
  auto [pending, host] = HostEvent::make();
  auto [done, done_host] = HostEvent::make();
  done_host->complete();
  Event mixed = when_all({done, pending});
  EXPECT_FALSE(mixed.ready());
  host->complete();
  EXPECT_TRUE(mixed.ready());
  EXPECT_EQ(when_all({done}).impl(), nullptr);
}

TEST(SimClock, EachThreadHasItsOwnNowAndANewDeviceStartsAtZero) {
  auto dev = make_sim_device(round_costs());
  sim::advance_to(7.0);
  double other = -1;
  std::thread t([&] {
    sim::event_at(3.0).wait();
    other = sim::now();
  });
  t.join();
  EXPECT_EQ(other, 3.0);
  EXPECT_EQ(dev->now(), 7.0);
  auto fresh = make_sim_device(round_costs());
  EXPECT_EQ(fresh->now(), 0.0);
}

TEST(Trace, WritesChromeTraceEventJson) {
  trace::Recorder rec(3);
  EXPECT_EQ(trace::active(), nullptr) << "tracing is off unless someone turns it on";
  trace::Recorder* before = trace::set_active(&rec);
  trace::span("compute", "block \"0\"", 0.001, 0.003);
  trace::span("nvme:read", "read", 0.0, 0.002);
  trace::set_active(before);
  trace::span("compute", "not recorded", 0, 1);
  ASSERT_EQ(rec.size(), 2u);

  std::ostringstream os;
  rec.write_json(os);
  nlohmann::json j = nlohmann::json::parse(os.str());
  int spans = 0;
  std::map<int, std::string> lanes;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"]] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    ++spans;
    if (e["cat"] == "compute") {
      EXPECT_EQ(e["name"], "block \"0\"");
      EXPECT_NEAR(e["ts"].get<double>(), 1000.0, 1e-6);  // microseconds
      EXPECT_NEAR(e["dur"].get<double>(), 2000.0, 1e-6);
    }
  }
  EXPECT_EQ(spans, 2);
  ASSERT_EQ(lanes.size(), 2u);
  EXPECT_EQ(lanes.begin()->second, "compute") << "the usual lanes come first, in a fixed order";
}
