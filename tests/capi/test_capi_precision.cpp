// The C API in 16 bits (bf16 and fp16 configurations): buffers of the runtime's dtype,
// training against a reference that rounds where Strata rounds, the dtype errors, the
// fp16 loss scale and its overflow skip, checkpoints, and the 1.1 struct fields.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "capi_precision.hpp"

using namespace capi_test;

namespace {

double loss_scale_of(strata_runtime rt) {
  double s = -1;
  EXPECT_STRATA_OK(strata_loss_scale(rt, &s));
  return s;
}

strata_stats stats_of(strata_runtime rt) {
  strata_stats st{};
  st.struct_size = sizeof st;
  EXPECT_STRATA_OK(strata_get_stats(rt, &st));
  return st;
}

}  // namespace

TEST(CApiPrecision, TheReferenceConversionsRoundToNearestEven) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-8f), 0x3f80);            // tie: to even (down)
  EXPECT_EQ(bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);        // tie: to even (up)
  EXPECT_EQ(bf16_bits(-1.0f - 0x1p-8f - 0x1p-20f), 0xbf81);  // above the tie: away
  EXPECT_EQ(fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(fp16_bits(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(fp16_bits(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(fp16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(fp16_bits(65519.0f), 0x7bff);
  EXPECT_EQ(fp16_bits(65520.0f), 0x7c00);                   // the tie with 2^16 overflows
  EXPECT_EQ(fp16_bits(0x1p-24f), 0x0001);                   // smallest subnormal
  EXPECT_EQ(fp16_bits(0x1p-25f), 0x0000);                   // tie with zero: to even
  EXPECT_EQ(fp16_bits(0x1p-14f - 0x1p-26f), 0x0400);        // rounds up into the smallest normal
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    ASSERT_EQ(fp16_bits(fp16_value(static_cast<uint16_t>(h))), h);
    ASSERT_EQ(bf16_bits(bf16_value(static_cast<uint16_t>(h))), h);
  }
}

// 16-bit training through the C API follows Reference16, for each stage and offload.
// Strata's master weights are fp32 and the reference's double, so where a master weight
// lies within their difference (about 1e-7 relative after 8 steps) of a rounding boundary
// the two working copies round to neighbours: at most one unit in the last place apart,
// and rarely (at most 1 of 1952 elements here). A reference that rounds elsewhere is
// caught: one that does not round the gradients, or computes them from the unrounded
// master weights, ends more than one unit away on some element.
TEST(CApiPrecision, TrainingMatchesAReferenceThatRoundsWhereStrataDoes) {
  struct Case {
    strata_dtype t;
    int stage;
    std::string offload;
    int accum;
  };
  for (const Case& c : {Case{STRATA_BF16, 3, "nvme", 1}, Case{STRATA_BF16, 3, "cpu", 2}, Case{STRATA_BF16, 2, "nvme", 2},
                        Case{STRATA_BF16, 1, "none", 1}, Case{STRATA_F16, 3, "nvme", 1}, Case{STRATA_F16, 3, "none", 2},
                        Case{STRATA_F16, 2, "cpu", 1}}) {
    SCOPED_TRACE(std::string(name16(c.t)) + ", stage " + std::to_string(c.stage) + ", offload " + c.offload +
                 ", accum " + std::to_string(c.accum));
    TempDir dir("train16");
    RuntimeHandle h(config16(c.t, {.stage = c.stage, .accum = c.accum, .offload = c.offload,
                                   .nvme_dir = dir.path.string()}));
    strata_runtime_info info{};
    info.struct_size = sizeof info;
    ASSERT_STRATA_OK(strata_runtime_get_info(h.rt, &info));
    EXPECT_EQ(info.dtype, c.t);
    auto gs = toy_groups(4);
    register_toy16(h.rt, gs, c.t);
    Reference16 ref(c.t, gs, 0.01, 0.01);
    // fp16: DeepSpeed's first dynamic scale, 2^16; it doubles only after 1000 clean steps.
    const double scale = c.t == STRATA_F16 ? 65536.0 : 1.0;
    std::vector<double> losses;
    for (int s = 0; s < 8; ++s) {
      ASSERT_EQ(loss_scale_of(h.rt), scale);
      double loss = 0;
      for (int m = 0; m < c.accum; ++m) loss += micro_step16(h.rt, gs, c.t, s, m, scale);
      losses.push_back(loss);
      int32_t stepped = 0;
      ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
      ASSERT_EQ(stepped, 1) << "step " << s;
      ref.step(s, c.accum, scale);
    }
    EXPECT_LT(losses.back(), 0.8 * losses.front()) << "the toy model did not train";
    size_t total = 0, off_by_one = 0;
    for (size_t g = 0; g < gs.size(); ++g) {
      std::vector<float> got(gs[g].numel());
      std::vector<uint16_t> bits(gs[g].numel());
      ASSERT_STRATA_OK(strata_read_params(h.rt, static_cast<int32_t>(g), got.data(), STRATA_F32, got.size()));
      ASSERT_STRATA_OK(strata_read_params(h.rt, static_cast<int32_t>(g), bits.data(), c.t, bits.size()));
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(value16(c.t, bits[i]), got[i]) << "F32 reads are not the working values widened";
        const uint16_t want = bits16(c.t, ref.working(g, i));
        ++total;
        if (bits[i] == want) continue;
        ++off_by_one;
        ASSERT_EQ(std::abs(ordered16(bits[i]) - ordered16(want)), 1)
            << "group " << g << " element " << i << ": got " << got[i] << ", the reference " << ref.working(g, i);
      }
    }
    EXPECT_LE(off_by_one, total / 100) << off_by_one << " of " << total << " elements are one unit from the reference";
    const strata_stats st = stats_of(h.rt);
    EXPECT_EQ(st.optimizer_steps, 8);
    EXPECT_EQ(st.skipped_steps, 0u);
    EXPECT_EQ(st.loss_scale, scale);
  }
}

TEST(CApiPrecision, BuffersAreTheRuntimesDtypeWithoutCopies) {
  for (strata_dtype t : {STRATA_BF16, STRATA_F16}) {
    SCOPED_TRACE(name16(t));
    RuntimeHandle h(config16(t));
    std::vector<int64_t> shape{5, 7};
    std::vector<uint16_t> data(35);
    for (size_t i = 0; i < data.size(); ++i) data[i] = bits16(t, 0.1f * static_cast<float>(i) - 1.7f);
    strata_group_desc d = desc16("w", shape, t, STRATA_INIT_DATA);
    d.data = data.data();
    strata_group_desc c = desc16("c", shape, t, STRATA_INIT_CONSTANT);
    c.init_value = 0.1f;  // not a 16-bit value: rounded
    int32_t id = -1;
    ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
    ASSERT_STRATA_OK(strata_register_group(h.rt, &c, &id));
    ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
    strata_buffer a{}, again{};
    ASSERT_STRATA_OK(strata_acquire(h.rt, 0, &a));
    EXPECT_EQ(a.dtype, t);
    EXPECT_EQ(a.numel, 35u);
    EXPECT_EQ(std::memcmp(a.data, data.data(), data.size() * sizeof(uint16_t)), 0) << "the data came back changed";
    ASSERT_STRATA_OK(strata_acquire(h.rt, 0, &again));
    EXPECT_EQ(again.data, a.data) << "a second acquire while held is the same memory";
    ASSERT_STRATA_OK(strata_release(h.rt, 0));
    ASSERT_STRATA_OK(strata_release(h.rt, 0));
    ASSERT_STRATA_OK(strata_acquire(h.rt, 1, &a));
    for (int i = 0; i < 35; ++i) ASSERT_EQ(static_cast<const uint16_t*>(a.data)[i], bits16(t, 0.1f));
    ASSERT_STRATA_OK(strata_release(h.rt, 1));
    strata_buffer gb{};
    ASSERT_STRATA_OK(strata_grad_buffer(h.rt, 0, &gb));
    EXPECT_EQ(gb.dtype, t);
    EXPECT_EQ(gb.numel, 35u);
    std::memset(gb.data, 0, 35 * sizeof(uint16_t));
    ASSERT_STRATA_OK(strata_grad_ready(h.rt, 0));
    std::vector<uint16_t> zeros(35, 0);
    ASSERT_STRATA_OK(strata_grad_submit(h.rt, 1, zeros.data(), t, zeros.size()));
    ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
    // Zero gradients: only weight decay moves the weights, by a relative lr * wd = 1e-4,
    // less than half a unit in the last place of either type (at least 2^-9 relative in
    // bf16, 2^-12 in fp16), so the working copies round back to the data.
    std::vector<uint16_t> back(35);
    std::vector<float> wide(35);
    ASSERT_STRATA_OK(strata_read_params(h.rt, 0, back.data(), t, back.size()));
    ASSERT_STRATA_OK(strata_read_params(h.rt, 0, wide.data(), STRATA_F32, wide.size()));
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(back[i], data[i]) << i;
      ASSERT_EQ(wide[i], value16(t, data[i])) << i;
    }
  }
}

TEST(CApiPrecision, DtypeMismatchesAreErrorsNotConversions) {
  std::vector<int64_t> shape{64};
  int32_t id = -1;
  {
    // Groups take the runtime's dtype, whichever way they differ.
    RuntimeHandle bf(config16(STRATA_BF16));
    strata_group_desc d = desc16("w", shape, STRATA_F32, STRATA_INIT_ZEROS);
    EXPECT_STRATA_FAILS(strata_register_group(bf.rt, &d, &id), STRATA_ERR_DTYPE,
                        "dtype F32 does not match the runtime's BF16 (the configuration's bf16.enabled)");
    EXPECT_STRATA_FAILS(strata_register_group(bf.rt, &d, &id), STRATA_ERR_DTYPE, "register it as STRATA_BF16");
    d.dtype = STRATA_F16;
    EXPECT_STRATA_FAILS(strata_register_group(bf.rt, &d, &id), STRATA_ERR_DTYPE, "dtype F16 does not match");
    RuntimeHandle fp(config16(STRATA_F16));
    d.dtype = STRATA_BF16;
    EXPECT_STRATA_FAILS(strata_register_group(fp.rt, &d, &id), STRATA_ERR_DTYPE,
                        "does not match the runtime's F16 (the configuration's fp16.enabled)");
    RuntimeHandle f32(config_json({}));
    EXPECT_STRATA_FAILS(strata_register_group(f32.rt, &d, &id), STRATA_ERR_DTYPE,
                        "the runtime's F32 (the configuration enables neither bf16 nor fp16)");
    d.dtype = static_cast<strata_dtype>(42);
    EXPECT_STRATA_FAILS(strata_register_group(bf.rt, &d, &id), STRATA_ERR_INVALID_ARGUMENT, "not a strata_dtype");
    strata_runtime_info info{};
    info.struct_size = sizeof info;
    ASSERT_STRATA_OK(strata_runtime_get_info(bf.rt, &info));
    EXPECT_EQ(info.num_groups, 0) << "a refused group was added";
  }
  RuntimeHandle h(config16(STRATA_BF16));
  strata_group_desc d = desc16("w", shape, STRATA_BF16, STRATA_INIT_ONES);
  ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  // An fp32 gradient into a bf16 group: refused, and nothing was handed in.
  std::vector<float> g32(64, 0.5f);
  EXPECT_STRATA_FAILS(strata_grad_submit(h.rt, 0, g32.data(), STRATA_F32, g32.size()), STRATA_ERR_DTYPE,
                      "strata_grad_submit: group 'w' is BF16 (the configuration's bf16.enabled) but the buffer is F32");
  EXPECT_STRATA_FAILS(strata_grad_submit(h.rt, 0, g32.data(), STRATA_F32, g32.size()), STRATA_ERR_DTYPE,
                      "Strata does not convert gradients");
  std::vector<uint16_t> g16(64, bf16_bits(0.5f));
  EXPECT_STRATA_FAILS(strata_grad_submit(h.rt, 0, g16.data(), STRATA_F16, g16.size()), STRATA_ERR_DTYPE,
                      "but the buffer is F16");
  EXPECT_STRATA_FAILS(strata_grad_submit(h.rt, 0, g16.data(), static_cast<strata_dtype>(-3), g16.size()),
                      STRATA_ERR_INVALID_ARGUMENT, "dtype -3 is not a strata_dtype");
  EXPECT_STRATA_FAILS(strata_grad_submit(h.rt, 0, g16.data(), STRATA_BF16, 63), STRATA_ERR_INVALID_ARGUMENT,
                      "the buffer 63");
  int32_t stepped = -1;
  EXPECT_STRATA_FAILS(strata_step(h.rt, &stepped), STRATA_ERR_STATE, "'w' has no gradient for micro-batch 0");
  ASSERT_STRATA_OK(strata_grad_submit(h.rt, 0, g16.data(), STRATA_BF16, g16.size()));
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 1);
  // Reads take the group's dtype or F32, nothing else.
  std::vector<uint16_t> out(64);
  EXPECT_STRATA_FAILS(strata_read_params(h.rt, 0, out.data(), STRATA_F16, out.size()), STRATA_ERR_DTYPE,
                      "pass BF16 or F32 (widened)");
  EXPECT_STRATA_FAILS(strata_read_params(h.rt, 0, out.data(), static_cast<strata_dtype>(7), out.size()),
                      STRATA_ERR_INVALID_ARGUMENT, "not a strata_dtype");
  ASSERT_STRATA_OK(strata_read_params(h.rt, 0, out.data(), STRATA_BF16, out.size()));
  // AdamW's first step: weight decay, then a move of lr against the gradient's sign.
  EXPECT_EQ(out[0], bf16_bits(1.0f * (1 - 0.01f * 0.01f) - 0.01f));
}

// The fp16 loss scale is the caller's to apply; an overflow skips the step on every
// state and halves the scale (hysteresis 1: at the first overflow).
TEST(CApiPrecision, Fp16OverflowSkipsTheStepAndHalvesTheLossScale) {
  RuntimeHandle h(config16(STRATA_F16, {}, "\"hysteresis\": 1"));
  EXPECT_EQ(loss_scale_of(h.rt), 65536.0) << "before the engine starts: the scale it will start with";
  EXPECT_STRATA_FAILS(strata_loss_scale(h.rt, nullptr), STRATA_ERR_INVALID_ARGUMENT, "out is null");
  auto gs = toy_groups(2);
  register_toy16(h.rt, gs, STRATA_F16);
  ASSERT_STRATA_OK(strata_start(h.rt));
  EXPECT_EQ(loss_scale_of(h.rt), 65536.0);
  std::vector<std::vector<uint16_t>> before(2);
  for (int g = 0; g < 2; ++g) {
    before[g].resize(gs[g].numel());
    ASSERT_STRATA_OK(strata_read_params(h.rt, g, before[g].data(), STRATA_F16, before[g].size()));
  }
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  for (int g = 0; g < 2; ++g) {
    std::vector<uint16_t> grad(gs[g].numel(), fp16_bits(0.25f * 65536.0f));
    if (g == 1) grad[3] = fp16_bits(INFINITY);  // what a scaled gradient past 65504 becomes
    ASSERT_STRATA_OK(strata_grad_submit(h.rt, g, grad.data(), STRATA_F16, grad.size()));
  }
  int32_t stepped = -1;
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 0);
  EXPECT_EQ(loss_scale_of(h.rt), 32768.0);
  strata_stats st = stats_of(h.rt);
  EXPECT_EQ(st.skipped_steps, 1u);
  EXPECT_EQ(st.loss_scale, 32768.0);
  EXPECT_EQ(st.optimizer_steps, 0);
  for (int g = 0; g < 2; ++g) {
    std::vector<uint16_t> now(gs[g].numel());
    ASSERT_STRATA_OK(strata_read_params(h.rt, g, now.data(), STRATA_F16, now.size()));
    EXPECT_EQ(now, before[g]) << "the skipped step changed group " << g;
  }
  // The next step, at the new scale, is taken.
  micro_step16(h.rt, gs, STRATA_F16, 0, 0, loss_scale_of(h.rt));
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 1);
  st = stats_of(h.rt);
  EXPECT_EQ(st.skipped_steps, 1u);
  EXPECT_EQ(st.optimizer_steps, 1);
  EXPECT_GT(st.last_grad_norm, 0.0);
  EXPECT_LT(st.last_grad_norm, 100.0) << "the norm is of the unscaled gradient";
}

