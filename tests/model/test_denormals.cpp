// The cpu model computes with denormals flushed (model/src/gpt.cpp, FlushDenormals): a
// denormal costs ~100x an ordinary operation on x86, and training produces many (the
// step time of the fortunes run grew by half over 300 steps from them).
//  - A model whose logits span more than exp's range (probabilities below 1e-38, whose
//    gradients are denormal) hands back gradients with no denormal in them, and the
//    caller's floating-point control word is as it was.
//  - OpenBLAS's worker threads flush too, once the model has run: a multi-threaded sgemm
//    of denormal inputs gives exact zeros with the flags set (and not before the model
//    ran, the control that shows the check can fail); the same for the threads of the
//    fp32 sgemm the model uses, OpenBLAS's or oneDNN's (cpu_sgemm.hpp).
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "strata/model/cpu_sgemm.hpp"
#include "strata/model/gpt.hpp"
#include "strata/model/gpt_layout.hpp"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

extern "C" int openblas_get_num_threads(void) __attribute__((weak));

namespace strata {
namespace {

#if defined(__SSE__)
constexpr unsigned kFtzDaz = 0x8040;

std::vector<std::vector<float>> weights(const GptShape& s, float wte_std) {
  std::mt19937 rng(3);
  std::vector<std::vector<float>> w;
  for (const GptGroup& g : gpt_groups(s)) {
    std::vector<float> v(g.numel);
    for (const GptTensor& t : g.tensors) {
      const float std = t.name == "wte.weight" ? wte_std : 0.02f;
      std::normal_distribution<float> n(0.0f, std);
      for (uint64_t i = 0; i < t.numel(); ++i)
        v[t.offset + i] = t.init == GptInit::Ones ? 1.0f : t.init == GptInit::Zeros ? 0.0f : n(rng);
    }
    w.push_back(std::move(v));
  }
  return w;
}

// Entries of c that are not zero after c = a b, a [n, n] of denormals, b all ones: through
// OpenBLAS itself, or the model's fp32 sgemm (cpu_sgemm.hpp).
long sgemm_of_denormals_nonzero(int n, bool model_sgemm) {
  std::vector<float> a(static_cast<size_t>(n) * n, 1e-39f), b(a.size(), 1.0f), c(a.size(), -1.0f);
  if (model_sgemm)
    cpu_sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
  long nonzero = 0;
  for (float x : c) nonzero += x != 0.0f;
  return nonzero;
}

// With the calling thread's flags set, a product of denormals split over the workers gives
// nonzero entries (the control: otherwise the check is skipped); once the model ran, none.
void expect_workers_flush_once_the_model_ran(bool model_sgemm, const std::string& workers) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | kFtzDaz);
  const long before_model = sgemm_of_denormals_nonzero(512, model_sgemm);
  _mm_setcsr(saved);
  if (before_model == 0) GTEST_SKIP() << workers << " did not split this sgemm over its threads";

  const GptShape s{.layers = 1, .d_model = 32, .heads = 2, .seq_len = 16, .vocab = 64};
  HostWeights ws(weights(s, 0.02f));
  Gpt model(s, {.micro_batch = 1});
  std::vector<int32_t> x(16, 1), y(16, 2);
  model.forward_loss(ws, x.data(), y.data());

  _mm_setcsr(saved | kFtzDaz);
  const long after_model = sgemm_of_denormals_nonzero(512, model_sgemm);
  _mm_setcsr(saved);
  EXPECT_EQ(after_model, 0) << workers << " still compute with denormals (" << before_model
                            << " nonzero entries before the model ran)";
}

TEST(Denormals, GradientsHoldNoneAndTheCallersFlagsAreKept) {
  const GptShape s{.layers = 1, .d_model = 32, .heads = 2, .seq_len = 16, .vocab = 64};
  const GptOptions o{.micro_batch = 2};
  HostWeights ws(weights(s, 6.0f));  // logits with a spread far beyond exp's range
  Gpt model(s, o);
  std::vector<int32_t> x(32), y(32);
  for (int i = 0; i < 32; ++i) x[i] = (i * 7) % 64, y[i] = (i * 5 + 1) % 64;

  const unsigned before = _mm_getcsr();
  std::vector<float> logits(s.vocab);
  model.next_token_logits(ws, x.data(), 16, logits.data());
  float lo = logits[0], hi = logits[0];
  for (float v : logits) lo = std::min(lo, v), hi = std::max(hi, v);
  ASSERT_GT(hi - lo, 100.0f) << "the logits do not span far enough to make denormal probabilities";

  model.forward_backward(ws, x.data(), y.data());
  EXPECT_EQ(_mm_getcsr(), before) << "the model left the caller's MXCSR changed";
  long subnormal = 0, nonzero = 0;
  for (int g = 0; g < ws.num_groups(); ++g)
    for (float v : ws.grads(g)) {
      subnormal += std::fpclassify(v) == FP_SUBNORMAL;
      nonzero += v != 0.0f;
    }
  EXPECT_EQ(subnormal, 0);
  EXPECT_GT(nonzero, 1000);
}

// Run alone (ctest runs each test in its own process): the check before the model needs
// OpenBLAS's workers as the library started them.
TEST(Denormals, OpenBlasWorkersFlushOnceTheModelRan) {
  ASSERT_EQ(std::fpclassify(1e-39f), FP_SUBNORMAL);
  if (!openblas_get_num_threads || openblas_get_num_threads() < 2)
    GTEST_SKIP() << "OpenBLAS runs one thread here: there are no workers to check";
  expect_workers_flush_once_the_model_ran(false, "OpenBLAS's workers");
}

// The same for the threads of whichever library runs the fp32 model's matmuls
// (cpu_sgemm.hpp): OpenBLAS's workers, or oneDNN's OpenMP team (CTest runs this test with
// STRATA_CPU_SGEMM=onednn too). The team is made before the flags are set, as OpenBLAS's
// workers are when it loads, so that the check before the model can fail.
TEST(Denormals, Fp32SgemmThreadsFlushOnceTheModelRan) {
  ASSERT_EQ(std::fpclassify(1e-39f), FP_SUBNORMAL);
  std::printf("fp32 sgemm: %s\n", cpu_sgemm_choice().name.c_str());
  sgemm_of_denormals_nonzero(512, true);  // the library's threads start, without the flags
  expect_workers_flush_once_the_model_ran(true, cpu_sgemm_choice().name + "'s threads");
}
#else
TEST(Denormals, NotX86) { GTEST_SKIP() << "flush-to-zero is set through x86's MXCSR only"; }
#endif

}  // namespace
}  // namespace strata
