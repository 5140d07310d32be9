// Multi-rank tests of the mpi backend, run under mpirun with 2 and 4 ranks (and as a
// singleton, without mpirun). Values depend on the rank and are checked exactly.
//
// A check that fails on one rank must not leave the others waiting in a collective:
// the tests post and wait for every operation on every rank first, and check values
// with EXPECT_* afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/mpi_backend.hpp"
#include "strata/core/error.hpp"
#include "wait_all.hpp"

using namespace strata;
using namespace strata::coll;
using strata::coll::test_support::wait_all;

namespace {

std::unique_ptr<Communicator> make_mpi() { return make_host_communicator(HostBackend::Mpi); }

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

}  // namespace

TEST(MpiCommunicator, ShapeMatchesTheLauncher) {
  auto comm = make_mpi();
  EXPECT_EQ(comm->backend(), CommBackend::Mpi);
  EXPECT_EQ(comm->size(), env_int("OMPI_COMM_WORLD_SIZE", 1));
  EXPECT_EQ(comm->rank(), env_int("OMPI_COMM_WORLD_RANK", 0));
  EXPECT_EQ(comm->local_rank(), env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0));
  EXPECT_EQ(comm->local_size(), env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1));
  EXPECT_EQ(process_rank(), comm->rank());
  // Under a launcher, Auto picks MPI too.
  if (!detect_launcher().empty()) {
    EXPECT_EQ(make_host_communicator()->backend(), CommBackend::Mpi);
  }
  MpiInfo info = mpi_info();
  EXPECT_GE(info.thread_level, MPI_THREAD_FUNNELED);
  EXPECT_TRUE(info.initialized_here);
  EXPECT_FALSE(info.library.empty());
}

TEST(MpiCommunicator, AllGatherPlacesEachRanksSlice) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 1000;
  std::vector<float> send(count);
  std::vector<int64_t> send64(count);
  for (size_t i = 0; i < count; ++i) {
    send[i] = static_cast<float>(r * 10000 + static_cast<int>(i));
    send64[i] = (int64_t{r} << 40) + static_cast<int64_t>(i);
  }
  std::vector<float> recv(count * n, -1.0f);
  std::vector<int64_t> recv64(count * n, -1);
  // In place: this rank's slice already holds its data.
  std::vector<double> inplace(count * n, -1.0);
  for (size_t i = 0; i < count; ++i) inplace[r * count + i] = r + i * 0.5;
  std::span<double> mine = std::span<double>(inplace).subspan(r * count, count);

  std::vector<Event> evs{comm->all_gather(send, recv), comm->all_gather(send64, recv64),
                         comm->all_gather(std::span<const double>(mine), inplace)};
  ASSERT_EQ(wait_all(evs), 0);
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(recv[k * count + i], static_cast<float>(k * 10000 + static_cast<int>(i))) << k << "," << i;
      ASSERT_EQ(recv64[k * count + i], (int64_t{k} << 40) + static_cast<int64_t>(i)) << k << "," << i;
      ASSERT_EQ(inplace[k * count + i], k + i * 0.5) << k << "," << i;
    }
}

TEST(MpiCommunicator, ReduceScatterSumsExactly) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 777;  // per rank
  std::vector<float> send(count * n);
  std::vector<double> send_d(count * n);
  std::vector<int32_t> send_i(count * n);
  std::vector<int64_t> send_l(count * n);
  for (size_t i = 0; i < count * n; ++i) {
    send[i] = static_cast<float>(r * 1000 + static_cast<int>(i));  // < 2^24: exact in float
    send_d[i] = r * 0.25 + static_cast<double>(i);
    send_i[i] = (r + 1) * static_cast<int32_t>(i) - 5;
    send_l[i] = (int64_t{r + 1} << 36) + static_cast<int64_t>(i);
  }
  std::vector<float> recv(count, -1);
  std::vector<double> recv_d(count, -1);
  std::vector<int32_t> recv_i(count, -1);
  std::vector<int64_t> recv_l(count, -1);
  std::vector<float> recv_max(count, -1);
  std::vector<Event> evs{comm->reduce_scatter(send, recv), comm->reduce_scatter(send_d, recv_d),
                         comm->reduce_scatter(send_i, recv_i), comm->reduce_scatter(send_l, recv_l),
                         comm->reduce_scatter(send, recv_max, ReduceOp::Max)};
  ASSERT_EQ(wait_all(evs), 0);
  const int64_t ranks_sum = int64_t{n} * (n - 1) / 2;
  for (size_t j = 0; j < count; ++j) {
    const int64_t i = static_cast<int64_t>(r * count + j);  // global index
    ASSERT_EQ(recv[j], static_cast<float>(1000 * ranks_sum + n * i)) << j;
    ASSERT_EQ(recv_d[j], 0.25 * static_cast<double>(ranks_sum) + n * static_cast<double>(i)) << j;
    ASSERT_EQ(recv_i[j], static_cast<int32_t>((ranks_sum + n) * i - 5 * n)) << j;
    ASSERT_EQ(recv_l[j], ((ranks_sum + n) << 36) + n * i) << j;
    ASSERT_EQ(recv_max[j], static_cast<float>((n - 1) * 1000 + i)) << j;
  }
}

