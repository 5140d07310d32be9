// CpuAdam against PyTorch: every kernel (scalar, AVX2, AVX-512) must reproduce
// torch.optim.Adam and torch.optim.AdamW (foreach=False) over several steps with weight
// decay, on sizes that are not multiples of the vector widths, with fp32, bf16 and fp16
// gradients scaled as they are read (torch is given the same widened, scaled gradient),
// and give the scalar kernel's bits for every 16-bit gradient value. The reference file is
// written by adam_reference.py (a CTest fixture that runs first); its path comes from
// $STRATA_ADAM_REFERENCE. A missing file is a failure, never a skip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <ostream>
#include <string>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/offload/cpu_adam.hpp"

namespace strata {

// Test names and messages show the kernel by name.
void PrintTo(CpuIsa isa, std::ostream* os) { *os << to_string(isa); }

namespace {

// Tolerance against torch: 1e-6 relative, each value against the magnitude of the terms
// that make it (magnitudes() below), since a moment that sums gradients of both signs can
// be near zero while its rounding error is not. Why 1e-6: the kernels use the fused
// multiply-adds that torch's AVX2/AVX-512 kernels use, and against those the results are
// bit-identical (the test prints every tensor that is not). Torch's baseline kernel
// (ATEN_CPU_CAPABILITY=default, or a CPU without AVX2) rounds those multiply-adds twice;
// against it the worst seen was 3e-7 for the moments and 8e-7 for the weights, at an
// element where g + wd*p nearly cancels and Adam, which normalises the gradient, turns
// that rounding into a full-size step. 1e-6 admits this and nothing coarser: putting eps
// on the wrong side of the bias correction fails by more than 10x.
constexpr double kRelTol = 1e-6;

constexpr uint32_t kMagic = 0x4D414453;  // "SDAM"
constexpr uint32_t kVersion = 2;

struct Case {
  AdamConfig config;
  uint32_t steps = 0;
  size_t n = 0;
  DType grad_type = DType::F32;        // F32, BF16 or F16
  float grad_scale = 1.0f;
  std::vector<float> params0;          // [n]
  std::vector<float> grads32;          // [steps, n] when grad_type is F32, else empty
  std::vector<uint16_t> grads16;       // [steps, n] bf16 or fp16 bits, else empty
  std::vector<float> params;           // [n] torch, after `steps` steps
  std::vector<float> exp_avg;          // [n]
  std::vector<float> exp_avg_sq;       // [n]
  std::vector<uint16_t> params_bf16;   // [n] torch's p.to(bfloat16)
  std::vector<uint16_t> params_fp16;   // [n] torch's p.to(float16)
  std::string name() const {
    return std::string(config.variant == AdamVariant::AdamW ? "AdamW" : "Adam") + " n=" + std::to_string(n) +
           " steps=" + std::to_string(steps) + " wd=" + std::to_string(config.weight_decay) + " grads " +
           to_string(grad_type) + " x" + std::to_string(grad_scale);
  }
  // The gradients of step t (from 1) as CpuAdam is given them.
  AdamGrads grads(uint32_t t) const {
    const size_t at = size_t{t - 1} * n;
    return {grad_type == DType::F32 ? static_cast<const void*>(grads32.data() + at) : grads16.data() + at,
            grad_type, grad_scale};
  }
  // The fp32 gradient element i of step t after widening and scaling, as torch was given it.
  float grad(uint32_t t, size_t i) const {
    const size_t at = size_t{t - 1} * n + i;
    const float g = grad_type == DType::F32    ? grads32[at]
                    : grad_type == DType::BF16 ? math::bf16_to_float(grads16[at])
                                               : math::fp16_to_float(grads16[at]);
    return g * grad_scale;
  }
  bool plain_f32() const { return grad_type == DType::F32 && grad_scale == 1.0f; }
};

struct Reference {
  std::vector<Case> cases;
  std::vector<float> special;             // [count] values exercising the conversions
  std::vector<uint16_t> special_bf16;     // [count] torch's bits
  std::vector<uint16_t> special_fp16;     // [count]
};

class Reader {
 public:
  explicit Reader(const std::string& path) : in_(path, std::ios::binary), path_(path) {}
  bool is_open() const { return in_.is_open(); }
  template <typename T>
  T get() {
    T x;
    read(&x, sizeof x);
    return x;
  }
  template <typename T>
  std::vector<T> array(size_t count) {
    std::vector<T> v(count);
    read(v.data(), count * sizeof(T));
    return v;
  }
  bool at_end() { return in_.peek() == std::char_traits<char>::eof(); }

