// Thread-safety of the C API (the table in docs/embedding.md): runtimes on different
// threads are independent; one runtime's calls from many threads are serialised and
// give the results of one thread; destroy racing with other calls gives each of them
// either its result or STRATA_ERR_INVALID_HANDLE, never a crash.
#include <gtest/gtest.h>

#include <atomic>
#include <algorithm>
#include <barrier>
#include <thread>

#include "capi_harness.hpp"

using namespace capi_test;

namespace {

std::vector<std::vector<float>> train_single(int steps) {
  RuntimeHandle h(config_json({}));
  auto gs = toy_groups(4);
  register_toy(h.rt, gs);
  for (int s = 0; s < steps; ++s) {
    toy_micro_step(h.rt, gs, forward_backward(4), s, 0, 0);
    EXPECT_STRATA_OK(strata_step(h.rt, nullptr));
  }
  return read_all(h.rt, gs);
}

}  // namespace

TEST(CApiThreads, RuntimesOnDifferentThreadsAreIndependent) {
  const auto ref = train_single(4);
  std::vector<std::vector<std::vector<float>>> got(4);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back([&, t] { got[t] = train_single(4); });
  for (auto& t : ts) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], ref) << "thread " << t;
}

// Each thread owns one group: acquires it, computes its gradient, releases, hands it
// in; a fifth thread reads statistics throughout. The main thread opens micro-batches
// and steps.
TEST(CApiThreads, OneRuntimeSharedByManyThreads) {
  const int steps = 4, n = 4;
  const auto ref = train_single(steps);
  RuntimeHandle h(config_json({}));
  auto gs = toy_groups(n);
  register_toy(h.rt, gs);
  std::barrier sync(n + 1);
  std::atomic<bool> done{false};
  std::atomic<int> stats_reads{0};
  std::thread reader([&] {
    while (!done) {
      strata_stats st{};
      st.struct_size = sizeof st;
      EXPECT_STRATA_OK(strata_get_stats(h.rt, &st));
      ++stats_reads;
    }
  });
  std::vector<std::thread> workers;
  for (int g = 0; g < n; ++g)
    workers.emplace_back([&, g] {
      for (int s = 0; s < steps; ++s) {
        sync.arrive_and_wait();  // the micro-batch is open
        for (int pass = 0; pass < 2; ++pass) {  // "forward" and "backward"
          strata_buffer b{};
          EXPECT_STRATA_OK(strata_acquire(h.rt, g, &b));
          std::vector<float> grad(b.numel);
          for (uint64_t i = 0; i < b.numel; ++i)
            grad[i] = (static_cast<const float*>(b.data)[i] - target_value(g, i, s)) * grad_scale(0, 0);
          EXPECT_STRATA_OK(strata_release(h.rt, g));
          if (pass == 1) {
            EXPECT_STRATA_OK(strata_grad_submit(h.rt, g, grad.data(), STRATA_F32, grad.size()));
          }
        }
        sync.arrive_and_wait();  // every gradient is in
      }
    });
  for (int s = 0; s < steps; ++s) {
    ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
  }
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  EXPECT_GT(stats_reads.load(), 0);
  EXPECT_EQ(read_all(h.rt, gs), ref) << "concurrent calls changed the results";
}

TEST(CApiThreads, DestroyRacingWithOtherCalls) {
  for (int round = 0; round < 5; ++round) {
    strata_runtime rt{};
    const std::string json = config_json({});
    ASSERT_STRATA_OK(strata_runtime_create(STRATA_API_VERSION, json.c_str(), &rt));
    auto gs = toy_groups(3);
    register_toy(rt, gs);
    ASSERT_STRATA_OK(strata_begin_micro_step(rt));
    std::atomic<bool> go{false};
    std::atomic<int> ok{0}, gone{0}, other{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t)
      ts.emplace_back([&, t] {
        while (!go) std::this_thread::yield();
        for (int i = 0; i < 200; ++i) {
          strata_buffer b{};
          strata_stats st{};
          st.struct_size = sizeof st;
          strata_status s = (i % 2) ? strata_get_stats(rt, &st) : strata_acquire(rt, t, &b);
          if (s == STRATA_OK && i % 2 == 0) s = strata_release(rt, t);
          if (s == STRATA_OK) ++ok;
          else if (s == STRATA_ERR_INVALID_HANDLE) ++gone;
          else {
            ++other;
            ADD_FAILURE() << strata_status_name(s) << ": " << strata_last_error();
          }
        }
      });
    go = true;
    while (ok + gone < 60 * round) std::this_thread::yield();  // vary how far the others got
    ASSERT_STRATA_OK(strata_runtime_destroy(rt));
    for (auto& t : ts) t.join();
    EXPECT_EQ(ok + gone, 600);
    EXPECT_EQ(other, 0);
    strata_stats st{};
    st.struct_size = sizeof st;
    EXPECT_EQ(strata_get_stats(rt, &st), STRATA_ERR_INVALID_HANDLE);
  }
}

TEST(CApiThreads, CreateAndDestroyFromManyThreads) {
  std::vector<std::thread> ts;
  std::vector<uint64_t> ids(8);
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      const std::string json = config_json({});
      strata_runtime rt{};
      EXPECT_STRATA_OK(strata_runtime_create(STRATA_API_VERSION, json.c_str(), &rt));
      ids[t] = rt.id;
      EXPECT_STRATA_OK(strata_runtime_destroy(rt));
      EXPECT_EQ(strata_runtime_destroy(rt), STRATA_ERR_INVALID_HANDLE);
    });
  for (auto& t : ts) t.join();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end()) << "two runtimes got the same id";
}