// Part j of rank r's send goes to rank j, as part r of its recv: checked exactly for
// every pair, in three types, with a world that does not divide the elements refused.
TEST(MpiCommunicator, AllToAllDeliversEachPartToItsRank) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 333;  // per part
  std::vector<float> send(count * n), recv(count * n, -1);
  std::vector<uint8_t> bytes(count * n), bytes_in(count * n, 0xff);
  std::vector<int64_t> wide(count * n), wide_in(count * n, -1);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < count; ++i) {
      send[j * count + i] = static_cast<float>(r * 100000 + j * 1000 + static_cast<int>(i));
      bytes[j * count + i] = static_cast<uint8_t>(r * 31 + j * 7 + i);
      wide[j * count + i] = (int64_t{r} << 40) + (int64_t{j} << 20) + static_cast<int64_t>(i);
    }
  std::vector<Event> evs{comm->all_to_all(send, recv), comm->all_to_all(bytes, bytes_in),
                         comm->all_to_all(wide, wide_in)};
  ASSERT_EQ(wait_all(evs), 0);
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(recv[k * count + i], static_cast<float>(k * 100000 + r * 1000 + static_cast<int>(i))) << k << "," << i;
      ASSERT_EQ(bytes_in[k * count + i], static_cast<uint8_t>(k * 31 + r * 7 + i)) << k << "," << i;
      ASSERT_EQ(wide_in[k * count + i], (int64_t{k} << 40) + (int64_t{r} << 20) + static_cast<int64_t>(i));
    }
  if (n > 1) {
    std::vector<float> odd(n * 3 + 1), odd_in(n * 3 + 1);
    EXPECT_THROW(comm->all_to_all(odd, odd_in), CollectiveUsageError);
  }
}

TEST(MpiCommunicator, AllReduceSumAndMaxInAndOutOfPlace) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 4096;
  std::vector<float> a(count), sum(count, -1);
  std::vector<double> norms{static_cast<double>(r) * 1.5, -static_cast<double>(r), 7.0};
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>(static_cast<int>(i) - r);
    bytes[i] = static_cast<uint8_t>((i + r) % 200);
  }
  std::vector<float> inplace = a;
  std::vector<Event> evs{comm->all_reduce(a, sum), comm->all_reduce(inplace),
                         comm->all_reduce(norms, ReduceOp::Max), comm->all_reduce(bytes, ReduceOp::Max)};
  ASSERT_EQ(wait_all(evs), 0);
  const int ranks_sum = n * (n - 1) / 2;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(sum[i], static_cast<float>(n * static_cast<int>(i) - ranks_sum)) << i;
    ASSERT_EQ(inplace[i], sum[i]) << i;
    uint8_t m = 0;
    for (int k = 0; k < n; ++k) m = std::max<uint8_t>(m, static_cast<uint8_t>((i + k) % 200));
    ASSERT_EQ(bytes[i], m) << i;
  }
  EXPECT_EQ(norms, (std::vector<double>{(n - 1) * 1.5, 0.0, 7.0}));
}

