// The CPU optimizer: fused Adam/AdamW over fp32 shards.
//
// One pass over memory per step: for each element it reads the master weight, the
// gradient and both moments, writes the weight and moments back, and, when asked,
// writes the 16-bit working copy of the weight (bf16 or fp16) in the same pass. That is
// 28 bytes per parameter with fp32 gradients, 26 with 16-bit ones (+2 for the copy), so
// the step runs at memory bandwidth; the unfused torch.optim.Adam makes about ten passes.
// The gradient is widened and scaled in that same pass (AdamGrads), so the caller needs
// neither a conversion pass nor a scaling pass before the step.
//
// The element-wise math is strata::math::adam_update (core/math/adam.hpp), the same
// function the cuda backend runs. Vector kernels (AVX-512, AVX2+FMA+F16C) are chosen at
// run time from what the CPU supports, and give bit-identical results to the scalar
// path, which also serves vector tails and other architectures. Results match
// torch.optim.Adam / AdamW (tests/offload/test_cpu_adam.cpp). The step may also read one
// set of arrays and write another (step_into), for callers that double-buffer the state.
//
// Where the caller puts the arrays matters more than anything in the kernel: on the AMD
// EPYC development VM, four 64M-element arrays exactly 2^28 bytes (256 MiB) apart, as a
// pool of power-of-two slots would place them, ran the step 2.4x slower than the same
// arrays one page further apart; 2^27 apart, 1.2x; 200,000,000 bytes apart, no loss
// (docs/bench-optimizer.md). Arrays that fit in the last-level cache show nothing, so the
// cause lies in how the memory system maps addresses, and no loop order in the kernel
// avoids it: whoever allocates the state should keep its arrays from lying a large
// power of two apart (a page of slack between them is enough).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/math/adam.hpp"
#include "strata/core/math/half.hpp"

namespace strata {

using math::AdamVariant;
using math::HalfKind;

// Adam's hyperparameters, in double like the Python floats torch.optim is given.
using AdamConfig = math::AdamHyperparams;

// Which kernel runs the step. Auto picks the widest the CPU supports.
enum class CpuIsa { Auto, Scalar, Avx2, Avx512 };
const char* to_string(CpuIsa isa);
CpuIsa parse_cpu_isa(const std::string& name);  // throws ConfigError naming the choices
bool cpu_supports(CpuIsa isa);                  // Auto and Scalar: always
CpuIsa best_cpu_isa();

// Software prefetch in the vector kernels (each input stream 1 KiB ahead into L1). Auto:
// L1 on Intel CPUs, Off on others. Measured (docs/bench-optimizer.md): on an Intel Xeon VM
// it made the step 5% faster with two threads and 9% with one; on an AMD EPYC (Zen 4) VM,
// 13% slower, the hardware prefetchers there doing better alone. Same bits either way.
enum class CpuPrefetch { Auto, Off, L1 };
const char* to_string(CpuPrefetch prefetch);
CpuPrefetch parse_cpu_prefetch(const std::string& name);  // throws ConfigError naming the choices

struct CpuAdamOptions {
  unsigned threads = 0;         // workers, the calling thread included; 0: hardware_concurrency
  CpuIsa isa = CpuIsa::Auto;    // forcing one the CPU lacks throws Unavailable
  size_t min_elements_per_thread = 1 << 16;  // below this a step uses fewer threads
  CpuPrefetch prefetch = CpuPrefetch::Auto;
};

// The gradient as the optimizer reads it: n elements of `type` (F32, BF16 or F16, each
// aligned to its size), each widened to fp32 and multiplied by `scale` in fp32 before
// the update (averaging over ranks and micro-steps, clipping, 1/loss_scale):
// g = math::adam_scaled_grad(float(data[i]), scale). A scale of 1 changes nothing.
struct AdamGrads {
  const void* data = nullptr;  // [n] of `type`
  DType type = DType::F32;
  float scale = 1.0f;
};

class CpuAdam {
 public:
  explicit CpuAdam(const AdamConfig& config, const CpuAdamOptions& options = {});
  CpuAdam(const AdamConfig& config, unsigned threads) : CpuAdam(config, CpuAdamOptions{threads}) {}
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  // Takes step t (t >= 1: the first step is 1, as torch counts after its increment) over
  // one shard of n elements. params, exp_avg and exp_avg_sq ([n], fp32) are updated in
  // place; grads ([n] of grads.type) is only read, and scaled as it is read. When kind is
  // not None, half_out ([n], bf16 or fp16 bits) receives the updated params rounded to
  // nearest even. The arrays must not overlap. Blocks until the step is done; not
  // reentrant (one step at a time). A gradient type other than F32, BF16 or F16 throws
  // Error.
  void step(int64_t t, float* params, AdamGrads grads, float* exp_avg, float* exp_avg_sq, size_t n,
            void* half_out = nullptr, HalfKind kind = HalfKind::None) {
    step_into(t, params, exp_avg, exp_avg_sq, grads, params, exp_avg, exp_avg_sq, n, half_out, kind);
  }
  // fp32 gradients, unscaled: step(t, params, AdamGrads{grads}, ...).
  void step(int64_t t, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
            size_t n, void* half_out = nullptr, HalfKind kind = HalfKind::None) {
    step(t, params, AdamGrads{grads, DType::F32, 1.0f}, exp_avg, exp_avg_sq, n, half_out, kind);
  }

  // The same step out of place: reads the weights and moments from the *_in arrays and
  // writes the updated ones to the *_out arrays ([n] fp32 each), bit for bit what step()
  // leaves in place (step() is this with each out array the same as its in array). Each
  // out array is either exactly its in array or overlaps none of the arrays; the inputs
  // are left untouched when they are distinct. Same contract otherwise as step().
  void step_into(int64_t t, const float* params_in, const float* exp_avg_in, const float* exp_avg_sq_in,
                 AdamGrads grads, float* params_out, float* exp_avg_out, float* exp_avg_sq_out, size_t n,
                 void* half_out = nullptr, HalfKind kind = HalfKind::None);

  // Step t's scalars as step_into computes them (in this -ffp-contract=off file, so any
  // caller gets the same bits: the engine's GPU optimizer hands them to its kernel).
  math::AdamStepScalars scalars(int64_t t) const;
  const AdamConfig& config() const { return config_; }
  void set_lr(double lr) { config_.lr = lr; }  // for learning-rate schedules
  CpuIsa isa() const { return isa_; }          // never Auto
  CpuPrefetch prefetch() const { return prefetch_; }  // never Auto
  unsigned threads() const { return threads_; }

 private:
  class Pool;
  AdamConfig config_;
  CpuIsa isa_;
  CpuPrefetch prefetch_;
  unsigned threads_;
  size_t min_elements_per_thread_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace strata