TEST(CApiPrecision, TheLossScaleIsOneOutsideFp16AndFixedWhenStatic) {
  RuntimeHandle f32(config_json({})), bf(config16(STRATA_BF16)),
      fixed(config16(STRATA_F16, {}, "\"loss_scale\": 128")), power(config16(STRATA_F16, {}, "\"initial_scale_power\": 5"));
  EXPECT_EQ(loss_scale_of(f32.rt), 1.0);
  EXPECT_EQ(loss_scale_of(bf.rt), 1.0);
  EXPECT_EQ(loss_scale_of(fixed.rt), 128.0);
  EXPECT_EQ(loss_scale_of(power.rt), 32.0);
  EXPECT_STRATA_FAILS(strata_loss_scale(strata_runtime{0}, nullptr), STRATA_ERR_INVALID_HANDLE, "handle is 0");
  // A static scale never changes, an overflow still skips.
  auto gs = toy_groups(1);
  register_toy16(fixed.rt, gs, STRATA_F16);
  ASSERT_STRATA_OK(strata_begin_micro_step(fixed.rt));
  std::vector<uint16_t> grad(gs[0].numel(), fp16_bits(-INFINITY));
  ASSERT_STRATA_OK(strata_grad_submit(fixed.rt, 0, grad.data(), STRATA_F16, grad.size()));
  int32_t stepped = -1;
  ASSERT_STRATA_OK(strata_step(fixed.rt, &stepped));
  EXPECT_EQ(stepped, 0);
  EXPECT_EQ(loss_scale_of(fixed.rt), 128.0);
  EXPECT_EQ(stats_of(fixed.rt).skipped_steps, 1u);
}