TEST(MpiCommunicator, SixteenBitFloatsSumAndMax) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 300;
  std::vector<Bf16> b(count);
  std::vector<Fp16> h(count), hmax(count);
  for (size_t i = 0; i < count; ++i) {
    b[i] = to_bf16(static_cast<float>(i % 64) + r);  // sums stay below 256: exact in bf16
    h[i] = to_fp16(static_cast<float>(i) - r * 0.5f);  // halves below 2048: exact in fp16
    hmax[i] = to_fp16(static_cast<float>((i * 7 + r * 13) % 97) - 40.0f);
  }
  std::vector<Event> evs{comm->all_reduce(b), comm->all_reduce(h), comm->all_reduce(hmax, ReduceOp::Max)};
  ASSERT_EQ(wait_all(evs), 0);
  const int ranks_sum = n * (n - 1) / 2;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(to_float(b[i]), static_cast<float>(n * static_cast<int>(i % 64) + ranks_sum)) << i;
    ASSERT_EQ(to_float(h[i]), n * static_cast<float>(i) - 0.5f * ranks_sum) << i;
    float m = -1e9f;
    for (int k = 0; k < n; ++k) m = std::max(m, static_cast<float>((i * 7 + k * 13) % 97) - 40.0f);
    ASSERT_EQ(to_float(hmax[i]), m) << i;
  }
  // reduce_scatter of bf16, as gradients are reduced.
  std::vector<Bf16> grads(8 * n), mine(8);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = to_bf16(static_cast<float>(i) + r);
  ASSERT_EQ(wait_all({comm->reduce_scatter(grads, mine)}), 0);
  for (size_t j = 0; j < 8; ++j)
    EXPECT_EQ(to_float(mine[j]), static_cast<float>(n * static_cast<int>(r * 8 + j) + ranks_sum)) << j;
}

TEST(MpiCommunicator, BroadcastFromEveryRoot) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  std::vector<std::vector<int32_t>> bufs(n, std::vector<int32_t>(513));
  for (int root = 0; root < n; ++root)
    for (size_t i = 0; i < 513; ++i) bufs[root][i] = r == root ? root * 1000 + static_cast<int32_t>(i) : -1;
  std::vector<Event> evs;
  for (int root = 0; root < n; ++root) evs.push_back(comm->broadcast(bufs[root], root));
  ASSERT_EQ(wait_all(evs), 0);
  for (int root = 0; root < n; ++root)
    for (size_t i = 0; i < 513; ++i) ASSERT_EQ(bufs[root][i], root * 1000 + static_cast<int32_t>(i)) << root;
}

TEST(MpiCommunicator, BarrierWaitsForTheLastRank) {
  auto comm = make_mpi();
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  comm->barrier().wait();  // line up
  using namespace std::chrono;
  const auto delay = milliseconds(400);
  const auto t0 = steady_clock::now();
  if (comm->rank() == 0) std::this_thread::sleep_for(delay);
  comm->barrier().wait();
  const auto waited = steady_clock::now() - t0;
  // Rank 0 entered `delay` late, so nobody can leave before about then (the slack
  // allows for the ranks leaving the first barrier at slightly different times).
  EXPECT_GE(duration_cast<milliseconds>(waited).count(), 200) << "barrier returned before rank 0 arrived";
}

TEST(MpiCommunicator, ManyOperationsInFlightCompleteInAnyOrder) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  constexpr int kOps = 64;
  std::vector<std::vector<double>> send(kOps), recv(kOps);
  std::vector<Event> evs;
  for (int k = 0; k < kOps; ++k) {
    const size_t count = 1 + static_cast<size_t>(k) * 97;  // 1 .. ~6000 elements
    send[k].resize(count);
    for (size_t i = 0; i < count; ++i) send[k][i] = k * 1e6 + r * 100.0 + static_cast<double>(i);
    if (k % 2 == 0) {
      recv[k].assign(count, -1);
      evs.push_back(comm->all_reduce(send[k], recv[k]));
    } else {
      recv[k].assign(count * n, -1);
      evs.push_back(comm->all_gather(send[k], recv[k]));
    }
  }
  // Wait in reverse order: each event carries its own completion.
  std::vector<Event> reversed(evs.rbegin(), evs.rend());
  ASSERT_EQ(wait_all(reversed), 0);
  const double ranks_sum = n * (n - 1) / 2.0;
  for (int k = 0; k < kOps; ++k) {
    const size_t count = send[k].size();
    for (size_t i = 0; i < count; ++i) {
      if (k % 2 == 0) {
        ASSERT_EQ(recv[k][i], n * (k * 1e6 + static_cast<double>(i)) + 100.0 * ranks_sum) << k << "," << i;
      } else {
        for (int q = 0; q < n; ++q)
          ASSERT_EQ(recv[k][q * count + i], k * 1e6 + q * 100.0 + static_cast<double>(i)) << k << "," << q;
      }
    }
  }
}

