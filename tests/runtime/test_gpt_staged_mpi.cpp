// The GPT under the ZeRO engine with the staged communicator (collectives/staged.hpp) for
// its device buffers, at 2 and 4 ranks (mpirun) on the cpu device: every stage, offload
// none/cpu/nvme, fp32 and bf16. Staging changes no arithmetic, so each run's losses,
// gradient norms and final weights are bit-identical to the same run with the mpi
// communicator for its device buffers (as the cpu backend has by default), and within
// gpt.mpi's tolerance of one rank. One run more cuts the staging to a few KiB, so the
// engine's collectives go in many chunks through the pipeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "gpt_harness.hpp"
#include "strata/collectives/staged.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

// gpt.mpi's tolerances against one rank (test_gpt_engine_mpi.cpp gives the reasons).
constexpr double kLossRtol = 5e-5;
constexpr double kLossRtol16 = 3e-2;
constexpr int kSteps = 6;

coll::Communicator& world() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  return *comm;
}

// The staging's own device: a cpu device's memory is host memory, so the engine's device
// buffers (of the device train_gpt makes) are copied by this one's stream just the same.
Device& staging_device() {
  static auto dev = make_device({.backend = Backend::Cpu});
  return *dev;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}
bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

double worst_rel(const RunResult& got, const RunResult& ref) {
  double worst = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    worst = std::max(worst, std::abs(got.losses[s] - ref.losses[s]) / std::abs(ref.losses[s]));
  return worst;
}

}  // namespace

TEST(GptEngineStaged, EveryStageAndOffloadIsBitIdenticalToTheMpiPath) {
  coll::Communicator& comm = world();
  ASSERT_GT(comm.size(), 1) << "run this under mpirun with at least 2 ranks";
  auto staged = coll::make_staged_communicator(coll::make_host_communicator(coll::HostBackend::Mpi), staging_device());
  ASSERT_EQ(staged->backend(), coll::CommBackend::Staged);
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-staged-r" + std::to_string(comm.rank()));
  for (DType precision : {DType::F32, DType::BF16}) {
    const double rtol = precision == DType::F32 ? kLossRtol : kLossRtol16;
    const RunResult one = train_gpt(*self, *self, {.stage = 1, .precision = precision}, kSteps, "");
    for (int stage : {1, 2, 3})
      for (OffloadDevice off : {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme}) {
        const RunSpec spec{.stage = stage, .param = stage == 3 ? off : OffloadDevice::None, .optimizer = off,
                           .precision = precision};
        const std::string what = spec.label() + " at world " + std::to_string(comm.size());
        const RunResult mpi = train_gpt(comm, comm, spec, kSteps, dir.path.string());
        const RunResult got = train_gpt(*staged, comm, spec, kSteps, dir.path.string());
        EXPECT_TRUE(same_bits(got.losses, mpi.losses)) << what << ": losses differ from the mpi path";
        EXPECT_TRUE(same_bits(got.norms, mpi.norms)) << what << ": gradient norms differ from the mpi path";
        EXPECT_TRUE(same_bits(got.weights, mpi.weights)) << what << ": final weights differ from the mpi path";
        EXPECT_LT(got.losses.back(), got.losses.front()) << what << ": it did not learn";
        const double worst = worst_rel(got, one);
        EXPECT_LE(worst, rtol) << what << ": against one rank";
        if (comm.rank() == 0)
          std::printf("staged world %d, %s: loss %.4f -> %.4f, same bits as mpi: %s, max rel loss diff to world 1 %.2e\n",
                      comm.size(), spec.label().c_str(), got.losses.front(), got.losses.back(),
                      same_bits(got.losses, mpi.losses) ? "yes" : "NO", worst);
      }
  }
}

// Staging of 4 KiB: every gather and reduce-scatter of the engine goes in many chunks.
// The MPI library may sum smaller messages in another order, so against the mpi path
// this is held to one rank's tolerance, as world sizes are.
TEST(GptEngineStaged, ChunkedStagingMatchesOneRank) {
  coll::Communicator& comm = world();
  ASSERT_GT(comm.size(), 1) << "run this under mpirun with at least 2 ranks";
  auto staged = coll::make_staged_communicator(coll::make_host_communicator(coll::HostBackend::Mpi), staging_device(),
                                               {.staging_bytes = 4096});
  auto self = coll::make_host_communicator(coll::HostBackend::Self);
  TempDir dir("gpt-staged-chunks-r" + std::to_string(comm.rank()));
  const RunResult one = train_gpt(*self, *self, {.stage = 1}, kSteps, "");
  const RunSpec spec{.stage = 3, .param = OffloadDevice::Nvme, .optimizer = OffloadDevice::Nvme};
  const RunResult got = train_gpt(*staged, comm, spec, kSteps, dir.path.string());
  EXPECT_LE(worst_rel(got, one), kLossRtol) << spec.label() << " at world " << comm.size();
  EXPECT_LT(got.losses.back(), got.losses.front()) << "it did not learn";
}