 private:
  void read(void* dst, size_t bytes) {
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
    if (static_cast<size_t>(in_.gcount()) != bytes)
      throw std::runtime_error(path_ + ": truncated (wanted " + std::to_string(bytes) + " bytes more)");
  }
  std::ifstream in_;
  std::string path_;
};

std::string reference_path() {
  const char* env = std::getenv("STRATA_ADAM_REFERENCE");
  return env ? env : "";
}

// Loads the reference once; a missing or malformed file fails every test that needs it.
const Reference& reference() {
  static const Reference ref = [] {
    const std::string path = reference_path();
    if (path.empty())
      throw std::runtime_error(
          "STRATA_ADAM_REFERENCE is not set: run through ctest, which makes the reference with "
          "tests/offload/adam_reference.py first, or set it to that script's --out file");
    Reader r(path);
    if (!r.is_open())
      throw std::runtime_error(path + ": cannot open; it is written by tests/offload/adam_reference.py "
                               "(needs /usr/bin/python3 with PyTorch)");
    Reference out;
    if (r.get<uint32_t>() != kMagic) throw std::runtime_error(path + ": bad magic number");
    if (uint32_t v = r.get<uint32_t>(); v != kVersion)
      throw std::runtime_error(path + ": version " + std::to_string(v) + ", expected " + std::to_string(kVersion));
    const uint32_t count = r.get<uint32_t>();
    r.get<uint32_t>();
    for (uint32_t c = 0; c < count; ++c) {
      Case k;
      const uint32_t variant = r.get<uint32_t>();
      k.config.variant = variant == 1 ? AdamVariant::AdamW : AdamVariant::Adam;
      k.steps = r.get<uint32_t>();
      k.n = r.get<uint64_t>();
      k.config.lr = r.get<double>();
      k.config.beta1 = r.get<double>();
      k.config.beta2 = r.get<double>();
      k.config.eps = r.get<double>();
      k.config.weight_decay = r.get<double>();
      const uint32_t grad_type = r.get<uint32_t>();
      if (grad_type > 2) throw std::runtime_error(path + ": unknown gradient type " + std::to_string(grad_type));
      k.grad_type = grad_type == 0 ? DType::F32 : grad_type == 1 ? DType::BF16 : DType::F16;
      k.grad_scale = r.get<float>();
      k.params0 = r.array<float>(k.n);
      if (k.grad_type == DType::F32)
        k.grads32 = r.array<float>(size_t{k.steps} * k.n);
      else
        k.grads16 = r.array<uint16_t>(size_t{k.steps} * k.n);
      k.params = r.array<float>(k.n);
      k.exp_avg = r.array<float>(k.n);
      k.exp_avg_sq = r.array<float>(k.n);
      k.params_bf16 = r.array<uint16_t>(k.n);
      k.params_fp16 = r.array<uint16_t>(k.n);
      out.cases.push_back(std::move(k));
    }
    const uint64_t special = r.get<uint64_t>();
    out.special = r.array<float>(special);
    out.special_bf16 = r.array<uint16_t>(special);
    out.special_fp16 = r.array<uint16_t>(special);
    if (!r.at_end()) throw std::runtime_error(path + ": unexpected bytes after the last record");
    return out;
  }();
  return ref;
}

// Arrays with sentinels after the end, to catch a kernel writing past n (ggml's habit).
template <typename T>
class Guarded {
 public:
  static constexpr size_t kPad = 64;
  explicit Guarded(size_t n, T fill = T{}) : n_(n), data_(n + kPad, fill) {
    for (size_t i = n; i < n + kPad; ++i) std::memset(&data_[i], 0xA5, sizeof(T));
  }
  Guarded(const std::vector<T>& init) : Guarded(init.size()) { std::copy(init.begin(), init.end(), data_.begin()); }
  T* data() { return data_.data(); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  bool sentinels_intact() const {
    for (size_t i = n_; i < n_ + kPad; ++i) {
      T s;
      std::memset(&s, 0xA5, sizeof(T));
      if (std::memcmp(&s, &data_[i], sizeof(T)) != 0) return false;
    }
    return true;
  }

 private:
  size_t n_;
  std::vector<T> data_;
};

struct State {
  Guarded<float> params, exp_avg, exp_avg_sq;
  explicit State(const Case& k) : params(k.params0), exp_avg(k.n), exp_avg_sq(k.n) {}
};

// Which step() a test calls: Auto takes the fp32 overload for unscaled fp32 gradients
// (so that it keeps its tests) and AdamGrads for the rest; Typed always takes AdamGrads.
enum class Api { Auto, Typed };

// Runs every step of a case, starting from zero moments as torch does.
State run_case(const Case& k, CpuIsa isa, unsigned threads, void* half_out = nullptr,
               HalfKind kind = HalfKind::None, Api api = Api::Auto) {
  // A small minimum per thread, so that the reference sizes are split over the threads.
  CpuAdam adam(k.config, CpuAdamOptions{threads, isa, /*min_elements_per_thread=*/1000});
  State s(k);
  for (uint32_t t = 1; t <= k.steps; ++t) {
    if (api == Api::Auto && k.plain_f32())
      adam.step(t, s.params.data(), static_cast<const float*>(k.grads(t).data), s.exp_avg.data(),
                s.exp_avg_sq.data(), k.n, half_out, kind);
    else
      adam.step(t, s.params.data(), k.grads(t), s.exp_avg.data(), s.exp_avg_sq.data(), k.n, half_out, kind);
  }
  return s;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The magnitude each result is built from, for the tolerance: what the same steps give
// with every term taken by its absolute value.
struct Magnitudes {
  std::vector<double> params, exp_avg, exp_avg_sq;
};
Magnitudes magnitudes(const Case& k) {
  Magnitudes mag{std::vector<double>(k.n), std::vector<double>(k.n), std::vector<double>(k.n)};
  const AdamConfig& c = k.config;
  for (size_t i = 0; i < k.n; ++i) {
    double p = k.params0[i], ap = std::fabs(p), am = 0, av = 0;
    for (uint32_t t = 1; t <= k.steps; ++t) {
      const double g = k.grad(t, i);
      if (c.variant == AdamVariant::AdamW) p *= 1 - c.lr * c.weight_decay;
      const double ag = std::fabs(g) + (c.variant == AdamVariant::Adam ? std::fabs(c.weight_decay * p) : 0.0);
      am = c.beta1 * am + (1 - c.beta1) * ag;
      av = c.beta2 * av + (1 - c.beta2) * ag * ag;
      // Adam's update is m / sqrt(v) scaled by the step size, whatever the size of the
      // gradient: a gradient that nearly cancels (g + wd*p ~ 0) carries its rounding
      // error into an update of full size. So each step may move p by up to its step size.
      const double step_size = c.lr / (1 - std::pow(c.beta1, t));
      p = std::fabs(p) + step_size;
      ap = ap + step_size;
    }
    mag.params[i] = ap;
    mag.exp_avg[i] = am;
    mag.exp_avg_sq[i] = av;
  }
  return mag;
}

struct Comparison {
  double worst = 0;        // largest |ours - torch| / magnitude
  size_t worst_index = 0;
  size_t bit_exact = 0;    // elements equal to torch's bits
};
Comparison compare(const Guarded<float>& ours, const std::vector<float>& torch, const std::vector<double>& mag) {
  Comparison c;
  for (size_t i = 0; i < torch.size(); ++i) {
    if (bits(ours[i]) == bits(torch[i])) {
      ++c.bit_exact;
      continue;
    }
    const double scale = std::max({std::fabs(double{torch[i]}), mag[i], double{std::numeric_limits<float>::min()}});
    const double err = std::isfinite(ours[i]) ? std::fabs(double{ours[i]} - torch[i]) / scale : INFINITY;
    if (!(err <= c.worst)) {
      c.worst = err;
      c.worst_index = i;
    }
  }
  return c;
}

std::vector<CpuIsa> kernels() { return {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512}; }

class cpu_adam : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu_supports(GetParam()))
      GTEST_SKIP() << "this CPU lacks " << to_string(GetParam()) << " (best here: " << to_string(best_cpu_isa()) << ")";
  }
};

TEST_P(cpu_adam, MatchesTorch) {
  const Reference& ref = reference();
  ASSERT_FALSE(ref.cases.empty());
  // The reference must keep a scaled case of every gradient type, or this test would
  // pass without reading one.
  for (DType type : {DType::F32, DType::BF16, DType::F16}) {
    size_t scaled = 0;
    for (const Case& k : ref.cases) scaled += k.grad_type == type && k.grad_scale != 1.0f;
    EXPECT_GT(scaled, 0u) << "no case with scaled " << to_string(type) << " gradients";
  }
  for (const Case& k : ref.cases) {
    SCOPED_TRACE(k.name());
    // A no-op or a zeroing kernel must not pass: torch's results moved away from the inputs.
    size_t moved = 0;
    for (size_t i = 0; i < k.n; ++i) moved += k.params[i] != k.params0[i] && k.exp_avg_sq[i] != 0;
    ASSERT_GT(moved, k.n * 9 / 10);

    const State s = run_case(k, GetParam(), 3);
    EXPECT_TRUE(s.params.sentinels_intact() && s.exp_avg.sentinels_intact() && s.exp_avg_sq.sentinels_intact())
        << "wrote past the end";
    const Magnitudes mag = magnitudes(k);
    const struct {
      const char* name;
      const Guarded<float>& ours;
      const std::vector<float>& torch;
      const std::vector<double>& mag;
    } tensors[] = {{"params", s.params, k.params, mag.params},
                   {"exp_avg", s.exp_avg, k.exp_avg, mag.exp_avg},
                   {"exp_avg_sq", s.exp_avg_sq, k.exp_avg_sq, mag.exp_avg_sq}};
    for (const auto& t : tensors) {
      const Comparison c = compare(t.ours, t.torch, t.mag);
      EXPECT_LE(c.worst, kRelTol) << t.name << "[" << c.worst_index << "]: ours " << t.ours[c.worst_index]
                                  << ", torch " << t.torch[c.worst_index];
      RecordProperty(std::string(t.name) + "_bit_exact_" + std::to_string(k.n), std::to_string(c.bit_exact));
      if (c.bit_exact != k.n)
        std::printf("  %s %s: %zu of %zu bit-exact, worst relative error %.3g at [%zu] (ours %.9g, torch %.9g)\n",
                    k.name().c_str(), t.name, c.bit_exact, k.n, c.worst, c.worst_index, t.ours[c.worst_index],
                    t.torch[c.worst_index]);
    }
  }
}

// Every kernel, with any number of threads, gives the scalar kernel's bits.
TEST_P(cpu_adam, BitIdenticalToScalarOnAnyThreadCount) {
  for (const Case& k : reference().cases) {
    SCOPED_TRACE(k.name());
    const State want = run_case(k, CpuIsa::Scalar, 1);
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
      const State got = run_case(k, GetParam(), threads);
      size_t differ = 0;
      for (size_t i = 0; i < k.n; ++i)
        differ += bits(got.params[i]) != bits(want.params[i]) || bits(got.exp_avg[i]) != bits(want.exp_avg[i]) ||
                  bits(got.exp_avg_sq[i]) != bits(want.exp_avg_sq[i]);
      EXPECT_EQ(differ, 0u) << threads << " threads";
    }
  }
}

