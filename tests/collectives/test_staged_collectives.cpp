// The staged communicator (staged.hpp) under mpirun at 2 and 4 ranks (and as an MPI
// singleton), on buffers in the cpu device's memory. Staging is cut to a few hundred
// bytes, so every operation goes in many chunks through both slots and the pipeline
// (copy-in of chunk i+1 during the collective of chunk i) is exercised. Values depend on
// the rank and are integers exact in their type, so results are checked exactly.
//
// As in test_mpi_collectives.cpp, every rank posts and waits for every operation before
// checking values, so a failed check on one rank does not leave the others waiting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/staged.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "wait_all.hpp"

using namespace strata;
using namespace strata::coll;
using strata::coll::test_support::wait_all;

namespace {

Device& cpu() {
  static auto dev = make_device({.backend = Backend::Cpu});
  return *dev;
}

// Staging of 2 slots of 96 bytes: 24 floats a slot for all_reduce, 6 per rank for
// all_gather at world 4, 4 per rank for reduce_scatter at world 4 (a slot holds the
// world's parts and the result).
constexpr size_t kSmallStaging = 192;

std::unique_ptr<Communicator> make_staged(size_t staging = kSmallStaging) {
  return make_staged_communicator(make_host_communicator(HostBackend::Mpi), cpu(), {.staging_bytes = staging});
}

// n elements of T in the cpu device's memory, filled with a sentinel.
template <class T>
struct DeviceBuf {
  explicit DeviceBuf(size_t n, T fill) : n(n), p(static_cast<T*>(cpu().allocate(std::max<size_t>(n, 1) * sizeof(T)))) {
    std::fill(p, p + n, fill);
  }
  ~DeviceBuf() { cpu().deallocate(p, std::max<size_t>(n, 1) * sizeof(T)); }
  DeviceBuf(const DeviceBuf&) = delete;
  std::span<T> span() { return {p, n}; }
  T& operator[](size_t i) { return p[i]; }
  size_t n;
  T* p;
};

}  // namespace

TEST(StagedCommunicator, HasTheHostCommunicatorsShape) {
  auto comm = make_staged();
  auto host = make_host_communicator(HostBackend::Mpi);
  EXPECT_EQ(comm->backend(), CommBackend::Staged);
  EXPECT_STREQ(to_string(comm->backend()), "staged");
  EXPECT_EQ(comm->rank(), host->rank());
  EXPECT_EQ(comm->size(), host->size());
  EXPECT_EQ(comm->local_rank(), host->local_rank());
  EXPECT_EQ(comm->local_size(), host->local_size());
}

TEST(StagedCommunicator, RefusesStagingTooSmallForTheWorldNamingTheMinimum) {
  const int world = make_host_communicator(HostBackend::Mpi)->size();
  try {
    make_staged(min_staging_bytes(world) - 1);
    FAIL() << "staging below the minimum was accepted";
  } catch (const CollectiveUsageError& e) {
    EXPECT_NE(std::string(e.what()).find("at least " + std::to_string(min_staging_bytes(world))), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(make_staged(min_staging_bytes(world)));
}

TEST(StagedCommunicator, AllReduceInManyChunksInAndOutOfPlace) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 1001;  // odd: the last chunk is short
  DeviceBuf<float> a(count, 0), sum(count, -1), inplace(count, 0), max(count, -1);
  DeviceBuf<double> d(37, 0);
  DeviceBuf<Bf16> b(count, Bf16{0});
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>(static_cast<int>(i) - r);
    inplace[i] = a[i];
    b[i] = to_bf16(static_cast<float>(i % 64) + r);  // sums below 256: exact in bf16
  }
  for (size_t i = 0; i < d.n; ++i) d[i] = r * 0.25 + static_cast<double>(i);
  std::vector<Event> evs{comm->all_reduce(a.span(), sum.span()), comm->all_reduce(inplace.span()),
                         comm->all_reduce(a.span(), max.span(), ReduceOp::Max), comm->all_reduce(d.span()),
                         comm->all_reduce(b.span())};
  ASSERT_EQ(wait_all(evs), 0);
  const int ranks_sum = n * (n - 1) / 2;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(sum[i], static_cast<float>(n * static_cast<int>(i) - ranks_sum)) << i;
    ASSERT_EQ(inplace[i], sum[i]) << i;
    ASSERT_EQ(max[i], static_cast<float>(static_cast<int>(i))) << i;  // rank 0's
    ASSERT_EQ(to_float(b[i]), static_cast<float>(n * static_cast<int>(i % 64) + ranks_sum)) << i;
  }
  for (size_t i = 0; i < d.n; ++i) ASSERT_EQ(d[i], 0.25 * ranks_sum + n * static_cast<double>(i)) << i;
}

