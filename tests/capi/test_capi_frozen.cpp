// Frozen groups through the C API (strata_group_desc.kind = STRATA_GROUP_FROZEN, API 1.2):
// a frozen base beside a trained adapter, as a LoRA run has them. The tiers hold the
// frozen group's parameters alone (read from strata_get_stats, compared with the
// arithmetic of every state), its values never change while the adapter's do, its
// gradient calls are refused, and checkpoints save, load and resume it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "capi_harness.hpp"
#include "capi_precision.hpp"
#include "strata/strata.h"

namespace {

using namespace capi_test;

// Sizes chosen so that no shard is padded (multiples of 1024 elements, the alignment)
// and every tensor is a whole number of 4 KiB units in 16 and 32 bits: the tier's bytes
// are then exactly the elements times their widths, with no rounding to account for.
const std::vector<int64_t> kBaseShape = {256, 1024};   // frozen, 262144 elements
const std::vector<int64_t> kAdapterShape = {8, 1024};  // trained, 8192 elements
constexpr uint64_t kBase = 256 * 1024, kAdapter = 8 * 1024;

struct FrozenRun {
  strata_dtype t = STRATA_BF16;
  std::string offload = "cpu";  // both homes: "cpu" (pinned) or "nvme"
  bool base_frozen = true;
  int stage = 3;
};

std::string run_config(const FrozenRun& r, const std::string& nvme_dir) {
  ConfigSpec c;
  c.stage = r.stage;
  c.offload = r.offload;
  c.nvme_dir = nvme_dir;
  if (r.t != STRATA_F32) c.extra = precision_section(r.t);
  return config_json(c);
}

uint64_t width(strata_dtype t) { return t == STRATA_F32 ? 4 : 2; }

// The base (0, frozen unless r.base_frozen is false) and the adapter (1), from data.
void register_pair(strata_runtime rt, const FrozenRun& r) {
  for (int g = 0; g < 2; ++g) {
    const std::vector<int64_t>& shape = g == 0 ? kBaseShape : kAdapterShape;
    const uint64_t n = g == 0 ? kBase : kAdapter;
    std::vector<float> f(n);
    for (uint64_t i = 0; i < n; ++i) f[i] = initial_value(g, i);
    std::vector<uint16_t> h(n);
    for (uint64_t i = 0; i < n; ++i) h[i] = r.t == STRATA_F32 ? 0 : bits16(r.t, f[i]);
    strata_group_desc d = group_desc(g == 0 ? "base" : "adapter", shape, r.t, STRATA_INIT_DATA, 0.0f);
    d.data = r.t == STRATA_F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(h.data());
    d.kind = g == 0 && r.base_frozen ? STRATA_GROUP_FROZEN : STRATA_GROUP_TRAINED;
    int32_t id = -1;
    ASSERT_STRATA_OK(strata_register_group(rt, &d, &id));
    ASSERT_EQ(id, g);
  }
}

// One micro-batch: both groups acquired forward and backward; only the trained ones hand
// in a gradient (here the adapter's: its values minus a target; the base's too when it
// is trained).
void micro_step(strata_runtime rt, const FrozenRun& r, int step) {
  ASSERT_STRATA_OK(strata_begin_micro_step(rt));
  for (int g : {0, 1, 1, 0}) {
    strata_buffer b{};
    ASSERT_STRATA_OK(strata_acquire(rt, g, &b));
    ASSERT_STRATA_OK(strata_release(rt, g));
  }
  for (int g = r.base_frozen ? 1 : 0; g < 2; ++g) {
    const uint64_t n = g == 0 ? kBase : kAdapter;
    std::vector<float> w(n);
    ASSERT_STRATA_OK(strata_read_params(rt, g, w.data(), STRATA_F32, n));
    std::vector<float> gf(n);
    std::vector<uint16_t> gh(n);
    for (uint64_t i = 0; i < n; ++i) {
      gf[i] = w[i] - target_value(g, i, step);
      if (r.t != STRATA_F32) gh[i] = bits16(r.t, gf[i]);
    }
    const void* p = r.t == STRATA_F32 ? static_cast<const void*>(gf.data()) : static_cast<const void*>(gh.data());
    ASSERT_STRATA_OK(strata_grad_submit(rt, g, p, r.t, n));
  }
}

void train(strata_runtime rt, const FrozenRun& r, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    micro_step(rt, r, s);
    int32_t stepped = -1;
    ASSERT_STRATA_OK(strata_step(rt, &stepped));
    ASSERT_EQ(stepped, 1);
  }
}

