// GptCuda (the GPT on the cuda backend) against the cpu Gpt on the same random weights and
// tokens: the loss (forward_backward and forward_loss), next-token logits at three lengths
// (one across the 64-row attention tile edge) and every tensor of every gradient, with and
// without per-block activation checkpointing, in fp32, bf16 and fp16. The weights reach
// the GPU through DeviceWeights, a WeightSource over device buffers of the model's
// precision that fills each gradient buffer with NaN when handed out, so an element the
// model fails to write cannot pass.
//
// Attention runs on the cuBLAS path by default (attention_cuda.cu); GptCudaFlash runs the
// flash kernels (STRATA_ATTENTION=flash) and GptCudaMma the tensor-core ones
// (STRATA_ATTENTION=mma, attention_mma_cuda.cu, 16 bits only) against the same cpu model.
//
// Every comparison runs twice, with the reference kernels and with the fused ones
// (strata.cuda_kernels; cuBLASLt epilogues, row-parallel norms), at the same tolerances;
// STRATA_TEST_CUDA_KERNELS=reference or fused runs one. The fused set has NOT run on a
// GPU yet (scripts/gpu-check.sh kernels). Where it differs from the reference in what it
// rounds (the GELU pre-activation kept in the 16-bit type; bias gradients summed from the
// rounded dY by the matmul's epilogue), the change is one rounding of the kind the 16-bit
// tolerances below already allow for; if the first run there shows otherwise, the
// measured figures printed per kernel set say by how much.
//
// Needs a GPU: skips with the reason where there is none, or where Strata was built
// without the cuda backend (CI: compiled, linked and skipped; run on an H100 by hand,
// docs/training.md says when). The bf16, fp16 and Llama cases have run on an H200: their
// tolerances come from the rounding argument below, tightened towards the errors measured
// there (the figures are beside the constants).
//
// Tolerances, per quantity (loss relative; logits and each gradient tensor max|diff| <=
// tol * max|cpu|, since entries near zero lose relative precision; no tensor all zeros):
// - fp32: both sides compute in fp32 with different summation orders (cuBLAS vs
//   OpenBLAS, per-thread vs tiled attention sums, atomics in the embedding gradient), so
//   agreement is to fp32 rounding over the depth of the model: 1e-4 for all three.
// - bf16 vs the cpu model in bf16: both round at the same points (docs/mixed-precision.md)
//   with the same conversions, so they differ only where fp32 sums in a different order
//   land on opposite sides of a rounding boundary: such an element moves by one bf16 ulp
//   (2^-8 relative) and that perturbs what follows it. A gradient written in bf16 can thus
//   be one ulp off (0.4% of itself) plus what arrived from upstream: 2e-2 for gradients,
//   1e-2 for logits (fp32, fewer roundings upstream), 2e-3 for the loss (a mean over rows).
// - fp16 vs the cpu model in fp16, loss scale 1024 on both: fp16 keeps 3 more mantissa
//   bits than bf16 (ulp 2^-11), so an eighth of bf16's figures, rounded up: 3e-3, 2e-3,
//   3e-4.
// - bf16 vs the cpu model in fp32 (on the same bf16 weights): a check that does not lean
//   on the cpu model's own 16-bit path. Activations rounded to bf16 (relative error up to
//   2^-9 each) move logits and gradients by a few tenths of a percent per layer: 5e-2 for
//   gradients and logits, 1e-2 for the loss. Wrong layouts, types or missing terms move
//   them by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/model/attention_plan.hpp"
#include "strata/model/gpt.hpp"
#include "strata/model/gpt_layout.hpp"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels_cuda.hpp"  // model/src: the fused set's column_sums_rows
#include "strata/model/cuda_kernel_plan.hpp"
#include "strata/model/gpt_cuda.hpp"
#endif

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA

void expect_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string(what) + " failed: " + cudaGetErrorString(rc));
}