// Prefetching or not changes no bit: the reference cases with a bf16 copy, both ways, one
// thread (so that the blocks are long enough for the prefetching loop to run).
TEST_P(cpu_adam, PrefetchChangesNoBits) {
  for (const Case& k : reference().cases) {
    SCOPED_TRACE(k.name());
    auto run = [&](CpuPrefetch prefetch) {
      CpuAdamOptions options{1, GetParam()};
      options.prefetch = prefetch;
      CpuAdam adam(k.config, options);
      EXPECT_EQ(adam.prefetch(), prefetch);
      State s(k);
      std::vector<uint16_t> half(k.n);
      for (uint32_t t = 1; t <= k.steps; ++t)
        adam.step(t, s.params.data(), k.grads(t), s.exp_avg.data(), s.exp_avg_sq.data(), k.n, half.data(),
                  HalfKind::Bf16);
      return std::make_pair(std::move(s), std::move(half));
    };
    const auto [off, off_half] = run(CpuPrefetch::Off);
    const auto [l1, l1_half] = run(CpuPrefetch::L1);
    size_t differ = 0;
    for (size_t i = 0; i < k.n; ++i)
      differ += bits(off.params[i]) != bits(l1.params[i]) || bits(off.exp_avg[i]) != bits(l1.exp_avg[i]) ||
                bits(off.exp_avg_sq[i]) != bits(l1.exp_avg_sq[i]) || off_half[i] != l1_half[i];
    EXPECT_EQ(differ, 0u);
  }
}