// A 16-bit run saved and resumed continues as if uninterrupted; in fp16 the loss
// scaler's state comes back with it.
TEST(CApiPrecision, CheckpointsResumeA16BitRunExactly) {
  for (strata_dtype t : {STRATA_BF16, STRATA_F16}) {
    SCOPED_TRACE(name16(t));
    TempDir nvme("ckpt16-nvme"), root("ckpt16-root");
    const std::string json = config16(t, {.offload = "nvme", .nvme_dir = nvme.path.string()}, "\"hysteresis\": 1");
    auto gs = toy_groups(3);
    // Step 1 overflows in fp16 (and in bf16 is skipped the same way: inf is not finite).
    auto run = [&](strata_runtime rt, int from, int to) {
      for (int s = from; s < to; ++s) {
        if (s == 1) {
          ASSERT_STRATA_OK(strata_begin_micro_step(rt));
          for (size_t g = 0; g < gs.size(); ++g) {
            std::vector<uint16_t> grad(gs[g].numel(), bits16(t, INFINITY));
            ASSERT_STRATA_OK(strata_grad_submit(rt, static_cast<int32_t>(g), grad.data(), t, grad.size()));
          }
        } else {
          micro_step16(rt, gs, t, s, 0, loss_scale_of(rt));
        }
        ASSERT_STRATA_OK(strata_step(rt, nullptr));
      }
    };
    auto read = [&](strata_runtime rt) {
      std::vector<std::vector<uint16_t>> out;
      for (size_t g = 0; g < gs.size(); ++g) {
        out.emplace_back(gs[g].numel());
        EXPECT_STRATA_OK(strata_read_params(rt, static_cast<int32_t>(g), out.back().data(), t, out.back().size()));
      }
      return out;
    };
    std::vector<std::vector<uint16_t>> straight;
    double straight_scale = 0;
    {
      RuntimeHandle h(json);
      register_toy16(h.rt, gs, t);
      run(h.rt, 0, 5);
      straight = read(h.rt);
      straight_scale = loss_scale_of(h.rt);
    }
    EXPECT_EQ(straight_scale, t == STRATA_F16 ? 32768.0 : 1.0);
    char dir[4096] = {};
    {
      RuntimeHandle h(json);
      register_toy16(h.rt, gs, t);
      run(h.rt, 0, 3);
      ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, dir, sizeof dir));
    }
    RuntimeHandle h(json);
    register_toy16(h.rt, gs, t);
    ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, dir, nullptr, 0));
    EXPECT_EQ(loss_scale_of(h.rt), straight_scale);
    const strata_stats st = stats_of(h.rt);
    EXPECT_EQ(st.optimizer_steps, 2);  // three steps, one skipped
    run(h.rt, 3, 5);
    EXPECT_EQ(read(h.rt), straight) << "resuming from the checkpoint changed the run";
  }
}