// A WeightSource over device buffers of type `dtype`, one per group (the fp32 groups it
// is given are rounded to nearest even when 16-bit, as HostWeights does); grads_ready
// copies the group's gradient back to the host, as fp32, for the comparison.
class DeviceWeights final : public WeightSource {
 public:
  explicit DeviceWeights(const std::vector<std::vector<float>>& groups, DType dtype = DType::F32)
      : dtype_(dtype), es_(dtype_size(dtype)) {
    for (const auto& g : groups) {
      std::vector<std::byte> typed(g.size() * es_);
      convert_from_f32(typed.data(), dtype_, g.data(), g.size());
      void* p = nullptr;
      void* d = nullptr;
      expect_cuda(cudaMalloc(&p, typed.size()), "cudaMalloc params");
      expect_cuda(cudaMalloc(&d, typed.size()), "cudaMalloc grads");
      expect_cuda(cudaMemcpy(p, typed.data(), typed.size(), cudaMemcpyHostToDevice), "cudaMemcpy params");
      params_.push_back(p);
      grads_.push_back(d);
      numel_.push_back(g.size());
    }
    expect_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // uploads complete
    held_.assign(groups.size(), 0);
    host_grads_.resize(groups.size());
  }
  ~DeviceWeights() override {
    for (void* p : params_) cudaFree(p);
    for (void* p : grads_) cudaFree(p);
  }
  int num_groups() const override { return static_cast<int>(params_.size()); }
  uint64_t group_numel(int g) const override { return numel_.at(g); }
  DType dtype() const override { return dtype_; }
  const void* acquire_params(int g) override {
    ++held_.at(g);
    return params_.at(g);
  }
  void release_params(int g) override {
    if (held_.at(g) <= 0) throw Error("release_params: group " + std::to_string(g) + " is not acquired");
    --held_[g];
  }
  void* gradient_buffer(int g) override {
    // All bytes 0xff: NaN in every element of every type (f32, bf16 and fp16 alike), so
    // the model must overwrite each one. The model's stream does not wait on the legacy
    // default stream: finish here.
    expect_cuda(cudaMemset(grads_.at(g), 0xff, numel_[g] * es_), "cudaMemset grads");
    expect_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return grads_[g];
  }
  void grads_ready(int g) override {
    std::vector<std::byte> typed(numel_[g] * es_);
    expect_cuda(cudaMemcpy(typed.data(), grads_[g], typed.size(), cudaMemcpyDeviceToHost), "cudaMemcpy grads");
    host_grads_.at(g).resize(numel_[g]);
    convert_to_f32(host_grads_[g].data(), typed.data(), dtype_, numel_[g]);
  }
  const std::vector<float>& grads(int g) const { return host_grads_.at(g); }
  int held(int g) const { return held_.at(g); }

 private:
  DType dtype_;
  size_t es_;  // bytes per element
  std::vector<void*> params_, grads_;
  std::vector<uint64_t> numel_;
  std::vector<int> held_;
  std::vector<std::vector<float>> host_grads_;
};

// Random weights with every tensor non-trivial: Normal tensors N(0, 0.1), layer-norm
// gains 1 + N(0, 0.1) and biases N(0, 0.1) (all-zero biases would hide a bias bug).
std::vector<std::vector<float>> random_weights(const GptShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 0.1f);
  std::vector<std::vector<float>> groups;
  for (const GptGroup& g : gpt_groups(s)) {
    std::vector<float> w(g.numel);
    for (const GptTensor& t : g.tensors)
      for (uint64_t i = 0; i < t.numel(); ++i)
        w[t.offset + i] = (t.init == GptInit::Ones ? 1.0f : 0.0f) + n01(rng);
    groups.push_back(std::move(w));
  }
  return groups;
}

float max_abs(const float* x, uint64_t n) {
  float m = 0.0f;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// max|got - ref| <= tol * max|ref|, no NaN, and not all zeros where ref is not. Returns
// max|got - ref| / max|ref|, the figure the tolerance bounds.
double expect_close(const float* got, const float* ref, uint64_t n, float tol, const std::string& what) {
  float diff = 0.0f;
  bool nan = false;
  for (uint64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i])) nan = true;
    diff = std::max(diff, std::fabs(got[i] - ref[i]));
  }
  const float scale = max_abs(ref, n);
  EXPECT_FALSE(nan) << what << ": NaN (an element never written?)";
  EXPECT_LE(diff, tol * scale) << what << ": max|diff| " << diff << " vs max|ref| " << scale;
  if (scale > 0) {
    EXPECT_GT(max_abs(got, n), 0.0f) << what << ": all zeros";
  }
  return scale > 0 ? diff / scale : diff;
}