// The 16-bit copy written in the same pass is the fp32 result rounded to nearest even,
// and equals torch's own conversion of its result wherever the fp32 results agree.
TEST_P(cpu_adam, HalfCopyIsRoundedResult) {
  const Reference& ref = reference();
  for (HalfKind kind : {HalfKind::Bf16, HalfKind::Fp16}) {
    for (const Case& k : ref.cases) {
      SCOPED_TRACE(k.name() + (kind == HalfKind::Bf16 ? " bf16" : " fp16"));
      Guarded<uint16_t> half(k.n, 0);
      const State s = run_case(k, GetParam(), 3, half.data(), kind);
      EXPECT_TRUE(half.sentinels_intact()) << "wrote past the end of the 16-bit copy";
      const std::vector<uint16_t>& torch_half = kind == HalfKind::Bf16 ? k.params_bf16 : k.params_fp16;
      size_t wrong = 0, wrong_vs_torch = 0, compared = 0;
      for (size_t i = 0; i < k.n; ++i) {
        const float p = s.params[i];
        wrong += half[i] != (kind == HalfKind::Bf16 ? math::float_to_bf16(p) : math::float_to_fp16(p));
        if (bits(p) == bits(k.params[i])) {
          ++compared;
          wrong_vs_torch += half[i] != torch_half[i];
        }
      }
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(wrong_vs_torch, 0u);
      EXPECT_GT(compared, k.n / 2) << "too few fp32 results equal torch's to check its rounding";
    }
  }
}

// The fp32 overload is AdamGrads{grads, F32, 1}, bit for bit.
TEST_P(cpu_adam, Fp32OverloadIsUnscaledFp32Grads) {
  size_t cases = 0;
  for (const Case& k : reference().cases) {
    if (!k.plain_f32()) continue;
    SCOPED_TRACE(k.name());
    ++cases;
    const State want = run_case(k, GetParam(), 3, nullptr, HalfKind::None, Api::Auto);
    const State got = run_case(k, GetParam(), 3, nullptr, HalfKind::None, Api::Typed);
    size_t differ = 0;
    for (size_t i = 0; i < k.n; ++i)
      differ += bits(got.params[i]) != bits(want.params[i]) || bits(got.exp_avg[i]) != bits(want.exp_avg[i]) ||
                bits(got.exp_avg_sq[i]) != bits(want.exp_avg_sq[i]);
    EXPECT_EQ(differ, 0u);
  }
  EXPECT_GT(cases, 0u);
}