TEST(StagedCommunicator, AllGatherInManyChunksInAndOutOfPlace) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 53;  // per rank, odd
  DeviceBuf<float> send(count, 0), recv(count * n, -1), inplace(count * n, -1);
  DeviceBuf<Bf16> bsend(count, Bf16{0}), brecv(count * n, to_bf16(-1));
  for (size_t i = 0; i < count; ++i) {
    send[i] = static_cast<float>(r * 10000 + static_cast<int>(i));
    inplace[r * count + i] = static_cast<float>(r + 0.5 * i);
    bsend[i] = to_bf16(static_cast<float>(r * 32 + static_cast<int>(i % 32)));
  }
  std::span<float> mine = inplace.span().subspan(r * count, count);
  std::vector<Event> evs{comm->all_gather(send.span(), recv.span()),
                         comm->all_gather(std::span<const float>(mine), inplace.span()),
                         comm->all_gather(bsend.span(), brecv.span())};
  ASSERT_EQ(wait_all(evs), 0);
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(recv[k * count + i], static_cast<float>(k * 10000 + static_cast<int>(i))) << k << "," << i;
      ASSERT_EQ(inplace[k * count + i], static_cast<float>(k + 0.5 * i)) << k << "," << i;
      ASSERT_EQ(to_float(brecv[k * count + i]), static_cast<float>(k * 32 + static_cast<int>(i % 32))) << k << "," << i;
    }
}

TEST(StagedCommunicator, ReduceScatterInManyChunks) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 41;  // per rank, odd
  DeviceBuf<float> send(count * n, 0), recv(count, -1), recv_max(count, -1);
  DeviceBuf<int64_t> send_l(count * n, 0), recv_l(count, -1);
  DeviceBuf<Bf16> grads(count * n, Bf16{0}), mine(count, to_bf16(-1));
  for (size_t i = 0; i < count * n; ++i) {
    send[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
    send_l[i] = (int64_t{r + 1} << 36) + static_cast<int64_t>(i);
    grads[i] = to_bf16(static_cast<float>(i % 50) + r);  // sums below 256: exact in bf16
  }
  std::vector<Event> evs{comm->reduce_scatter(send.span(), recv.span()), comm->reduce_scatter(send_l.span(), recv_l.span()),
                         comm->reduce_scatter(send.span(), recv_max.span(), ReduceOp::Max),
                         comm->reduce_scatter(grads.span(), mine.span())};
  ASSERT_EQ(wait_all(evs), 0);
  const int64_t ranks_sum = int64_t{n} * (n - 1) / 2;
  for (size_t j = 0; j < count; ++j) {
    const int64_t i = static_cast<int64_t>(r * count + j);
    ASSERT_EQ(recv[j], static_cast<float>(1000 * ranks_sum + n * i)) << j;
    ASSERT_EQ(recv_l[j], ((ranks_sum + n) << 36) + n * i) << j;
    ASSERT_EQ(recv_max[j], static_cast<float>((n - 1) * 1000 + i)) << j;
    ASSERT_EQ(to_float(mine[j]), static_cast<float>(n * (i % 50) + ranks_sum)) << j;
  }
}

TEST(StagedCommunicator, AllToAllInManyChunks) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 29;  // per part, odd: several chunks of a few elements
  DeviceBuf<float> send(count * n, 0), recv(count * n, -1);
  DeviceBuf<uint8_t> bytes(count * n, 0), bytes_in(count * n, 0xff);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < count; ++i) {
      send[j * count + i] = static_cast<float>(r * 10000 + j * 100 + static_cast<int>(i));
      bytes[j * count + i] = static_cast<uint8_t>(r * 17 + j * 5 + i);
    }
  std::vector<Event> evs{comm->all_to_all(send.span(), recv.span()), comm->all_to_all(bytes.span(), bytes_in.span())};
  ASSERT_EQ(wait_all(evs), 0);
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(recv[k * count + i], static_cast<float>(k * 10000 + r * 100 + static_cast<int>(i))) << k << "," << i;
      ASSERT_EQ(bytes_in[k * count + i], static_cast<uint8_t>(k * 17 + r * 5 + i)) << k << "," << i;
    }
}

TEST(StagedCommunicator, BroadcastFromEveryRootInManyChunks) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 131;
  std::vector<std::unique_ptr<DeviceBuf<int32_t>>> bufs;
  for (int root = 0; root < n; ++root) {
    bufs.push_back(std::make_unique<DeviceBuf<int32_t>>(count, -1));
    if (r == root)
      for (size_t i = 0; i < count; ++i) (*bufs[root])[i] = root * 1000 + static_cast<int32_t>(i);
  }
  std::vector<Event> evs;
  for (int root = 0; root < n; ++root) evs.push_back(comm->broadcast(bufs[root]->span(), root));
  ASSERT_EQ(wait_all(evs), 0);
  for (int root = 0; root < n; ++root)
    for (size_t i = 0; i < count; ++i) ASSERT_EQ((*bufs[root])[i], root * 1000 + static_cast<int32_t>(i)) << root;
}

