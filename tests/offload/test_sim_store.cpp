// The tiered store on the sim backend: every event is complete in real time the moment
// it is made, so a copy is freed (in real time) while, in simulated time, its last
// reader may still be running. These tests check that memory is nonetheless reused only
// after its last user in simulated time: a freed range carries a fence, and whoever
// writes it next waits for the fence. Assertions are on virtual time only.
#include <gtest/gtest.h>

#include "strata/core/device.hpp"
#include "strata/offload/tiered_store.hpp"

using namespace strata;

namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr double kEps = 1e-12;

SimCostModel costs() {
  SimCostModel c;
  c.h2d_bandwidth = 1e9;  // 1 MiB in 1.048576 ms
  c.d2h_bandwidth = 1e9;
  c.pcie_latency = 0;
  c.device_flops = 1e12;  // 1e9 FLOPs in 1 ms
  return c;
}

constexpr double kCopy = double(kMiB) / 1e9;  // seconds for 1 MiB over PCIe

TieredStoreOptions one_tensor_of_device_memory() {
  TieredStoreOptions o;
  o.device_budget = kMiB;  // room for exactly one 1 MiB tensor: every device copy reuses one range
  o.pinned_budget = 8 * kMiB;
  return o;
}

}  // namespace

TEST(SimStore, AMoveIntoRecycledMemoryWaitsForTheLastReaderOfTheOldContents) {
  auto dev = make_sim_device(costs());
  TieredStore store(*dev, one_tensor_of_device_memory());
  auto work = dev->create_stream("work");
  TensorId a = store.add({"a", kMiB, DType::F32, Tier::Pinned});
  TensorId b = store.add({"b", kMiB, DType::F32, Tier::Pinned});

  // Device work writes a's device copy until t = 5 ms; a then goes home (device -> pinned),
  // a copy that reads the device memory during [5 ms, 5 ms + kCopy).
  Acquired da = store.acquire_for_overwrite(a, Tier::Device);
  work->wait(da.ready);
  work->compute(5e9, {});
  store.release(a, Tier::Device, Access::Write, work->record());
  Event home = store.drop(a, Tier::Device);
  const double read_ends = sim::time_of(home);
  EXPECT_NEAR(read_ends, 5e-3 + kCopy, kEps);
  EXPECT_EQ(dev->now(), 0.0) << "nothing above waited in simulated time";

  // b takes the only device range, freed at once in real time; its copy must not start
  // before the copy out of that range has finished.
  Event fetched = store.fetch(b, Tier::Device);
  EXPECT_NEAR(sim::time_of(fetched), read_ends + kCopy, kEps)
      << "without the fence b's copy would start at " << kCopy << " s and overwrite a's data mid-read";
  StoreStats s = store.stats();
  EXPECT_LE(s.tiers[0].peak, s.tiers[0].budget);
  EXPECT_EQ(s.tiers[0].peak, kMiB);
}

TEST(SimStore, ScratchDiscardedAfterItsReaderIsReusedOnlyAfterIt) {
  auto dev = make_sim_device(costs());
  TieredStore store(*dev, one_tensor_of_device_memory());
  auto work = dev->create_stream("work");
  TensorId s = store.add({"s", kMiB, DType::F32, Tier::Device, "scratch", true});
  TensorId t = store.add({"t", kMiB, DType::F32, Tier::Device, "scratch", true});

  Acquired as = store.acquire_for_overwrite(s, Tier::Device);
  work->wait(as.ready);
  work->compute(2e9, {});  // writes s until 2 ms
  store.release(s, Tier::Device, Access::Write, work->record());
  work->compute(8e9, {});  // reads s until 10 ms
  store.discard_after(s, work->record());

  Acquired at = store.acquire_for_overwrite(t, Tier::Device);
  EXPECT_EQ(at.data, as.data) << "the test means t to reuse s's memory";
  EXPECT_NEAR(sim::time_of(at.ready), 10e-3, kEps) << "t may be written only once s's last reader is done";
  store.release(t, Tier::Device, Access::Write);
  EXPECT_EQ(dev->now(), 0.0);
}

TEST(SimStore, OverwritingACopyWaitsForMovesStillReadingIt) {
  auto dev = make_sim_device(costs());
  TieredStoreOptions o = one_tensor_of_device_memory();
  TieredStore store(*dev, o);
  TensorId c = store.add({"c", kMiB, DType::F32, Tier::Pinned});
  Event to_device = store.fetch(c, Tier::Device);  // reads the pinned copy until kCopy
  EXPECT_NEAR(sim::time_of(to_device), kCopy, kEps);
  Acquired w = store.acquire_for_overwrite(c, Tier::Pinned);
  EXPECT_NEAR(sim::time_of(w.ready), kCopy, kEps) << "the pinned copy is still being read";
  store.release(c, Tier::Pinned, Access::Write);

  // A plain acquire, whose holder may write and release as written, waits for readers too.
  Event again = store.fetch(c, Tier::Device);  // a new copy: reads pinned until 2 kCopy
  Acquired r = store.acquire(c, Tier::Pinned);
  EXPECT_NEAR(sim::time_of(r.ready), sim::time_of(again), kEps);
  store.release(c, Tier::Pinned);
}
