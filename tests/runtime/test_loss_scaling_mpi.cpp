// fp16 loss scaling across ranks (mpirun at 2 and 4 ranks): an inf in one rank's
// gradient skips the step on every rank, before any state changes, and halves the scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine_harness.hpp"
#include "strata/core/math/half.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

coll::Communicator& world() {
  static auto comm = coll::make_host_communicator(coll::HostBackend::Mpi);
  return *comm;
}

constexpr uint64_t kNumel = 5000;

// One micro-step: every rank hands in gradient value g(i) = sin(i + step) / 100, times
// the loss scale, in fp16; `poison_rank` writes +inf into element 17 instead.
void micro_step(ZeroEngine& e, int step, int poison_rank) {
  e.begin_micro_step();
  e.acquire_params(0);  // the model's forward reads the parameters
  e.release_params(0);
  std::vector<uint16_t> host(kNumel);
  for (uint64_t i = 0; i < kNumel; ++i)
    host[i] = math::float_to_fp16(static_cast<float>(std::sin(double(i + step)) / 100 * e.loss_scale()));
  if (e.comm().rank() == poison_rank) host[17] = math::float_to_fp16(std::numeric_limits<float>::infinity());
  std::memcpy(e.gradient_buffer(0), host.data(), kNumel * 2);  // cpu backend: device memory is host memory
  e.grads_ready(0);
}

struct States {
  std::vector<float> master, m, v, params;
  bool operator==(const States& o) const = default;
};

States states(ZeroEngine& e) {
  States s;
  const uint64_t n = e.shard_numel(0);
  s.master.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  e.read_optimizer_shard(0, s.master.data(), s.m.data(), s.v.data());
  s.params = e.gather_full_params(0);
  return s;
}

}  // namespace

TEST(LossScalingMpi, AnInfOnOneRankSkipsTheStepEverywhereWithStatesUntouched) {
  coll::Communicator& comm = world();
  ASSERT_GT(comm.size(), 1) << "run this under mpirun with at least 2 ranks";
  for (int stage : {1, 2, 3}) {
    RunSpec spec{.stage = stage, .param = OffloadDevice::None, .optimizer = OffloadDevice::Cpu,
                 .precision = DType::F16};
    EngineOptions o = test_engine_options(spec, kNumel, "");
    o.fp16.enabled = true;
    o.fp16.initial_scale_power = 10;
    o.fp16.hysteresis = 1;
    auto device = make_device({});
    ZeroEngine e(*device, comm, comm, o, {{.name = "g", .numel = kNumel}});
    EXPECT_EQ(e.dtype(), DType::F16);
    EXPECT_EQ(e.loss_scale(), 1024.0);
    micro_step(e, 0, -1);
    ASSERT_TRUE(e.step());
    const States before = states(e);
    micro_step(e, 1, comm.size() - 1);  // the last rank overflows
    EXPECT_FALSE(e.step()) << "stage " << stage << ", rank " << comm.rank();
    EXPECT_EQ(e.loss_scale(), 512.0);
    EXPECT_EQ(e.stats().skipped_steps, 1u);
    EXPECT_EQ(e.optimizer_steps(), 1);
    EXPECT_EQ(e.iterations(), 2);
    EXPECT_TRUE(states(e) == before) << "stage " << stage << ": a skipped step changed the states";
    micro_step(e, 2, -1);
    EXPECT_TRUE(e.step());
    EXPECT_EQ(e.optimizer_steps(), 2);
    EXPECT_FALSE(states(e) == before);
    // The step after the skip used the new scale: the norm it reports is of the unscaled gradient.
    double expect = 0;
    for (uint64_t i = 0; i < kNumel; ++i) {
      const double g = math::fp16_to_float(math::float_to_fp16(static_cast<float>(std::sin(double(i + 2)) / 100 * 512)));
      expect += g * g;
    }
    EXPECT_NEAR(e.stats().last_grad_norm, std::sqrt(expect) / 512, 1e-3 * std::sqrt(expect) / 512);
  }
}