TEST(StagedCommunicator, NoElementsAndBarrierComplete) {
  auto comm = make_staged();
  DeviceBuf<float> none(0, 0);
  std::vector<Event> evs{comm->all_reduce(none.span()), comm->barrier(), comm->broadcast(none.span(), 0)};
  EXPECT_EQ(wait_all(evs), 0);
}

// Each operation's event asks a CUDA stream ordered after it to wait on the host
// (HostEvent::DeviceWait::Host): the copies that complete it are issued later, and a
// stream held on the GPU could hold them on a shared hardware queue (two ranks on one
// H100 hung so, 2026-11-28). The host communicator's own events leave it to the GPU.
TEST(StagedCommunicator, ItsEventsAreWaitedForOnTheHost) {
  auto comm = make_staged();
  DeviceBuf<float> buf(64, 1);
  Event ev = comm->all_reduce(buf.span());
  auto* host = dynamic_cast<HostEvent*>(ev.impl());
  ASSERT_NE(host, nullptr) << "a staged operation's event is not a host event";
  EXPECT_EQ(host->device_wait(), HostEvent::DeviceWait::Host);
  EXPECT_NO_THROW(ev.wait());
  EXPECT_EQ(buf[0], static_cast<float>(comm->size()));
  auto [plain, completer] = HostEvent::make();
  EXPECT_EQ(static_cast<HostEvent*>(plain.impl())->device_wait(), HostEvent::DeviceWait::Stream);
  completer->complete();
}

// One chunk (the default staging): the host communicator's collective on the same
// elements, so the bits equal those of the mpi backend on host buffers, for arbitrary
// floats (whose sums round).
TEST(StagedCommunicator, OneChunkIsBitIdenticalToTheHostCommunicator) {
  auto staged = make_staged_communicator(make_host_communicator(HostBackend::Mpi), cpu());
  auto host = make_host_communicator(HostBackend::Mpi);
  const int n = staged->size(), r = staged->rank();
  const size_t count = 4099;
  std::mt19937 rng(17 + r);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  DeviceBuf<float> dev(count * n, 0), dev_rs(count, 0);
  std::vector<float> ref(count * n), ref_rs(count);
  for (size_t i = 0; i < count * n; ++i) ref[i] = dev[i] = dist(rng) * 1e3f;
  std::vector<float> ref_send(ref);
  std::vector<Event> evs{staged->reduce_scatter(dev.span(), dev_rs.span()), host->reduce_scatter(ref_send, ref_rs),
                         staged->all_reduce(dev.span()), host->all_reduce(ref)};
  ASSERT_EQ(wait_all(evs), 0);
  EXPECT_EQ(std::memcmp(dev.p, ref.data(), count * n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dev_rs.p, ref_rs.data(), count * sizeof(float)), 0);
  size_t nonzero = 0;
  for (size_t i = 0; i < count; ++i) nonzero += dev_rs[i] != 0.0f;
  EXPECT_GT(nonzero, count / 2) << "the result is mostly zeros: nothing was reduced";
}

// An `after` that fails: the operation still runs on this rank (the others would wait for
// it otherwise) and its event fails with after's error; the next operation is unaffected.
TEST(StagedCommunicator, AFailedAfterFailsTheOperationWhichStillRuns) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 100;
  DeviceBuf<float> buf(count, static_cast<float>(r + 1)), next(count, 1.0f);
  auto [after, host] = HostEvent::make();
  Event failed = comm->all_reduce(buf.span(), ReduceOp::Sum, after);
  Event behind = comm->all_reduce(next.span());
  host->complete(std::make_exception_ptr(std::runtime_error("the producer failed")));
  try {
    failed.wait();
    ADD_FAILURE() << "the operation after a failed event succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the producer failed");
  }
  ASSERT_EQ(wait_all({behind}), 0);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(buf[i], static_cast<float>(n * (n + 1) / 2)) << i;  // it ran
    ASSERT_EQ(next[i], static_cast<float>(n)) << i;
  }
}

// Operations start in call order: one held back by its `after` holds back the ones called
// after it, on every rank, so call order stays the order on the wire.
TEST(StagedCommunicator, AnOperationWaitingForAfterHoldsBackLaterOnes) {
  auto comm = make_staged();
  const int n = comm->size(), r = comm->rank();
  DeviceBuf<float> first(10, static_cast<float>(r)), second(10, 2.0f);
  auto [after, host] = HostEvent::make();
  Event a = comm->all_reduce(first.span(), ReduceOp::Max, after);
  Event b = comm->all_reduce(second.span());
  // b cannot have started: it is queued behind a, which waits for `after`.
  EXPECT_FALSE(a.ready());
  EXPECT_FALSE(b.ready());
  EXPECT_EQ(second[0], 2.0f);
  host->complete();
  ASSERT_EQ(wait_all({a, b}), 0);
  EXPECT_EQ(first[9], static_cast<float>(n - 1));
  EXPECT_EQ(second[9], 2.0f * n);
}