// Every bf16 and fp16 bit pattern as a gradient (subnormals, infinities and NaNs
// included), under several scales, with and without a 16-bit copy: each kernel gives the
// scalar kernel's bits for the weights, both moments and the copy. The widening is the
// part of the vector kernels that the torch cases cannot reach exhaustively.
TEST_P(cpu_adam, EveryHalfGradientBitIdenticalToScalar) {
  constexpr size_t n = 65536 + 13;  // every pattern, then a tail no vector width divides
  constexpr uint32_t steps = 2;
  std::vector<uint16_t> grads(steps * n);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<uint16_t>(i * 40503u + (i / n) * 7u);
  std::vector<float> params0(n), exp_avg0(n), exp_avg_sq0(n);
  for (size_t i = 0; i < n; ++i) {  // a state with history, not zeros
    params0[i] = 0.5f - static_cast<float>(i % 1013) * 1e-3f;
    exp_avg0[i] = 1e-3f * (static_cast<float>(i % 61) - 30.0f);
    exp_avg_sq0[i] = 1e-6f * static_cast<float>(i % 97);
  }
  struct Run {
    std::vector<float> params, exp_avg, exp_avg_sq;
    std::vector<uint16_t> half;
  };
  auto run = [&](CpuIsa isa, const AdamConfig& config, DType type, float scale, HalfKind kind) {
    CpuAdam adam(config, CpuAdamOptions{3, isa, /*min_elements_per_thread=*/1000});
    Run r{params0, exp_avg0, exp_avg_sq0, std::vector<uint16_t>(kind == HalfKind::None ? 0 : n)};
    for (uint32_t t = 1; t <= steps; ++t)
      adam.step(t, r.params.data(), AdamGrads{grads.data() + (t - 1) * n, type, scale}, r.exp_avg.data(),
                r.exp_avg_sq.data(), n, kind == HalfKind::None ? nullptr : r.half.data(), kind);
    return r;
  };
  AdamConfig adam;
  adam.variant = AdamVariant::Adam;
  adam.weight_decay = 0.01;
  AdamConfig adamw;
  adamw.weight_decay = 0.1;
  for (DType type : {DType::BF16, DType::F16}) {
    for (float scale : {1.0f, 0.37f, 3e4f}) {
      for (const AdamConfig* config : {&adam, &adamw}) {
        const HalfKind kind = type == DType::BF16 ? HalfKind::Bf16 : HalfKind::Fp16;
        SCOPED_TRACE(std::string(to_string(type)) + " x" + std::to_string(scale) +
                     (config->variant == AdamVariant::Adam ? " Adam" : " AdamW"));
        const Run want = run(CpuIsa::Scalar, *config, type, scale, kind);
        const Run got = run(GetParam(), *config, type, scale, kind);
        size_t differ = 0, finite = 0;
        for (size_t i = 0; i < n; ++i) {
          differ += bits(got.params[i]) != bits(want.params[i]) || bits(got.exp_avg[i]) != bits(want.exp_avg[i]) ||
                    bits(got.exp_avg_sq[i]) != bits(want.exp_avg_sq[i]) || got.half[i] != want.half[i];
          finite += std::isfinite(want.params[i]) && want.params[i] != params0[i];
        }
        EXPECT_EQ(differ, 0u);
        EXPECT_GT(finite, n / 2) << "most weights should have moved to finite values";
      }
    }
  }
}

