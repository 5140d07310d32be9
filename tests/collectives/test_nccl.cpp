// The nccl backend on one process (world size 1, bootstrapped over the self backend).
// Skipped, with the reason, where no GPU is present or NCCL was not built in.
// NOTE: the nccl backend has not yet run on a GPU; these tests are its first check.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/collectives/nccl.hpp"
#include "strata/core/device.hpp"

using namespace strata;
using namespace strata::coll;

namespace {
struct DeviceBuffer {
  Device* dev;
  size_t bytes;
  void* p;
  DeviceBuffer(Device* d, size_t n) : dev(d), bytes(n), p(d->allocate(n)) {}
  ~DeviceBuffer() { dev->deallocate(p, bytes); }
};
}  // namespace

TEST(NcclCommunicator, UnavailableSaysWhy) {
  std::string reason;
  if (nccl_available(&reason)) GTEST_SKIP() << "nccl is available here";
  EXPECT_FALSE(reason.empty());
  auto boot = make_host_communicator(HostBackend::Self);
  EXPECT_THROW(make_nccl_communicator(*boot, 0), Unavailable);
}

TEST(NcclCommunicator, OneRankCollectivesOnDeviceBuffers) {
  std::string reason;
  if (!nccl_available(&reason)) GTEST_SKIP() << reason;
  auto boot = make_host_communicator(HostBackend::Self);
  auto comm = make_nccl_communicator(*boot, 0);
  EXPECT_EQ(comm->backend(), CommBackend::Nccl);
  EXPECT_EQ(comm->size(), 1);
  auto dev = make_device({Backend::Cuda, 0});
  auto stream = dev->create_stream("test");
  const size_t count = 1 << 16;
  std::vector<float> host(count), back(count, -1.0f);
  for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i);
  DeviceBuffer a(dev.get(), count * sizeof(float)), b(dev.get(), count * sizeof(float));
  stream->copy_async(a.p, host.data(), a.bytes);
  stream->synchronize();
  auto va = MutView::elements(a.p, count, DataType::F32);
  auto vb = MutView::elements(b.p, count, DataType::F32);
  Event e1 = comm->all_reduce(va, vb);
  Event e2 = comm->all_gather(vb, va, e1);
  Event e3 = comm->reduce_scatter(va, vb, ReduceOp::Max, e2);
  Event e4 = comm->broadcast(vb, 0, e3);
  Event e5 = comm->barrier(e4);
  e5.wait();
  e1.wait();
  stream->copy_async(back.data(), b.p, b.bytes);
  stream->synchronize();
  EXPECT_EQ(back, host);
}