struct Tolerance {
  double loss;   // relative
  float logits;  // max|diff| / max|cpu|
  float grads;   // the same, for each gradient tensor
};
// Measured on an H200 (the largest over the cases of each; each test prints
// its own): fp32 loss 6.3e-9, logits 2.1e-6, gradients 2.7e-6; bf16 1.5e-5, 3.4e-3,
// 7.7e-3; fp16 5.6e-6, 4.0e-4, 8.5e-4; bf16 against fp32 6.8e-5, 3.8e-3, 7.3e-3. The
// tolerances below are the argument's where that is within about 3x of the measurement,
// and otherwise about 3-10x the measurement.
constexpr Tolerance kF32{1e-6, 1e-5f, 1e-5f};
constexpr Tolerance kBf16{1e-4, 1e-2f, 2e-2f};
constexpr Tolerance kFp16{3e-5, 2e-3f, 3e-3f};
constexpr Tolerance kBf16VsF32{5e-4, 2e-2f, 3e-2f};

// The weights as `t` holds them, back in fp32 (the same values in either precision).
std::vector<std::vector<float>> rounded_to(std::vector<std::vector<float>> groups, DType t) {
  for (auto& g : groups) {
    std::vector<std::byte> typed(g.size() * dtype_size(t));
    convert_from_f32(typed.data(), t, g.data(), g.size());
    convert_to_f32(g.data(), typed.data(), t, g.size());
  }
  return groups;
}

// The cuda kernel sets each comparison runs with: both, or the one STRATA_TEST_CUDA_KERNELS
// names ("reference" or "fused"; scripts/gpu-check.sh's `kernels` part runs each alone).
std::vector<CudaKernels> kernel_sets() {
  const char* only = std::getenv("STRATA_TEST_CUDA_KERNELS");
  if (!only || !*only) return {CudaKernels::Reference, CudaKernels::Fused};
  if (std::string(only) == "reference") return {CudaKernels::Reference};
  if (std::string(only) == "fused") return {CudaKernels::Fused};
  ADD_FAILURE() << "STRATA_TEST_CUDA_KERNELS is '" << only << "': set it to reference or fused, or unset it for both";
  return {};
}

// One model on both backends: loss, gradients, forward_loss and next-token logits. The
// cuda model computes in opts.precision, the cpu model in cpu_precision (the same, or
// fp32 over the same 16-bit weights); both scale the loss's gradient by loss_scale.
void compare_with_cpu(const GptShape& shape, const GptOptions& opts, DType cpu_precision, const Tolerance& tol,
                      float loss_scale = 1.0f) {
  const long bt = static_cast<long>(opts.micro_batch) * shape.seq_len;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, shape.vocab - 1);
  std::vector<int32_t> inputs(bt), targets(bt);
  for (long i = 0; i < bt; ++i) inputs[i] = tok(rng), targets[i] = tok(rng);
  inputs[3] = inputs[5] = inputs[90];  // repeated tokens: the embedding gradient's atomics add up

  const auto weights = rounded_to(random_weights(shape, 11), opts.precision);
  GptOptions cpu_opts = opts;
  cpu_opts.precision = cpu_precision;
  HostWeights host(weights, cpu_precision);
  auto cpu = make_gpt(Backend::Cpu, shape, cpu_opts);
  const double cpu_loss = cpu->forward_backward(host, inputs.data(), targets.data(), loss_scale);

  // Every comparison runs with both kernel sets (strata.cuda_kernels), the same tolerances.
  for (const CudaKernels kernels : kernel_sets()) {
    SCOPED_TRACE(std::string(to_string(kernels)) + " kernels");
    DeviceWeights dev(weights, opts.precision);
    GptOptions gpu_opts = opts;
    gpu_opts.cuda_kernels = kernels;
    GptCuda gpu(shape, gpu_opts);
    EXPECT_EQ(gpu.activation_bytes(), GptCuda::activation_bytes(shape, gpu_opts));
    const double gpu_loss = gpu.forward_backward(dev, inputs.data(), targets.data(), loss_scale);
    EXPECT_NEAR(gpu_loss, cpu_loss, tol.loss * std::fabs(cpu_loss));
    // The measured errors, printed against their tolerances: what the tolerances were set from.
    double worst_grad = 0, worst_logits = 0;
    std::string worst_grad_name;
    for (int g = 0; g < dev.num_groups(); ++g) EXPECT_EQ(dev.held(g), 0) << "group " << g << " still acquired";

    const auto groups = gpt_groups(shape);
    for (size_t g = 0; g < groups.size(); ++g) {
      ASSERT_EQ(dev.grads(static_cast<int>(g)).size(), groups[g].numel) << "grads_ready never called for group " << g;
      const std::vector<float> ref = host.grads(static_cast<int>(g));
      for (const GptTensor& t : groups[g].tensors) {
        const double e = expect_close(dev.grads(static_cast<int>(g)).data() + t.offset, ref.data() + t.offset,
                                      t.numel(), tol.grads, "gradient of " + t.name);
        if (e > worst_grad) worst_grad = e, worst_grad_name = t.name;
      }
    }

    EXPECT_NEAR(gpu.forward_loss(dev, inputs.data(), targets.data()), cpu_loss, tol.loss * std::fabs(cpu_loss));
    for (int len : {shape.seq_len, std::min(70, shape.seq_len - 1), 1}) {
      std::vector<float> ref(shape.vocab), got(shape.vocab);
      cpu->next_token_logits(host, inputs.data(), len, ref.data());
      gpu.next_token_logits(dev, inputs.data(), len, got.data());
      worst_logits = std::max(worst_logits, expect_close(got.data(), ref.data(), ref.size(), tol.logits,
                                                         "logits after " + std::to_string(len) + " tokens"));
    }
    std::printf("measured (%s kernels): loss %.2e (tol %.0e), logits %.2e (tol %.0e), worst gradient %.2e (tol %.0e, %s)\n",
                to_string(kernels), std::fabs(gpu_loss - cpu_loss) / std::fabs(cpu_loss), tol.loss, worst_logits,
                tol.logits, worst_grad, tol.grads, worst_grad_name.c_str());
  }
}

