// The tiered store on the sim backend: every event is complete in real time the moment
// it is made, so a copy is freed (in real time) while, in simulated time, its last
// reader may still be running. These tests check that memory is nonetheless reused only
// after its last user in simulated time: a freed range carries a fence, and whoever
// writes it next waits for the fence. The NVMe tier's simulated channels are checked
// against the cost model too. Assertions are on virtual time only.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

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

// The NVMe tier on the sim backend: the same NvmeStore over simulated channels. Each
// transfer takes the latency plus its bytes (rounded up to the alignment) over the
// direction's bandwidth; one transfer at a time per direction; reads and writes overlap.
TEST(SimStore, NvmeTransfersTakeTheCostModelsTimeOnOneChannelPerDirection) {
  SimCostModel c = costs();
  c.nvme_latency = 1e-4;
  c.nvme_read_bandwidth = 2e9;
  c.nvme_write_bandwidth = 1e9;
  auto dev = make_sim_device(c);  // starts the virtual clock at 0
  NvmeStoreOptions o;
  o.paths = {"/nonexistent/strata-sim"};  // never touched on sim
  o.capacity = 64 * kMiB;
  o.sim = c;
  NvmeStore store(o);
  EXPECT_EQ(store.engine_name(), "sim");
  EXPECT_TRUE(store.files().empty());
  EXPECT_EQ(store.capacity(), 64 * kMiB);
  const uint64_t a = store.alignment();
  ASSERT_GT(a, 0u);

  std::vector<char> mem(kMiB + a);  // never read or written on sim; only its alignment is checked
  void* buf = mem.data() + (a - reinterpret_cast<uintptr_t>(mem.data()) % a) % a;
  const Extent x = store.allocate(kMiB), y = store.allocate(kMiB);
  const double write = c.nvme_latency + double(kMiB) / c.nvme_write_bandwidth;
  const double read = c.nvme_latency + double(kMiB) / c.nvme_read_bandwidth;
  Event wx = store.write(x, buf, kMiB);
  Event wy = store.write(y, buf, kMiB);
  EXPECT_NEAR(sim::time_of(wx), write, kEps);
  EXPECT_NEAR(sim::time_of(wy), 2 * write, kEps) << "one write at a time";
  Event rx = store.read(x, buf, kMiB);
  EXPECT_NEAR(sim::time_of(rx), read, kEps) << "reads do not wait for writes they do not follow";
  Event ry = store.read(y, buf, kMiB, wy);
  EXPECT_NEAR(sim::time_of(ry), 2 * write + read, kEps);
  Event small = store.write(x, buf, 100, ry);  // moves one alignment unit
  EXPECT_NEAR(sim::time_of(small), 2 * write + read + c.nvme_latency + double(a) / c.nvme_write_bandwidth, kEps);
  EXPECT_EQ(dev->now(), 0.0) << "nothing above waited in simulated time";

  // A transfer after a failed event fails, and is counted as failed; the extent keeps
  // what its last write left there.
  Event failed = sim::event_at(1.0, std::make_exception_ptr(std::runtime_error("the source never became valid")));
  EXPECT_THROW(sim::time_of(store.write(y, buf, kMiB, failed)), std::runtime_error);
  EXPECT_NO_THROW(sim::time_of(store.read(y, buf, kMiB)));
  IoStats s = store.io_stats();
  EXPECT_EQ(s.transfers, 7u);
  EXPECT_EQ(s.failed_transfers, 1u);
  EXPECT_EQ(s.bytes, 5 * kMiB + a);
}

// The tiered store picks the simulated NVMe tier from its device: no caller chooses it.
TEST(SimStore, ATieredStoreOnTheSimDeviceUsesTheSimulatedNvmeTier) {
  SimCostModel c = costs();
  c.nvme_latency = 0;
  c.nvme_read_bandwidth = 1e9;
  auto dev = make_sim_device(c);
  TieredStoreOptions o = one_tensor_of_device_memory();
  o.nvme.paths = {"/nonexistent/strata-sim"};
  o.nvme.capacity = 16 * kMiB;
  TieredStore store(*dev, o);
  ASSERT_NE(store.nvme(), nullptr);
  EXPECT_EQ(store.nvme()->engine_name(), "sim");
  TensorId t = store.add({"t", kMiB, DType::F32, Tier::Nvme});
  Event to_device = store.fetch(t, Tier::Device);  // NVMe -> pinned -> device
  EXPECT_NEAR(sim::time_of(to_device), double(kMiB) / c.nvme_read_bandwidth + kCopy, kEps);
  EXPECT_EQ(store.nvme()->io_stats().transfers, 1u);
}