// step_into from one set of arrays into another gives step()'s bits in place, for every
// gradient type and 16-bit copy, over steps that go back and forth between two sets (the
// way a caller double-buffers), and leaves its inputs untouched.
TEST_P(cpu_adam, StepIntoBitIdenticalToInPlace) {
  constexpr size_t n = 4096 * 3 + 13;  // split over 3 threads, with a tail
  constexpr uint32_t steps = 3;
  std::vector<float> grads32(steps * n);
  for (size_t i = 0; i < grads32.size(); ++i) grads32[i] = 1e-2f * (static_cast<float>((i * 7919) % 201) - 100.0f);
  AdamConfig config;
  config.variant = AdamVariant::Adam;
  config.weight_decay = 0.01;
  for (DType type : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<uint16_t> grads16(steps * n);
    for (size_t i = 0; i < grads32.size(); ++i)
      grads16[i] = type == DType::BF16 ? math::float_to_bf16(grads32[i]) : math::float_to_fp16(grads32[i]);
    auto grads = [&](uint32_t t) {
      const size_t at = size_t{t - 1} * n;
      return AdamGrads{type == DType::F32 ? static_cast<const void*>(grads32.data() + at) : grads16.data() + at, type,
                       0.5f};
    };
    for (HalfKind kind : {HalfKind::None, HalfKind::Bf16, HalfKind::Fp16}) {
      SCOPED_TRACE(std::string(to_string(type)) + " grads, half " + std::to_string(static_cast<int>(kind)));
      CpuAdam adam(config, CpuAdamOptions{3, GetParam(), /*min_elements_per_thread=*/1000});
      // In place.
      std::vector<float> p(n), m(n), v(n);
      for (size_t i = 0; i < n; ++i) p[i] = 0.5f - static_cast<float>(i % 1013) * 1e-3f;
      const std::vector<float> p0 = p;
      std::vector<uint16_t> half_in_place(kind == HalfKind::None ? 0 : n);
      // Out of place, alternating between set 0 and set 1; each with sentinels after n.
      Guarded<float> ps[2] = {Guarded<float>(p0), Guarded<float>(n)}, ms[2] = {Guarded<float>(n), Guarded<float>(n)},
                     vs[2] = {Guarded<float>(n), Guarded<float>(n)};
      Guarded<uint16_t> half(kind == HalfKind::None ? 0 : n, 0);
      for (uint32_t t = 1; t <= steps; ++t) {
        adam.step(t, p.data(), grads(t), m.data(), v.data(), n,
                  kind == HalfKind::None ? nullptr : half_in_place.data(), kind);
        const int from = (t - 1) % 2, to = t % 2;
        const std::vector<float> before(ps[from].data(), ps[from].data() + n);
        adam.step_into(t, ps[from].data(), ms[from].data(), vs[from].data(), grads(t), ps[to].data(), ms[to].data(),
                       vs[to].data(), n, kind == HalfKind::None ? nullptr : half.data(), kind);
        EXPECT_EQ(std::memcmp(before.data(), ps[from].data(), n * 4), 0) << "step " << t << " wrote its input";
      }
      const int last = steps % 2;
      size_t differ = 0, moved = 0;
      for (size_t i = 0; i < n; ++i) {
        differ += bits(ps[last][i]) != bits(p[i]) || bits(ms[last][i]) != bits(m[i]) ||
                  bits(vs[last][i]) != bits(v[i]) || (kind != HalfKind::None && half[i] != half_in_place[i]);
        moved += p[i] != p0[i] && v[i] != 0.0f;
      }
      EXPECT_EQ(differ, 0u);
      EXPECT_GT(moved, n * 9 / 10) << "the steps should have moved most weights";
      for (int k = 0; k < 2; ++k)
        EXPECT_TRUE(ps[k].sentinels_intact() && ms[k].sentinels_intact() && vs[k].sentinels_intact());
      EXPECT_TRUE(half.sentinels_intact());
    }
  }
}

// The vector kernels stream the 16-bit copy from its first 16- or 32-byte boundary on and
// take the elements before it with the scalar loop: at every start offset of the copy
// (and of the fp32 arrays), the bits are the scalar kernel's, and nothing is written
// outside [0, n).
TEST_P(cpu_adam, HalfCopyAtAnyAlignment) {
  constexpr size_t n = 1000 + 7;
  AdamConfig config;
  config.weight_decay = 0.1;
  std::vector<float> grads(n);
  for (size_t i = 0; i < n; ++i) grads[i] = 1e-2f * (static_cast<float>((i * 31) % 113) - 56.0f);
  for (HalfKind kind : {HalfKind::Bf16, HalfKind::Fp16}) {
    for (size_t offset = 0; offset < 20; ++offset) {
      SCOPED_TRACE("offset " + std::to_string(offset) + (kind == HalfKind::Bf16 ? " bf16" : " fp16"));
      auto run = [&](CpuIsa isa) {
        CpuAdam adam(config, CpuAdamOptions{1, isa});
        std::vector<float> p(n + offset), m(n + offset), v(n + offset);
        for (size_t i = 0; i < n; ++i) p[offset + i] = 0.25f - static_cast<float>(i % 301) * 1e-3f;
        Guarded<uint16_t> half(n + offset, 0x5555);
        adam.step(1, p.data() + offset, grads.data(), m.data() + offset, v.data() + offset, n, half.data() + offset,
                  kind);
        EXPECT_TRUE(half.sentinels_intact());
        std::vector<uint16_t> out(n + offset);
        for (size_t i = 0; i < n + offset; ++i) out[i] = half[i];
        return out;
      };
      const std::vector<uint16_t> want = run(CpuIsa::Scalar), got = run(GetParam());
      EXPECT_EQ(got, want);
      for (size_t i = 0; i < offset; ++i) EXPECT_EQ(got[i], 0x5555) << "wrote before the start, at " << i;
    }
  }
}

// An out array that overlaps an input other than its own in-place twin is a caller's bug.
TEST(cpu_adam_step_into, RefusesPartialOverlap) {
  CpuAdam adam(AdamConfig{}, 1);
  std::vector<float> a(64, 1.0f), g(32, 0.1f), m(32), v(32);
  EXPECT_DEATH(adam.step_into(1, a.data(), m.data(), v.data(), AdamGrads{g.data()}, a.data() + 1, m.data(), v.data(),
                              32),
               "overlaps");
  EXPECT_DEATH(adam.step_into(1, a.data(), m.data(), v.data(), AdamGrads{g.data()}, a.data() + 32, g.data(),
                              v.data(), 32),
               "overlaps");
}