// Sets STRATA_ATTENTION (null: unsets it) for a scope, restoring what was there: the
// model reads it when built and in the static activation_bytes.
class ScopedAttentionKernels {
 public:
  explicit ScopedAttentionKernels(const char* value) {
    if (const char* old = std::getenv(kVar)) old_ = old, had_ = true;
    if (value)
      setenv(kVar, value, 1);
    else
      unsetenv(kVar);
  }
  ~ScopedAttentionKernels() {
    if (had_)
      setenv(kVar, old_.c_str(), 1);
    else
      unsetenv(kVar);
  }
  ScopedAttentionKernels(const ScopedAttentionKernels&) = delete;
  ScopedAttentionKernels& operator=(const ScopedAttentionKernels&) = delete;

 private:
  static constexpr const char* kVar = "STRATA_ATTENTION";
  std::string old_;
  bool had_ = false;
};

std::string checkpointing_name(const ::testing::TestParamInfo<ActivationCheckpointing>& info) {
  return info.param == ActivationCheckpointing::None ? "None" : "PerBlock";
}

class GptCudaVsCpu : public ::testing::TestWithParam<ActivationCheckpointing> {};

TEST_P(GptCudaVsCpu, LossLogitsGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  // seq_len 80 crosses the 64-row attention tile; vocab not a multiple of the block size.
  compare_with_cpu({.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97},
                   {.micro_batch = 2, .checkpointing = GetParam()}, DType::F32, kF32);
}

// The same model in bf16 against the cpu model in bf16 (docs/mixed-precision.md's
// contract on both sides).
class GptCudaBf16VsCpu : public ::testing::TestWithParam<ActivationCheckpointing> {};

TEST_P(GptCudaBf16VsCpu, LossLogitsGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  compare_with_cpu({.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97},
                   {.micro_batch = 2, .checkpointing = GetParam(), .precision = DType::BF16}, DType::BF16, kBf16);
}

// fp16 with a loss scale on both sides: every gradient written is scaled by it.
TEST(GptCudaFp16VsCpu, LossScaledGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  compare_with_cpu({.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97},
                   {.micro_batch = 2, .precision = DType::F16}, DType::F16, kFp16, 1024.0f);
}

// bf16 on the GPU against fp32 on the cpu over the same bf16 weights: close to the fp32
// result whatever state the cpu model's own 16-bit path is in.
TEST(GptCudaBf16VsCpuF32, CloseToFp32) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  compare_with_cpu({.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97},
                   {.micro_batch = 2, .precision = DType::BF16}, DType::F32, kBf16VsF32);
}