// The group's parameters as stored: their bytes in the runtime's dtype.
std::vector<std::byte> raw_params(strata_runtime rt, const FrozenRun& r, int32_t g) {
  const uint64_t n = g == 0 ? kBase : kAdapter;
  std::vector<std::byte> out(n * width(r.t));
  EXPECT_STRATA_OK(strata_read_params(rt, g, out.data(), r.t, n));
  return out;
}

strata_stats get_stats(strata_runtime rt) {
  strata_stats s{};
  s.struct_size = sizeof s;
  EXPECT_STRATA_OK(strata_get_stats(rt, &s));
  return s;
}

// The home bytes of the offload tier: each group's parameter shard in the working type;
// a trained group adds its gradient (the working type: one micro-batch per step, nothing
// accumulated), its fp32 master weights and two fp32 moments.
uint64_t expected_home_bytes(const FrozenRun& r) {
  const uint64_t w = width(r.t);
  const uint64_t trained = w + w + (r.t == STRATA_F32 ? 0 : 4) + 4 + 4;  // fp32: the shard is the master
  return (r.base_frozen ? w : trained) * kBase + trained * kAdapter;
}

class FrozenTiers : public ::testing::TestWithParam<std::tuple<strata_dtype, std::string>> {};

TEST_P(FrozenTiers, HoldOnlyTheFrozenGroupsParametersAndLeaveThemUnchanged) {
  const auto [t, offload] = GetParam();
  TempDir nvme("frozen-nvme");
  const strata_tier tier = offload == "nvme" ? STRATA_TIER_NVME : STRATA_TIER_PINNED;
  uint64_t used[2] = {0, 0};  // [frozen base, trained base]
  for (bool frozen : {true, false}) {
    const FrozenRun r{t, offload, frozen};
    RuntimeHandle h(run_config(r, nvme.path.string()));
    register_pair(h.rt, r);
    ASSERT_STRATA_OK(strata_start(h.rt));
    const std::vector<std::byte> base0 = raw_params(h.rt, r, 0), adapter0 = raw_params(h.rt, r, 1);
    train(h.rt, r, 0, 3);
    const strata_stats s = get_stats(h.rt);
    EXPECT_EQ(s.optimizer_steps, 3);
    used[frozen ? 0 : 1] = s.tiers[tier].used;
    EXPECT_EQ(s.tiers[tier].used, expected_home_bytes(r))
        << offload << ", base " << (frozen ? "frozen" : "trained") << ": the tier holds other bytes than the states";
    // (With NVMe homes, pinned memory also keeps cache copies of them, as budget allows: not homes.)
    EXPECT_LE(s.tiers[STRATA_TIER_PINNED].peak, s.tiers[STRATA_TIER_PINNED].budget);
    const std::vector<std::byte> base1 = raw_params(h.rt, r, 0), adapter1 = raw_params(h.rt, r, 1);
    if (frozen) {
      EXPECT_EQ(std::memcmp(base0.data(), base1.data(), base0.size()), 0) << "a frozen group's parameters changed";
    } else {
      EXPECT_NE(std::memcmp(base0.data(), base1.data(), base0.size()), 0) << "a trained group did not train";
    }
    EXPECT_NE(std::memcmp(adapter0.data(), adapter1.data(), adapter0.size()), 0) << "the adapter did not train";
    EXPECT_GT(s.last_grad_norm, 0.0);
  }
  // Freezing saves the gradient, the master weights and the moments of every base element.
  const uint64_t w = width(t);
  EXPECT_EQ(used[1] - used[0], kBase * (w + (t == STRATA_F32 ? 0 : 4) + 8));
}