// Callers built against API 1.0 pass the shorter structs; the 1.1 fields are not written.
TEST(CApiPrecision, OlderCallersStructsAreWrittenOnlyAsFarAsTheyReach) {
  RuntimeHandle h(config16(STRATA_BF16));
  auto gs = toy_groups(1);
  register_toy16(h.rt, gs, STRATA_BF16);
  micro_step16(h.rt, gs, STRATA_BF16, 0, 0, 1.0);
  ASSERT_STRATA_OK(strata_step(h.rt, nullptr));
  struct {
    strata_runtime_info i;
    uint64_t sentinel;
  } info{};
  info.i.struct_size = offsetof(strata_runtime_info, dtype);
  info.i.dtype = static_cast<strata_dtype>(-1);
  info.sentinel = 0xabcdef;
  ASSERT_STRATA_OK(strata_runtime_get_info(h.rt, &info.i));
  EXPECT_EQ(info.i.zero_stage, 3);
  EXPECT_EQ(info.i.dtype, static_cast<strata_dtype>(-1));
  EXPECT_EQ(info.sentinel, 0xabcdefu);
  struct {
    strata_stats s;
    uint64_t sentinel;
  } stats{};
  stats.s.struct_size = offsetof(strata_stats, skipped_steps);
  stats.s.loss_scale = -1;
  stats.sentinel = 0xabcdef;
  ASSERT_STRATA_OK(strata_get_stats(h.rt, &stats.s));
  EXPECT_EQ(stats.s.optimizer_steps, 1);
  EXPECT_EQ(stats.s.loss_scale, -1.0);
  EXPECT_EQ(stats.sentinel, 0xabcdefu);
  EXPECT_EQ(stats_of(h.rt).loss_scale, 1.0);
}