// Head dimensions the flash kernels handle differently: not a multiple of the 16
// threads that share a row (24), the largest with 64-row tiles on an H100 (128), and one
// that needs 32-row tiles there (144: a 64-row tile's backward wants 230 KiB of shared
// memory). Sequence lengths end mid-tile. Run on the default (cuBLAS) attention; GptCudaFlash
// runs 144 on the flash kernels.
TEST(GptCudaHeads, LossLogitsGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  for (const auto& [d, heads, T] : {std::tuple{48, 2, 65}, std::tuple{256, 2, 130}, std::tuple{288, 2, 70}}) {
    SCOPED_TRACE("head dimension " + std::to_string(d / heads) + ", seq_len " + std::to_string(T));
    const GptShape shape{.layers = 1, .d_model = d, .heads = heads, .seq_len = T, .vocab = 97};
    compare_with_cpu(shape, {.micro_batch = 2}, DType::F32, kF32);
    SCOPED_TRACE("bf16");
    compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::BF16}, DType::BF16, kBf16);
  }
}

// The cuBLAS attention at sequence lengths that are not a multiple of 8 (its score rows
// are padded to 8) nor of 64, at head dimensions 64 and 128 (the 1.1B GPT's), fp32 and bf16.
TEST(GptCudaAttention, OddSequenceLength) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  ScopedAttentionKernels gemm("gemm");
  for (const int d : {128, 256}) {
    SCOPED_TRACE("head dimension " + std::to_string(d / 2) + ", seq_len 100");
    const GptShape shape{.layers = 1, .d_model = d, .heads = 2, .seq_len = 100, .vocab = 97};
    compare_with_cpu(shape, {.micro_batch = 2}, DType::F32, kF32);
    SCOPED_TRACE("bf16");
    compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::BF16}, DType::BF16, kBf16);
  }
}

// The flash kernels, kept beside the cuBLAS path (STRATA_ATTENTION=flash): the default
// shape in fp32 and bf16, and head dimension 144, which takes 32-row tiles on an H100.
TEST(GptCudaFlash, LossLogitsGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  ScopedAttentionKernels flash("flash");
  const GptShape shape{.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97};
  compare_with_cpu(shape, {.micro_batch = 2}, DType::F32, kF32);
  compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::BF16}, DType::BF16, kBf16);
  SCOPED_TRACE("head dimension 144");
  compare_with_cpu({.layers = 1, .d_model = 288, .heads = 2, .seq_len = 70, .vocab = 97}, {.micro_batch = 2},
                   DType::F32, kF32);
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, GptCudaVsCpu,
                         ::testing::Values(ActivationCheckpointing::None, ActivationCheckpointing::PerBlock),
                         checkpointing_name);
INSTANTIATE_TEST_SUITE_P(Checkpointing, GptCudaBf16VsCpu,
                         ::testing::Values(ActivationCheckpointing::None, ActivationCheckpointing::PerBlock),
                         checkpointing_name);

// The 16-bit matmul peak on this GPU: the tensor cores, far above the fp32 one (about
// 15x on an H100: 990 vs 67 TFLOP/s dense by the datasheet; 2x is a floor that a
// misconfigured GEMM, e.g. one falling back to fp32 CUDA cores, would not reach).
TEST(GptCudaPeak, SixteenBitAboveFp32) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  const double f32 = measure_cuda_matmul_peak(DType::F32, 0.1);
  EXPECT_GT(f32, 0.0);
  for (DType t : {DType::BF16, DType::F16}) EXPECT_GT(measure_cuda_matmul_peak(t, 0.1), 2.0 * f32) << to_string(t);
}

// Llama on both backends: grouped-query attention (4 heads, 2 kv heads), rope_theta
// 500000, SwiGLU of 96, an untied head (and a tied one), seq_len 80 across the attention
// tile. The same tolerances as GPT-2's: both sides compute the same equations in fp32
// (or round at the same points in bf16) with other summation orders. NOT run yet: no GPU
// was lent when the cuda Llama was written (docs/training.md).
GptShape cuda_llama(bool tied) {
  GptShape s{.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97};
  s.arch = Arch::Llama;
  s.kv_heads = 2;
  s.ffn = 96;
  s.rope_theta = 500000;
  s.norm_eps = 1e-6;
  s.tied_head = tied;
  return s;
}

TEST_P(GptCudaVsCpu, LlamaLossLogitsGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  compare_with_cpu(cuda_llama(false), {.micro_batch = 2, .checkpointing = GetParam()}, DType::F32, kF32);
  compare_with_cpu(cuda_llama(true), {.micro_batch = 2, .checkpointing = GetParam()}, DType::F32, kF32);
}