INSTANTIATE_TEST_SUITE_P(Precisions, FrozenTiers,
                         ::testing::Values(std::make_tuple(STRATA_BF16, std::string("cpu")),
                                           std::make_tuple(STRATA_BF16, std::string("nvme")),
                                           std::make_tuple(STRATA_F32, std::string("cpu"))));

// The gradient norm is the adapter's alone: the same with the base frozen as with a base
// that is not there at all.
TEST(CApiFrozen, GradientNormLeavesFrozenGroupsOut) {
  const FrozenRun r{STRATA_BF16, "cpu", true};
  RuntimeHandle h(run_config(r, ""));
  register_pair(h.rt, r);
  micro_step(h.rt, r, 0);
  ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
  double expected = 0;
  std::vector<float> w(kAdapter);
  // The step's gradient was the initial adapter minus the target, rounded to bf16.
  for (uint64_t i = 0; i < kAdapter; ++i) {
    const double d = round16(STRATA_BF16, round16(STRATA_BF16, initial_value(1, i)) - target_value(1, i, 0));
    expected += d * d;
  }
  EXPECT_NEAR(get_stats(h.rt).last_grad_norm, std::sqrt(expected), 1e-4 * std::sqrt(expected));
}

TEST(CApiFrozen, GradientCallsOnAFrozenGroupAreRefused) {
  const FrozenRun r{STRATA_BF16, "cpu", true};
  RuntimeHandle h(run_config(r, ""));
  register_pair(h.rt, r);
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  strata_buffer b{};
  EXPECT_STRATA_FAILS(strata_grad_buffer(h.rt, 0, &b), STRATA_ERR_INVALID_ARGUMENT, "'base' is frozen");
  EXPECT_STRATA_FAILS(strata_grad_ready(h.rt, 0), STRATA_ERR_INVALID_ARGUMENT, "STRATA_GROUP_TRAINED");
  std::vector<uint16_t> g(kBase, 0);
  EXPECT_STRATA_FAILS(strata_grad_submit(h.rt, 0, g.data(), STRATA_BF16, kBase), STRATA_ERR_INVALID_ARGUMENT,
                      "strata_grad_submit: group 'base' is frozen");
  // The adapter's gradient completes the micro-batch: the base owes none.
  std::vector<uint16_t> ga(kAdapter, bits16(STRATA_BF16, 0.5f));
  ASSERT_STRATA_OK(strata_grad_submit(h.rt, 1, ga.data(), STRATA_BF16, kAdapter));
  int32_t stepped = -1;
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 1);
  // Without the adapter's gradient the micro-batch is not complete.
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  EXPECT_STRATA_FAILS(strata_step(h.rt, nullptr), STRATA_ERR_STATE, "group 'adapter' has no gradient");
}

TEST(CApiFrozen, KindIsCheckedAndOlderDescsTrain) {
  RuntimeHandle h(config16(STRATA_BF16));
  strata_group_desc d = group_desc("w", kAdapterShape, STRATA_BF16, STRATA_INIT_ZEROS, 0.0f);
  d.kind = static_cast<strata_group_kind>(7);
  int32_t id = -1;
  EXPECT_STRATA_FAILS(strata_register_group(h.rt, &d, &id), STRATA_ERR_INVALID_ARGUMENT, "not a strata_group_kind");
  // A caller built against API 1.1 passes the desc without `kind`; what lies beyond it is
  // never read (here a kind that would be refused), and the group is trained.
  d.struct_size = offsetof(strata_group_desc, kind);
  ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  strata_buffer b{};
  EXPECT_STRATA_OK(strata_grad_buffer(h.rt, id, &b));
  EXPECT_STRATA_OK(strata_grad_ready(h.rt, id));
}

