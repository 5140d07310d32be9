// Trace-driven prefetch through the C API: the first micro-step's acquire order is
// recorded and prefetched by; a change of order mid-run falls back to on-demand fetches
// for that micro-step and records the new order, which later steps then follow. Results
// stay those of a run that kept one order.
#include <gtest/gtest.h>

#include "capi_harness.hpp"

using namespace capi_test;

namespace {

struct TraceRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  std::vector<strata_stats> stats;  // after each step
};

// orders[s]: the acquire order of step s.
TraceRun train(const std::vector<std::vector<int>>& orders, const std::string& offload, const std::string& dir) {
  RuntimeHandle h(config_json({.offload = offload, .nvme_dir = dir}));
  auto gs = toy_groups(5);
  register_toy(h.rt, gs);
  TraceRun r;
  for (size_t s = 0; s < orders.size(); ++s) {
    r.losses.push_back(toy_micro_step(h.rt, gs, orders[s], static_cast<int>(s), 0, 0));
    EXPECT_STRATA_OK(strata_step(h.rt, nullptr));
    strata_stats st{};
    st.struct_size = sizeof st;
    EXPECT_STRATA_OK(strata_get_stats(h.rt, &st));
    r.stats.push_back(st);
  }
  r.weights = read_all(h.rt, gs);
  return r;
}

}  // namespace

TEST(CApiTrace, ChangingTheOrderFallsBackAndRecordsTheNewOne) {
  for (std::string offload : {"none", "cpu", "nvme"}) {
    SCOPED_TRACE("offload " + offload);
    TempDir dir("trace");
    const std::vector<int> a = forward_backward(5);               // 0 1 2 3 4 4 3 2 1 0
    const std::vector<int> b = {2, 0, 4, 1, 3, 3, 1, 4, 0, 2};    // another model order
    std::vector<std::vector<int>> fixed(8, a), changed(8, a);
    for (int s = 4; s < 8; ++s) changed[s] = b;
    TraceRun ref = train(fixed, offload, dir.path.string());
    TraceRun got = train(changed, offload, dir.path.string());

    // Same operations, so the same numbers (each group's gradient depends on its own
    // parameters only): the order of fetching must not change a single bit.
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    // (The loss is summed over groups in acquire order, so only its last bits may differ.)
    for (size_t s = 0; s < ref.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-12 * ref.losses[s]) << "step " << s;
    EXPECT_EQ(got.weights, ref.weights);
    EXPECT_NE(got.losses.back(), got.losses.front()) << "nothing trained";

    // The fixed order never departs and prefetches every step after the first.
    EXPECT_EQ(ref.stats.back().trace_departures, 0u);
    // The changed run departs once, at step 4; from step 5 on it follows the new trace.
    for (int s = 0; s < 4; ++s) EXPECT_EQ(got.stats[s].trace_departures, 0u) << "step " << s;
    for (int s = 4; s < 8; ++s) EXPECT_EQ(got.stats[s].trace_departures, 1u) << "step " << s;
    if (offload == "none") {
      // One rank, the parameters on the device: each group is read in place, never gathered.
      EXPECT_EQ(got.stats.back().gathers, 0u);
      EXPECT_EQ(got.stats.back().prefetched, 0u);
      continue;
    }
    // Step 4 fetched on demand after the departure (its first acquire, group 2, was
    // not next in the trace); steps 5-7 prefetched by the re-recorded order again.
    const uint64_t pre3 = got.stats[3].prefetched, pre4 = got.stats[4].prefetched, pre7 = got.stats[7].prefetched;
    EXPECT_EQ(pre4, pre3) << "the departed step should not prefetch by the stale trace";
    EXPECT_GT(pre7, pre4) << "after re-recording, later steps should prefetch by the new order";
    EXPECT_EQ(pre7 - pre4, ref.stats[7].prefetched - ref.stats[4].prefetched)
        << "steps 5-7 should prefetch as much by the new order as the fixed run by its own";
  }
}

TEST(CApiTrace, AnOrderThatChangesEveryStepNeverHangsAndStaysCorrect) {
  TempDir dir("trace-every");
  const std::vector<int> a = forward_backward(5), b = {4, 3, 2, 1, 0, 0, 1, 2, 3, 4};
  std::vector<std::vector<int>> fixed(6, a), alternating;
  for (int s = 0; s < 6; ++s) alternating.push_back(s % 2 ? b : a);
  TraceRun ref = train(fixed, "nvme", dir.path.string());
  TraceRun got = train(alternating, "nvme", dir.path.string());
  EXPECT_EQ(got.weights, ref.weights);
  EXPECT_EQ(got.stats.back().trace_departures, 5u) << "steps 1-5 each left the order recorded from the step before";
}
