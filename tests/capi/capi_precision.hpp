// The 16-bit side of the C API tests (capi_harness.hpp's toy model in bf16 and fp16):
// reference conversions, configurations, and a reference that rounds where Strata does.
//
// The conversions here are arithmetic (scale to the format's unit in the last place,
// round half to even with nearbyint), not the bit tricks Strata uses, so they check
// Strata's rounding rather than repeat it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi_harness.hpp"

namespace capi_test {

// float -> bf16 bits, round to nearest even: 8 significant bits over fp32's exponent range.
inline uint16_t bf16_bits(float f) {
  int e = 0;
  std::frexp(static_cast<double>(f), &e);
  const int exp = std::max(e - 1, -126);
  const float r = static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(f), 7 - exp)), exp - 7));
  uint32_t u;
  std::memcpy(&u, &r, sizeof u);
  return static_cast<uint16_t>(u >> 16);  // r's low 16 bits are zero
}

inline float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> IEEE binary16 bits, round to nearest even, subnormals and overflow included.
inline uint16_t fp16_bits(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | 0x7c00;
  int e = 0;
  std::frexp(a, &e);
  const int exp = std::max(e - 1, -14);                  // subnormals share the exponent -14
  double q = std::nearbyint(std::ldexp(a, 10 - exp));    // in units of 2^(exp - 10)
  int biased = exp + 15;
  if (q >= 2048) {  // rounding carried into the next power of two
    q /= 2;
    ++biased;
  }
  if (biased >= 31) return sign | 0x7c00;                 // past 65504: infinity
  if (q < 1024) return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));  // subnormal
  return static_cast<uint16_t>(sign | (biased << 10) | static_cast<int>(q - 1024));
}

inline float fp16_value(uint16_t h) {
  const int biased = (h >> 10) & 31, m = h & 1023;
  const double v = biased == 0    ? std::ldexp(m, -24)
                   : biased == 31 ? (m ? NAN : INFINITY)
                                  : std::ldexp(1024 + m, biased - 25);
  return static_cast<float>((h & 0x8000) ? -v : v);
}

inline uint16_t bits16(strata_dtype t, float f) { return t == STRATA_BF16 ? bf16_bits(f) : fp16_bits(f); }
inline float value16(strata_dtype t, uint16_t h) { return t == STRATA_BF16 ? bf16_value(h) : fp16_value(h); }
inline float round16(strata_dtype t, float f) { return value16(t, bits16(t, f)); }
inline const char* name16(strata_dtype t) { return t == STRATA_BF16 ? "bf16" : "fp16"; }
// Sign and magnitude as one ordered integer: neighbouring 16-bit values differ by 1,
// across zero too.
inline int ordered16(uint16_t h) { return (h & 0x8000) ? -(h & 0x7fff) : h; }

// "bf16": {"enabled": true}, or "fp16": {"enabled": true, <fp16 keys>}.
inline std::string precision_section(strata_dtype t, const std::string& fp16_keys = "") {
  if (t == STRATA_BF16) return "\"bf16\": {\"enabled\": true}";
  return "\"fp16\": {\"enabled\": true" + (fp16_keys.empty() ? "" : ", " + fp16_keys) + "}";
}

// config_json(c) in precision t.
inline std::string config16(strata_dtype t, ConfigSpec c = {}, const std::string& fp16_keys = "") {
  c.extra = precision_section(t, fp16_keys);
  return config_json(c);
}

inline strata_group_desc desc16(const char* name, const std::vector<int64_t>& shape, strata_dtype t,
                                 strata_init_kind init) {
  return group_desc(name, shape, t, init, 0.0f);
}

// The toy groups of capi_harness.hpp with their initial values rounded to t.
inline void register_toy16(strata_runtime rt, const std::vector<ToyGroup>& gs, strata_dtype t) {
  for (size_t g = 0; g < gs.size(); ++g) {
    std::vector<uint16_t> data(gs[g].numel());
    for (uint64_t i = 0; i < data.size(); ++i) data[i] = bits16(t, initial_value(static_cast<int>(g), i));
    strata_group_desc d = desc16(gs[g].name.c_str(), gs[g].shape, t, STRATA_INIT_DATA);
    d.data = data.data();
    int32_t id = -1;
    EXPECT_STRATA_OK(strata_register_group(rt, &d, &id));
    EXPECT_EQ(id, static_cast<int32_t>(g));
  }
}