// An overflow at fp16.min_loss_scale cannot be scaled away: an error naming the fixes.
// The step is over (skipped), so the caller may go back to a checkpoint.
TEST(CApiPrecision, AnOverflowAtTheMinimumScaleIsAnErrorThatEndsTheStep) {
  TempDir root("min-scale");
  RuntimeHandle h(config16(STRATA_F16, {}, "\"hysteresis\": 1, \"initial_scale_power\": 2, \"min_loss_scale\": 4"));
  auto gs = toy_groups(1);
  register_toy16(h.rt, gs, STRATA_F16);
  char dir[4096] = {};
  ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, dir, sizeof dir));
  ASSERT_STRATA_OK(strata_begin_micro_step(h.rt));
  std::vector<uint16_t> grad(gs[0].numel(), fp16_bits(NAN));
  ASSERT_STRATA_OK(strata_grad_submit(h.rt, 0, grad.data(), STRATA_F16, grad.size()));
  EXPECT_STRATA_FAILS(strata_step(h.rt, nullptr), STRATA_ERR_STATE, "minimum loss scale");
  EXPECT_STRATA_FAILS(strata_step(h.rt, nullptr), STRATA_ERR_STATE, "without a micro-batch");
  ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, dir, nullptr, 0));
  EXPECT_EQ(loss_scale_of(h.rt), 4.0);
  micro_step16(h.rt, gs, STRATA_F16, 0, 0, 4.0);
  int32_t stepped = -1;
  ASSERT_STRATA_OK(strata_step(h.rt, &stepped));
  EXPECT_EQ(stepped, 1);
}