INSTANTIATE_TEST_SUITE_P(isa, cpu_adam, ::testing::ValuesIn(kernels()),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// The conversion helpers against torch's own conversions of awkward values: ties, the
// edges of the fp16 subnormal and normal ranges, overflow, infinities, NaN.
TEST(cpu_adam_half, ConversionsMatchTorch) {
  const Reference& ref = reference();
  ASSERT_GT(ref.special.size(), 100u);
  for (size_t i = 0; i < ref.special.size(); ++i) {
    const float x = ref.special[i];
    SCOPED_TRACE("value bits 0x" + [&] { char b[16]; std::snprintf(b, sizeof b, "%08x", bits(x)); return std::string(b); }());
    const uint16_t b = math::float_to_bf16(x), h = math::float_to_fp16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(math::bf16_to_float(b)));
      EXPECT_TRUE(std::isnan(math::fp16_to_float(h)));
      continue;
    }
    EXPECT_EQ(b, ref.special_bf16[i]);
    EXPECT_EQ(h, ref.special_fp16[i]);
  }
}

// Every fp16 and bf16 value converts to float and back to itself (NaNs stay NaN).
TEST(cpu_adam_half, RoundTripsEveryValue) {
  for (uint32_t u = 0; u <= 0xFFFF; ++u) {
    const uint16_t h = static_cast<uint16_t>(u);
    const float f16 = math::fp16_to_float(h), b16 = math::bf16_to_float(h);
    if (std::isnan(f16)) {
      EXPECT_EQ(math::float_to_fp16(f16), h | 0x0200) << u;  // quietened, payload kept
    } else {
      EXPECT_EQ(math::float_to_fp16(f16), h) << u;
    }
    if (std::isnan(b16)) {
      EXPECT_EQ(math::float_to_bf16(b16), h | 0x0040) << u;
    } else {
      EXPECT_EQ(math::float_to_bf16(b16), h) << u;
    }
  }
  // Exact values: the smallest subnormal, the largest finite fp16, bf16's 1 + 2^-7.
  EXPECT_EQ(math::fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(math::fp16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(math::bf16_to_float(0x3F81), 1.0f + std::ldexp(1.0f, -7));
}

// A gradient type the optimizer cannot read is refused with an Error naming it, before
// anything is touched, empty shards included.
TEST(cpu_adam_grads, RefusesOtherTypes) {
  CpuAdam adam(AdamConfig{}, 1);
  std::vector<float> p(8, 1.0f), m(8), v(8);
  const std::vector<int32_t> g(8, 1);
  for (DType type : {DType::U8, DType::I32, DType::I64, DType::F64}) {
    for (size_t n : {size_t{8}, size_t{0}}) {
      try {
        adam.step(1, p.data(), AdamGrads{g.data(), type, 1.0f}, m.data(), v.data(), n);
        ADD_FAILURE() << to_string(type) << " gradients were accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(to_string(type)), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(p, std::vector<float>(8, 1.0f));
  EXPECT_EQ(m, std::vector<float>(8, 0.0f));
}

TEST(cpu_adam_isa, ParsesNamesAndRefusesUnknown) {
  EXPECT_EQ(parse_cpu_isa("avx512"), CpuIsa::Avx512);
  EXPECT_EQ(parse_cpu_isa("scalar"), CpuIsa::Scalar);
  EXPECT_THROW(parse_cpu_isa("avx1024"), ConfigError);
  EXPECT_TRUE(cpu_supports(best_cpu_isa()));
  EXPECT_NE(CpuAdam(AdamConfig{}, 1).isa(), CpuIsa::Auto);
  EXPECT_EQ(parse_cpu_prefetch("off"), CpuPrefetch::Off);
  EXPECT_EQ(parse_cpu_prefetch("l1"), CpuPrefetch::L1);
  EXPECT_THROW(parse_cpu_prefetch("l2"), ConfigError);
  EXPECT_NE(CpuAdam(AdamConfig{}, 1).prefetch(), CpuPrefetch::Auto);
}

}  // namespace
// Stream::adam_step, the engine's GPU optimizer, against CpuAdam::step_into on the same
// random inputs, bit for bit: weights, both moments and the 16-bit copy, with fp32, bf16
// and fp16 gradients and a scale, in place and out of place. On the cpu backend (its
// stream runs adam_step_host) everywhere, and on cuda (the kernel) where a GPU is present.
TEST(StreamAdamStep, EveryBackendGivesCpuAdamsBits) {
  std::vector<Backend> backends = {Backend::Cpu};
  std::string why;
  if (cuda_available(&why))
    backends.push_back(Backend::Cuda);
  else
    std::printf("cuda not checked here: %s\n", why.c_str());
  const size_t n = 100'003;  // not a multiple of any block size
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  AdamConfig cfg;
  cfg.lr = 1e-3;
  cfg.weight_decay = 0.1;
  for (AdamVariant variant : {AdamVariant::AdamW, AdamVariant::Adam}) {
    cfg.variant = variant;
    CpuAdam adam(cfg, 1u);
    for (Backend b : backends) {
      auto dev = make_device({b, 0});
      auto stream = dev->create_stream("adam");
      for (DType gt : {DType::F32, DType::BF16, DType::F16})
        for (DType ht : {DType::F32, DType::BF16, DType::F16})
          for (bool in_place : {true, false}) {
            const std::string label = std::string(to_string(b)) + ", grads " + to_string(gt) + ", copy " +
                                      (ht == DType::F32 ? "none" : to_string(ht)) + (in_place ? ", in place" : "");
            std::vector<float> p(n), m(n), v(n), g(n);
            for (size_t i = 0; i < n; ++i) {
              p[i] = nd(rng);
              m[i] = 0.1f * nd(rng);
              v[i] = std::fabs(0.01f * nd(rng));
              g[i] = nd(rng);
            }
            std::vector<std::byte> graw(n * dtype_size(gt));
            convert_from_f32(graw.data(), gt, g.data(), n);
            const int64_t t = 7;
            const float scale = 0.37f;
            std::vector<float> wp(n), wm(n), wv(n);
            std::vector<uint16_t> whalf(n, 0), ghalf(n, 0xdead);
            const HalfKind kind = ht == DType::BF16 ? HalfKind::Bf16 : ht == DType::F16 ? HalfKind::Fp16 : HalfKind::None;
            adam.step_into(t, p.data(), m.data(), v.data(), AdamGrads{graw.data(), gt, scale}, wp.data(), wm.data(),
                           wv.data(), n, kind == HalfKind::None ? nullptr : whalf.data(), kind);
            // Device copies of the inputs; out of place writes a second set.
            const size_t fb = n * 4;
            void* d[8] = {};
            for (void*& x : d) x = dev->allocate(fb);
            stream->copy_async(d[0], p.data(), fb);
            stream->copy_async(d[1], m.data(), fb);
            stream->copy_async(d[2], v.data(), fb);
            stream->copy_async(d[3], graw.data(), graw.size());
            AdamStepArgs a;
            a.s = adam.scalars(t);
            a.p_in = static_cast<float*>(d[0]);
            a.m_in = static_cast<float*>(d[1]);
            a.v_in = static_cast<float*>(d[2]);
            a.grad = d[3];
            a.grad_t = gt;
            a.grad_scale = scale;
            a.p_out = static_cast<float*>(in_place ? d[0] : d[4]);
            a.m_out = static_cast<float*>(in_place ? d[1] : d[5]);
            a.v_out = static_cast<float*>(in_place ? d[2] : d[6]);
            a.half_out = ht == DType::F32 ? nullptr : d[7];
            a.half_t = ht;
            a.n = n;
            stream->adam_step(a);
            std::vector<float> gp(n), gm(n), gv(n), p_after(n);
            stream->copy_async(gp.data(), a.p_out, fb);
            stream->copy_async(gm.data(), a.m_out, fb);
            stream->copy_async(gv.data(), a.v_out, fb);
            stream->copy_async(p_after.data(), d[0], fb);
            if (ht != DType::F32) stream->copy_async(ghalf.data(), d[7], n * 2);
            stream->synchronize();
            for (void* x : d) dev->deallocate(x, fb);
            EXPECT_EQ(std::memcmp(gp.data(), wp.data(), fb), 0) << label << ": weights";
            EXPECT_EQ(std::memcmp(gm.data(), wm.data(), fb), 0) << label << ": exp_avg";
            EXPECT_EQ(std::memcmp(gv.data(), wv.data(), fb), 0) << label << ": exp_avg_sq";
            if (ht != DType::F32) {
              EXPECT_EQ(std::memcmp(ghalf.data(), whalf.data(), n * 2), 0) << label << ": 16-bit copy";
            }
            if (!in_place) {
              EXPECT_EQ(std::memcmp(p_after.data(), p.data(), fb), 0) << label << ": the input was written";
            }
            EXPECT_NE(std::memcmp(gp.data(), p.data(), fb), 0) << label << ": nothing changed";
          }
    }
  }
  // Types it does not step are refused, naming the type, before anything is written.
  AdamStepArgs bad;
  float x = 1.0f;
  bad.p_in = bad.m_in = bad.v_in = &x;
  bad.p_out = bad.m_out = bad.v_out = &x;
  bad.grad = &x;
  bad.n = 1;
  bad.grad_t = DType::F64;
  EXPECT_THROW(adam_step_host(bad), Error);
  bad.grad_t = DType::F32;
  bad.half_t = DType::F64;
  try {
    adam_step_host(bad);
    ADD_FAILURE() << "a working copy of type f64 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not bf16 or fp16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(x, 1.0f);
}

}  // namespace strata