// Save mid-run, train on; load into a new runtime and train the same steps: the same
// values, bit for bit. A runtime whose base is trained refuses the checkpoint.
TEST(CApiFrozen, CheckpointsSaveLoadAndResumeFrozenGroups) {
  TempDir dir("frozen-ckpt"), nvme("frozen-ckpt-nvme");
  const FrozenRun r{STRATA_BF16, "nvme", true};
  std::vector<std::byte> base, adapter;
  char saved[4096];
  {
    RuntimeHandle h(run_config(r, nvme.path.string()));
    register_pair(h.rt, r);
    train(h.rt, r, 0, 2);
    ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, dir.path.c_str(), nullptr, saved, sizeof saved));
    train(h.rt, r, 2, 2);
    base = raw_params(h.rt, r, 0);
    adapter = raw_params(h.rt, r, 1);
  }
  {
    FrozenRun other = r;
    other.offload = "cpu";  // another tier: the checkpoint holds values, not placements
    RuntimeHandle h(run_config(other, ""));
    // Registered with other initial values: all of them come from the checkpoint.
    for (int g = 0; g < 2; ++g) {
      strata_group_desc d = group_desc(g == 0 ? "base" : "adapter", g == 0 ? kBaseShape : kAdapterShape, r.t,
                                       STRATA_INIT_ZEROS, 0.0f);
      d.kind = g == 0 ? STRATA_GROUP_FROZEN : STRATA_GROUP_TRAINED;
      int32_t id = -1;
      ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
    }
    ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, saved, nullptr, 0));
    train(h.rt, other, 2, 2);
    const std::vector<std::byte> b = raw_params(h.rt, other, 0), a = raw_params(h.rt, other, 1);
    EXPECT_EQ(std::memcmp(b.data(), base.data(), base.size()), 0) << "the frozen group did not come back";
    EXPECT_EQ(std::memcmp(a.data(), adapter.data(), adapter.size()), 0) << "the resumed run differs";
  }
  {
    FrozenRun trained = r;
    trained.base_frozen = false;
    RuntimeHandle h(run_config(trained, nvme.path.string()));
    register_pair(h.rt, trained);
    EXPECT_STRATA_FAILS(strata_load_checkpoint(h.rt, saved, nullptr, 0), STRATA_ERR_CONFIG,
                        "saved group 'base' frozen");
  }
}

// Stages 1 and 2 replicate the parameters: a frozen group is not all-reduced, its replicated
// copy is not re-gathered after a step, and a checkpoint reads it from the device.
TEST(CApiFrozen, StagesOneAndTwoKeepFrozenGroupsAndCheckpointThem) {
  for (int stage : {1, 2}) {
    TempDir dir("frozen-s12");
    const FrozenRun r{STRATA_BF16, "cpu", true, stage};
    char saved[4096];
    std::vector<std::byte> base0, adapter2;
    {
      RuntimeHandle h(run_config(r, ""));
      register_pair(h.rt, r);
      ASSERT_STRATA_OK(strata_start(h.rt));
      base0 = raw_params(h.rt, r, 0);
      const std::vector<std::byte> adapter0 = raw_params(h.rt, r, 1);
      train(h.rt, r, 0, 2);
      EXPECT_EQ(raw_params(h.rt, r, 0), base0) << "stage " << stage << ": the frozen group changed";
      EXPECT_NE(raw_params(h.rt, r, 1), adapter0) << "stage " << stage << ": the adapter did not train";
      ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, dir.path.c_str(), nullptr, saved, sizeof saved));
      train(h.rt, r, 2, 1);
      adapter2 = raw_params(h.rt, r, 1);
    }
    RuntimeHandle h(run_config(r, ""));
    for (int g = 0; g < 2; ++g) {
      strata_group_desc d = group_desc(g == 0 ? "base" : "adapter", g == 0 ? kBaseShape : kAdapterShape, r.t,
                                       STRATA_INIT_ZEROS, 0.0f);
      d.kind = g == 0 ? STRATA_GROUP_FROZEN : STRATA_GROUP_TRAINED;
      int32_t id = -1;
      ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
    }
    ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, saved, nullptr, 0));
    EXPECT_EQ(raw_params(h.rt, r, 0), base0) << "stage " << stage << ": the frozen group did not come back";
    train(h.rt, r, 2, 1);
    EXPECT_EQ(raw_params(h.rt, r, 1), adapter2) << "stage " << stage << ": the resumed run differs";
  }
}

}  // namespace