namespace {

// config16(t) with "strata": {"out_of_range": "clamp"}.
std::string clamping(const std::string& json) {
  const std::string key = "\"checksums\": true";
  std::string j = json;
  j.replace(j.find(key), key.size(), key + ", \"out_of_range\": \"clamp\"");
  return j;
}

// Group "w" [4, 8]: its values after start, as fp32.
std::vector<float> started_values(strata_runtime rt) {
  EXPECT_STRATA_OK(strata_start(rt));
  std::vector<float> v(32, NAN);
  EXPECT_STRATA_OK(strata_read_params(rt, 0, v.data(), STRATA_F32, v.size()));
  return v;
}

}  // namespace

// A 16-bit runtime rounds its initial values to its dtype: a constant, or an init_std whose
// largest draw, beyond the range would give inf. Refused at registration naming the group
// and the limit; clamped under strata.out_of_range = "clamp".
TEST(CApiPrecision, InitialValuesBeyondTheRangeAreRefusedOrClampedOnRequest) {
  struct Case {
    strata_dtype t;
    strata_init_kind init;
    float value;  // init_value or init_std
    const char* limit;
  };
  const std::vector<int64_t> shape = {4, 8};
  for (const Case& c : {Case{STRATA_F16, STRATA_INIT_CONSTANT, 7e4f, "65504"},
                        Case{STRATA_F16, STRATA_INIT_CONSTANT, -1e6f, "65504"},
                        Case{STRATA_F16, STRATA_INIT_CONSTANT, 65520.0f, "65504"},
                        Case{STRATA_BF16, STRATA_INIT_CONSTANT, 3.4e38f, "3.38953e+38"},
                        Case{STRATA_F16, STRATA_INIT_NORMAL, 1e6f, "65504"},
                        Case{STRATA_BF16, STRATA_INIT_NORMAL, 1e38f, "3.38953e+38"}}) {
    SCOPED_TRACE(std::string(name16(c.t)) + (c.init == STRATA_INIT_NORMAL ? " init_std " : " init_value ") +
                 std::to_string(c.value));
    strata_group_desc d = group_desc("w", shape, c.t, c.init, c.value);
    d.init_value = c.value;
    {
      RuntimeHandle h(config16(c.t));
      int32_t id = -1;
      EXPECT_STRATA_FAILS(strata_register_group(h.rt, &d, &id), STRATA_ERR_INVALID_ARGUMENT, c.limit);
      EXPECT_NE(std::string(strata_last_error()).find("group 'w'"), std::string::npos) << strata_last_error();
    }
    RuntimeHandle h(clamping(config16(c.t)));
    int32_t id = -1;
    ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
    const float max = c.t == STRATA_F16 ? 65504.0f : bf16_value(0x7f7f);
    float largest = 0;
    for (float v : started_values(h.rt)) {
      EXPECT_TRUE(std::isfinite(v)) << v;
      largest = std::max(largest, std::fabs(v));
    }
    if (c.init == STRATA_INIT_CONSTANT)
      EXPECT_EQ(largest, max);
    else
      EXPECT_LE(largest, max);
  }
  // Within the range (and in fp32 any finite value) registers as before.
  RuntimeHandle h(config16(STRATA_F16));
  strata_group_desc d = group_desc("w", shape, STRATA_F16, STRATA_INIT_CONSTANT, 0.0f);
  d.init_value = 65504.0f;
  int32_t id = -1;
  EXPECT_STRATA_OK(strata_register_group(h.rt, &d, &id));
}