TEST(MpiCommunicator, CommunicatorsProgressIndependently) {
  // An operation on comm A waits for a dependency; comm B's operations, called later,
  // complete first: events complete out of call order across communicators.
  auto a = make_mpi();
  auto b = make_mpi();
  const int n = a->size(), r = a->rank();
  auto [gate, open] = HostEvent::make();
  std::vector<int64_t> va{r + 1}, vb{10 * (r + 1)}, vc{100 * (r + 1)};
  Event ea = a->all_reduce(va, ReduceOp::Sum, gate);
  Event eb = b->all_reduce(vb);
  Event ec = b->all_reduce(vc);
  const int failed = wait_all({eb, ec});
  const bool a_ready_early = ea.ready();
  open->complete();
  const int failed_a = wait_all({ea});
  EXPECT_EQ(failed + failed_a, 0);
  EXPECT_FALSE(a_ready_early) << "an operation ran before its dependency completed";
  const int64_t s = int64_t{n} * (n + 1) / 2;
  EXPECT_EQ(va[0], s);
  EXPECT_EQ(vb[0], 10 * s);
  EXPECT_EQ(vc[0], 100 * s);
}

TEST(MpiCommunicator, LaterOperationsWaitBehindADependency) {
  // Call order is wire order: an op called after a gated one must not start first,
  // or ranks whose gates open at different times would pair different operations.
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  auto [gate, open] = HostEvent::make();
  std::vector<int32_t> first{r}, second{r * 100};
  Event e1 = comm->all_reduce(first, ReduceOp::Max, gate);
  Event e2 = comm->all_reduce(second, ReduceOp::Sum);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool second_early = e2.ready();
  // Open the gates at different times on different ranks.
  std::this_thread::sleep_for(std::chrono::milliseconds(20 * r));
  open->complete();
  EXPECT_EQ(wait_all({e2, e1}), 0);
  EXPECT_FALSE(second_early);
  EXPECT_EQ(first[0], n - 1);
  EXPECT_EQ(second[0], 100 * n * (n - 1) / 2);
}

TEST(MpiCommunicator, FailedDependencyStillRunsSoOtherRanksDoNotHang) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  auto [gate, open] = HostEvent::make();
  std::vector<float> v{static_cast<float>(r + 1)};
  Event e = comm->all_reduce(v, ReduceOp::Sum, gate);
  if (r == 0)
    open->complete(std::make_exception_ptr(IoError("read", "/nvme/shard0", 8192, 4096, EIO)));
  else
    open->complete();
  if (r == 0) {
    EXPECT_THROW(e.wait(), IoError);
  } else {
    EXPECT_NO_THROW(e.wait());
  }
  EXPECT_EQ(v[0], static_cast<float>(n * (n + 1) / 2));  // the collective itself ran everywhere
  // The communicator is still in step on every rank.
  std::vector<int32_t> x{1};
  EXPECT_EQ(wait_all({comm->all_reduce(x)}), 0);
  EXPECT_EQ(x[0], n);
}

TEST(MpiCommunicator, UsageErrorsThrowBeforeAnythingStarts) {
  auto comm = make_mpi();
  const int n = comm->size();
  std::vector<float> send(5), wrong(5 * n + 1), right(5 * n);
  std::vector<double> other(5 * n);
  EXPECT_THROW(comm->all_gather(send, wrong), CollectiveUsageError);
  EXPECT_THROW(comm->reduce_scatter(wrong, send), CollectiveUsageError);
  EXPECT_THROW(comm->all_gather(send, other), CollectiveUsageError);
  EXPECT_THROW(comm->all_reduce(send, wrong), CollectiveUsageError);
  EXPECT_THROW(comm->broadcast(send, n), CollectiveUsageError);
  try {
    comm->all_gather(send, wrong);
  } catch (const CollectiveUsageError& e) {
    const std::string expect = "all_gather on rank " + std::to_string(comm->rank()) + " of " + std::to_string(n) +
                               " (mpi): recv holds " + std::to_string(5 * n + 1) +
                               " float, expected send (5 float) x world size " + std::to_string(n) + " = " +
                               std::to_string(5 * n) + " float";
    EXPECT_EQ(e.what(), expect);
  }
  // Nothing was started, so the communicator is still usable and in step.
  EXPECT_EQ(wait_all({comm->all_gather(send, right), comm->barrier()}), 0);
}