TEST_P(GptCudaBf16VsCpu, LlamaLossLogitsGradients) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  compare_with_cpu(cuda_llama(false), {.micro_batch = 2, .checkpointing = GetParam(), .precision = DType::BF16},
                   DType::BF16, kBf16);
}

// The tensor-core attention (STRATA_ATTENTION=mma, attention_mma_kernels.hpp; its
// mma.sync version NOT yet run on a GPU when these were written): FlashAttention-2's
// rounding points (P from the running max, rounded to 16 bits before P V; O divided by
// the row sum once at the end) rather than the cpu model's, so it is held against the cpu
// model in the same precision at the same 16-bit tolerances, and against the cpu model in
// fp32 at kBf16VsF32. bf16 and fp16 only. Head dimension 16 in the default shape (80
// tokens: the second 64-row tile cut by T), with and without checkpointing; 64 and 128
// (GPT-2's and the 1.1B GPT's) at T = 100; Llama's grouped-query shape.
TEST(GptCudaMma, Bf16) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  ScopedAttentionKernels mma("mma");
  const GptShape shape{.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97};
  compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::BF16}, DType::BF16, kBf16);
  SCOPED_TRACE("per-block checkpointing");
  compare_with_cpu(shape,
                   {.micro_batch = 2, .checkpointing = ActivationCheckpointing::PerBlock, .precision = DType::BF16},
                   DType::BF16, kBf16);
}

TEST(GptCudaMma, Fp16) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  ScopedAttentionKernels mma("mma");
  compare_with_cpu({.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97},
                   {.micro_batch = 2, .precision = DType::F16}, DType::F16, kFp16, 1024.0f);
}

TEST(GptCudaMma, HeadDims) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  ScopedAttentionKernels mma("mma");
  for (const int d : {128, 256}) {
    SCOPED_TRACE("head dimension " + std::to_string(d / 2) + ", seq_len 100");
    const GptShape shape{.layers = 1, .d_model = d, .heads = 2, .seq_len = 100, .vocab = 97};
    compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::BF16}, DType::BF16, kBf16);
    compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::F16}, DType::F16, kFp16, 1024.0f);
    SCOPED_TRACE("bf16 against the cpu model in fp32");
    compare_with_cpu(shape, {.micro_batch = 2, .precision = DType::BF16}, DType::F32, kBf16VsF32);
  }
}

TEST(GptCudaMma, Llama) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  ScopedAttentionKernels mma("mma");
  compare_with_cpu(cuda_llama(false), {.micro_batch = 2, .precision = DType::BF16}, DType::BF16, kBf16);
  compare_with_cpu(cuda_llama(true), {.micro_batch = 2, .precision = DType::F16}, DType::F16, kFp16, 1024.0f);
}