// NaN and inf initial data are refused in every precision, naming the group and index.
TEST(CApiPrecision, NonFiniteInitialDataIsRefused) {
  const std::vector<int64_t> shape = {4, 8};
  for (const size_t at : {size_t{0}, size_t{17}, size_t{31}}) {
    std::vector<float> data(32, 0.5f);
    data[at] = at == 17 ? INFINITY : NAN;
    RuntimeHandle h(config_json({}));
    strata_group_desc d = group_desc("w", shape, STRATA_F32, STRATA_INIT_DATA, 0.0f);
    d.data = data.data();
    int32_t id = -1;
    EXPECT_STRATA_FAILS(strata_register_group(h.rt, &d, &id), STRATA_ERR_INVALID_ARGUMENT,
                        "at flat index " + std::to_string(at));
  }
}

// A checkpoint of an fp32 runtime whose weights fp16 cannot hold, loaded into an fp16
// runtime: refused naming the group, or clamped under strata.out_of_range = "clamp".
TEST(CApiPrecision, LoadingWeightsBeyondFp16IsRefusedOrClampedOnRequest) {
  const std::vector<int64_t> shape = {4, 8};
  for (const float big : {1e6f, -7e4f, 3e38f}) {
    SCOPED_TRACE(big);
    TempDir root("load-range");
    char dir[4096] = {0};
    {
      RuntimeHandle h(config_json({}));
      strata_group_desc d = group_desc("w", shape, STRATA_F32, STRATA_INIT_CONSTANT, 0.0f);
      d.init_value = big;
      int32_t id = -1;
      ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
      ASSERT_STRATA_OK(strata_start(h.rt));
      ASSERT_STRATA_OK(strata_save_checkpoint(h.rt, root.path.c_str(), nullptr, dir, sizeof dir));
    }
    for (const bool clamp : {false, true}) {
      RuntimeHandle h(clamp ? clamping(config16(STRATA_F16)) : config16(STRATA_F16));
      strata_group_desc d = group_desc("w", shape, STRATA_F16, STRATA_INIT_ZEROS, 0.0f);
      int32_t id = -1;
      ASSERT_STRATA_OK(strata_register_group(h.rt, &d, &id));
      if (!clamp) {
        EXPECT_STRATA_FAILS(strata_load_checkpoint(h.rt, dir, nullptr, 0), STRATA_ERR_CONFIG, "group 'w'");
        EXPECT_NE(std::string(strata_last_error()).find("fp16's largest finite value 65504"), std::string::npos)
            << strata_last_error();
        continue;
      }
      ASSERT_STRATA_OK(strata_load_checkpoint(h.rt, dir, nullptr, 0));
      std::vector<float> v(32, NAN);
      ASSERT_STRATA_OK(strata_read_params(h.rt, 0, v.data(), STRATA_F32, v.size()));
      for (float x : v) EXPECT_EQ(x, std::copysign(65504.0f, big));
    }
  }
}