TEST(MpiCommunicator, MpiErrorsComeBackAsCollectiveErrors) {
  // Counts that differ between ranks are only visible to MPI: the last rank expects
  // fewer elements than the root sends, and MPI reports the truncation there.
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  std::vector<int32_t> buf(r == n - 1 ? 16 : 64, r == 0 ? 7 : 0);
  Event e = comm->broadcast(buf, 0);
  if (r == n - 1) {
    try {
      e.wait();
      ADD_FAILURE() << "a truncated broadcast succeeded";
    } catch (const CollectiveError& err) {
      const std::string msg = err.what();
      EXPECT_NE(msg.find("MPI_Ibcast failed on rank " + std::to_string(r) + " of " + std::to_string(n)),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("broadcast of 16 int32"), std::string::npos) << msg;
      EXPECT_EQ(err.rank(), r);
    }
  } else {
    EXPECT_NO_THROW(e.wait());
  }
  // The error was returned, not fatal: the process and the communicator go on.
  std::vector<int32_t> x{1};
  EXPECT_EQ(wait_all({comm->all_reduce(x)}), 0);
  EXPECT_EQ(x[0], n);
}

TEST(MpiCommunicator, LargeMessages) {
  auto comm = make_mpi();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 4u << 20;  // 16 MiB of float per rank
  std::vector<float> v(count), g(count * n / 4);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i % 4096) + r);
  std::vector<float> part(count / 4, static_cast<float>(r));
  ASSERT_EQ(wait_all({comm->all_reduce(v), comm->all_gather(part, g)}), 0);
  const int ranks_sum = n * (n - 1) / 2;
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += v[i] != static_cast<float>(n * static_cast<int>(i % 4096) + ranks_sum);
  for (size_t i = 0; i < g.size(); ++i) bad += g[i] != static_cast<float>(i / (count / 4));
  EXPECT_EQ(bad, 0u);
}

TEST(MpiCommunicator, MatchesPlainMpi) {
  auto comm = make_mpi();
  const int r = comm->rank();
  std::vector<double> v(1000), mine(1000), plain(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<double>(i) + r);  // not exactly summable
  ASSERT_EQ(wait_all({comm->all_reduce(v, mine)}), 0);
  ASSERT_EQ(wait_all({run_on_mpi_thread(*comm, [&](MPI_Comm c) {
              ASSERT_EQ(MPI_Allreduce(v.data(), plain.data(), 1000, MPI_DOUBLE, MPI_SUM, c), MPI_SUCCESS);
            })}),
            0);
  EXPECT_EQ(mine, plain);
  auto self = make_host_communicator(HostBackend::Self);
  EXPECT_THROW(run_on_mpi_thread(*self, [](MPI_Comm) {}), CollectiveUsageError);
  // An exception thrown on the MPI thread fails the event, not the thread.
  Event e = run_on_mpi_thread(*comm, [](MPI_Comm) { throw std::runtime_error("from the MPI thread"); });
  EXPECT_THROW(e.wait(), std::runtime_error);
  EXPECT_EQ(wait_all({comm->barrier()}), 0);
}

TEST(MpiCommunicator, CreateAndDestroyRepeatedlyWhileBusy) {
  const int64_t n = make_mpi()->size();
  for (int round = 0; round < 10; ++round) {
    auto comm = make_mpi();
    std::vector<int64_t> v(100000, round + comm->rank());
    comm->all_reduce(v);  // not waited for: the destructor waits
    comm.reset();
    EXPECT_EQ(v[99999], n * round + n * (n - 1) / 2) << round;
  }
}