// toy_micro_step in 16 bits: the gradient (w - t) * s * loss_scale is computed in fp32
// from the acquired 16-bit parameters and rounded to t by the caller, as a 16-bit model's
// backward would produce it; odd groups hand it in through strata_grad_buffer, even ones
// through strata_grad_submit. Returns the micro-batch's loss (unscaled).
inline double micro_step16(strata_runtime rt, const std::vector<ToyGroup>& gs, strata_dtype t, int step, int micro,
                           double loss_scale, int rank = 0) {
  EXPECT_STRATA_OK(strata_begin_micro_step(rt));
  const std::vector<int> order = forward_backward(static_cast<int>(gs.size()));
  std::vector<int> last(gs.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) last[order[k]] = static_cast<int>(k);
  const float s = grad_scale(micro, rank), scale = static_cast<float>(loss_scale);
  double loss = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int g = order[k];
    strata_buffer b{};
    EXPECT_STRATA_OK(strata_acquire(rt, g, &b));
    if (b.data == nullptr) return NAN;
    EXPECT_EQ(b.dtype, t);
    if (static_cast<int>(k) != last[g]) {
      EXPECT_STRATA_OK(strata_release(rt, g));
      continue;
    }
    const uint16_t* w = static_cast<const uint16_t*>(b.data);
    std::vector<uint16_t> grad(b.numel);
    for (uint64_t i = 0; i < b.numel; ++i) {
      const float d = value16(t, w[i]) - target_value(g, i, step);
      grad[i] = bits16(t, d * s * scale);
      loss += 0.5 * d * d * s;
    }
    EXPECT_STRATA_OK(strata_release(rt, g));
    if (g % 2) {
      strata_buffer gb{};
      EXPECT_STRATA_OK(strata_grad_buffer(rt, g, &gb));
      EXPECT_EQ(gb.dtype, t);
      if (gb.data == nullptr) return NAN;
      std::memcpy(gb.data, grad.data(), grad.size() * sizeof(uint16_t));
      EXPECT_STRATA_OK(strata_grad_ready(rt, g));
    } else {
      EXPECT_STRATA_OK(strata_grad_submit(rt, g, grad.data(), t, grad.size()));
    }
  }
  return loss;
}

// ReferenceAdamW (fp32 master weights, here in double) for a 16-bit run: the model reads
// the master weights rounded to t, hands in gradients rounded to t (of the loss times the
// scale), the ranks' gradients are summed in t (the reduce-scatter's type: one rounded
// addition on two ranks; with more the reduction's order would matter), and the
// optimizer averages the micro-batches and ranks and divides the scale out.
struct Reference16 {
  strata_dtype t;
  double lr, wd, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<std::vector<double>> w, m, v;
  int64_t steps = 0;
  Reference16(strata_dtype t_, const std::vector<ToyGroup>& gs, double lr_, double wd_) : t(t_), lr(lr_), wd(wd_) {
    for (size_t g = 0; g < gs.size(); ++g) {
      w.emplace_back(gs[g].numel());
      for (uint64_t i = 0; i < w.back().size(); ++i) w.back()[i] = round16(t, initial_value(static_cast<int>(g), i));
      m.emplace_back(gs[g].numel(), 0.0);
      v.emplace_back(gs[g].numel(), 0.0);
    }
  }
  float working(size_t g, size_t i) const { return round16(t, static_cast<float>(w[g][i])); }
  void step(int step_index, int accum, double loss_scale, int world = 1) {
    ++steps;
    for (size_t g = 0; g < w.size(); ++g)
      for (size_t i = 0; i < w[g].size(); ++i) {
        const float d = working(g, i) - target_value(static_cast<int>(g), i, step_index);
        double grad = 0;
        for (int mi = 0; mi < accum; ++mi) {
          float reduced = 0;
          for (int r = 0; r < world; ++r) {
            const float mine = round16(t, d * grad_scale(mi, r) * static_cast<float>(loss_scale));
            reduced = r == 0 ? mine : round16(t, reduced + mine);
          }
          grad += reduced / loss_scale;
        }
        grad /= accum * world;
        w[g][i] *= 1 - lr * wd;
        m[g][i] = b1 * m[g][i] + (1 - b1) * grad;
        v[g][i] = b2 * v[g][i] + (1 - b2) * grad * grad;
        const double mh = m[g][i] / (1 - std::pow(b1, steps)), vh = v[g][i] / (1 - std::pow(b2, steps));
        w[g][i] -= lr * mh / (std::sqrt(vh) + eps);
      }
  }
};

}  // namespace capi_test