// Host-only: the tensor-core attention refuses what it cannot run before a GPU is asked:
// fp32 (its operands are 16-bit) and head dimensions that are not multiples of 16 or
// exceed 128, each naming STRATA_ATTENTION=gemm as the way out. It takes no scratch.
TEST(GptCudaSizes, MmaRefusesFp32AndOtherHeadDimensions) {
  ScopedAttentionKernels mma("mma");
  const auto refusal = [](const GptShape& shape, DType t) -> std::string {
    try {
      GptCuda::activation_bytes(shape, {.micro_batch = 2, .precision = t});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const GptShape hd32{.layers = 1, .d_model = 128, .heads = 4, .seq_len = 64, .vocab = 256};
  EXPECT_EQ(refusal(hd32, DType::BF16), "");
  EXPECT_EQ(refusal(hd32, DType::F16), "");
  const std::string f32 = refusal(hd32, DType::F32);
  EXPECT_NE(f32.find("bf16 or fp16"), std::string::npos) << f32;
  EXPECT_NE(f32.find("STRATA_ATTENTION=gemm"), std::string::npos) << f32;
  for (const auto& [d, heads] : {std::pair{96, 4}, std::pair{288, 2}, std::pair{144, 2}}) {
    const int hd = d / heads;  // 24, 144, 72
    const GptShape shape{.layers = 1, .d_model = d, .heads = heads, .seq_len = 64, .vocab = 256};
    const std::string why = refusal(shape, DType::BF16);
    EXPECT_NE(why.find("multiples of 16 up to 128, not " + std::to_string(hd)), std::string::npos) << why;
    EXPECT_NE(why.find("STRATA_ATTENTION=gemm"), std::string::npos) << why;
  }
  const uint64_t mma_bytes = GptCuda::activation_bytes(hd32, {.micro_batch = 2, .precision = DType::BF16});
  ScopedAttentionKernels flash("flash");
  EXPECT_EQ(mma_bytes, GptCuda::activation_bytes(hd32, {.micro_batch = 2, .precision = DType::BF16}));
}

// Host-only: Llama's layout sizes without a GPU (its own activations, not GPT-2's).
TEST(GptCudaSizes, LlamaCheckpointingKeepsLess) {
  const GptShape shape = cuda_llama(false);
  const uint64_t all = GptCuda::activation_bytes(shape, {.micro_batch = 2});
  const uint64_t per_block =
      GptCuda::activation_bytes(shape, {.micro_batch = 2, .checkpointing = ActivationCheckpointing::PerBlock});
  EXPECT_LT(per_block, all);
  GptShape gpt2{.layers = 2, .d_model = 64, .heads = 4, .seq_len = 80, .vocab = 97};
  EXPECT_NE(all, GptCuda::activation_bytes(gpt2, {.micro_batch = 2}));
  // A layer keeps at least gate and up (2 ffn) and q, k, v repeated (3d) per row in fp32.
  EXPECT_GE(all - per_block, 2ull * 80 * 4 * (2 * 96 + 3 * 64));
}

// Host-only: sizes the layout without a GPU, so this part runs in CI.
TEST(GptCudaSizes, CheckpointingKeepsLess) {
  const GptShape shape{.layers = 4, .d_model = 128, .heads = 4, .seq_len = 64, .vocab = 256};
  const uint64_t all = GptCuda::activation_bytes(shape, {.micro_batch = 2});
  const uint64_t per_block =
      GptCuda::activation_bytes(shape, {.micro_batch = 2, .checkpointing = ActivationCheckpointing::PerBlock});
  EXPECT_GT(per_block, 0u);
  EXPECT_LT(per_block, all);
  // At least the residual stream, the per-layer activations and the gradients in fp32.
  EXPECT_GE(all, 4ull * (shape.layers + 1) * 2 * shape.seq_len * shape.d_model);
  EXPECT_THROW(GptCuda::activation_bytes(shape, {.micro_batch = 0}), ConfigError);
}

// Host-only: in 16 bits the activations that feed a matmul (ln1, qkv, att, ln2, gel) are
// stored 16-bit, the rest fp32, so a layer's share shrinks, but by less than half.
TEST(GptCudaSizes, SixteenBitActivations) {
  const GptShape shape{.layers = 4, .d_model = 128, .heads = 4, .seq_len = 64, .vocab = 256};
  const auto per_layer = [&](DType t) {
    return GptCuda::activation_bytes(shape, {.micro_batch = 2, .precision = t}) -
           GptCuda::activation_bytes(
               shape, {.micro_batch = 2, .checkpointing = ActivationCheckpointing::PerBlock, .precision = t});
  };
  const uint64_t bt = 2ull * shape.seq_len, d = shape.d_model, layers_kept = shape.layers - 1;
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(to_string(t));
    EXPECT_LT(per_layer(t), per_layer(DType::F32));
    // 16-bit: ln1, qkv, att, ln2, gel (10d per row); fp32: x2, fc (5d per row).
    EXPECT_GE(per_layer(t), layers_kept * bt * (2 * 10 * d + 4 * 5 * d));
  }
  EXPECT_THROW(GptCuda::activation_bytes(shape, {.precision = DType::I32}), ConfigError);
}

// Host-only: the cuBLAS attention's scratch is counted in activation_bytes: the scores
// of every head of a sequence where they fit (8 bytes a score in fp32: S and dP; 12 in
// 16 bits: P and dS too, each row padded to 8), under the 256 MiB cap where they do not.
// The flash kernels take none. Any other STRATA_ATTENTION is refused.
TEST(GptCudaSizes, AttentionScratch) {
  const auto extra = [](const GptShape& shape, DType t) {
    const GptOptions o{.micro_batch = 2, .precision = t};
    uint64_t gemm = 0, flash = 0;
    {
      ScopedAttentionKernels k(nullptr);  // the default
      gemm = GptCuda::activation_bytes(shape, o);
    }
    {
      ScopedAttentionKernels k("flash");
      flash = GptCuda::activation_bytes(shape, o);
    }
    return gemm - flash;
  };
  const GptShape small{.layers = 2, .d_model = 128, .heads = 4, .seq_len = 64, .vocab = 256};
  EXPECT_EQ(extra(small, DType::F32), 4ull * 64 * 64 * 8);
  EXPECT_EQ(extra(small, DType::BF16), 4ull * 64 * 64 * 12);
  // What the planner counts on a GPU (strata/model/attention_plan.hpp) is what the model takes.
  EXPECT_EQ(extra(small, DType::BF16), attention_gemm_scratch_bytes(64, 4, DType::BF16));
  // 8192 tokens: one head's scores alone (768 MiB) exceed the cap; its query rows are cut.
  const GptShape long_seq{.layers = 1, .d_model = 128, .heads = 4, .seq_len = 8192, .vocab = 256};
  const uint64_t cap = 256ull << 20;
  EXPECT_LE(extra(long_seq, DType::BF16), cap);
  EXPECT_GT(extra(long_seq, DType::BF16), cap - 8192ull * 12);  // whole rows of 8192 scores: less than one short
  ScopedAttentionKernels bad("flashy");
  EXPECT_THROW(GptCuda::activation_bytes(small, {.micro_batch = 2}), ConfigError);
}

// The fused set's bias gradient where cuBLASLt takes no BGRADB (column_sums_rows: row
// chunks, then per column) against the host's sum in double, rounded once to the output
// type: at the 1.1B's projections (2048 x 2048, where cuBLASLt refused on an H200), a
// width not a multiple of the 256-column tile and fewer rows than a chunk. The partial
// buffer is filled with NaN first, so a chunk not written would show.
TEST(GptCudaKernels, ColumnSumsRowsAddEveryRowOnce) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << why;
  namespace cu = detail::cuda;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto [rows, n] : {std::pair{2048L, 2048}, std::pair{1000L, 3100}, std::pair{7L, 50}, std::pair{1L, 1}}) {
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << rows << " x " << n << " " << to_string(t));
      std::vector<float> x(static_cast<size_t>(rows) * n);
      for (float& v : x) v = dist(rng);
      const NormPlan p = plan_norm(rows, n, cu::multiprocessors(), false);
      float *dx = nullptr, *part = nullptr;
      void* dout = nullptr;
      expect_cuda(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * sizeof(float)), "cudaMalloc");
      expect_cuda(cudaMalloc(reinterpret_cast<void**>(&part), p.partial_bytes), "cudaMalloc");
      expect_cuda(cudaMalloc(&dout, n * sizeof(float)), "cudaMalloc");
      expect_cuda(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
      expect_cuda(cudaMemset(part, 0xff, p.partial_bytes), "cudaMemset");  // NaN in every partial
      cu::column_sums_rows(dx, dout, t, part, rows, n, p, nullptr);
      std::vector<float> got(n);
      std::vector<uint16_t> bits(n);
      expect_cuda(cudaMemcpy(t == DType::F32 ? static_cast<void*>(got.data()) : bits.data(), dout,
                             n * dtype_size(t), cudaMemcpyDeviceToHost), "cudaMemcpy");
      if (t != DType::F32) convert_to_f32(got.data(), bits.data(), t, n);
      cudaFree(dx), cudaFree(part), cudaFree(dout);
      for (int c = 0; c < n; ++c) {
        double sum = 0, mag = 0;
        for (long r = 0; r < rows; ++r) sum += x[r * n + c], mag += std::fabs(x[r * n + c]);
        const double tol = 1e-6 * mag + (t == DType::F32 ? 0.0 : std::ldexp(std::fabs(sum), -8));
        ASSERT_NEAR(got[c], sum, tol) << "column " << c;
      }
    }
  }
}

// Host-only: the peak refuses a type the model does not compute in before touching a GPU.
TEST(GptCudaPeak, RefusesOtherTypes) { EXPECT_THROW(measure_cuda_matmul_peak(DType::F64, 0.1), ConfigError); }

#else  // no cuda backend in this build

TEST(GptCudaVsCpu, LossLogitsGradients) {
  std::string why;
  EXPECT_FALSE(cuda_available(&why));
  GTEST_SKIP() << why;
}

#endif

}  // namespace
}  // namespace strata
