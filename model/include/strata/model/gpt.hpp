// The decoder on the cpu backend, GPT-2 or Llama (GptShape::arch). GPT-2: token and
// position embeddings, pre-LayerNorm blocks (causal multi-head attention, GELU MLP), final
// LayerNorm, output head tied to the token embedding. Llama: token embedding, pre-RMSNorm
// blocks (rotary positions on q and k, grouped-query attention through the same causal
// attention with k and v repeated per head, SwiGLU MLP), final RMSNorm, tied or untied
// head. Both: mean cross-entropy loss. Layout: model/gpt_layout.hpp.
//
// It knows nothing of sharding or tiers: it asks a WeightSource for each group's weights
// just before use (in gpt_schedule's order) and hands back each group's gradient right
// after that group's backward, so the engine can reduce and offload it while the rest of
// backward runs. fp32 matmuls are sgemm (OpenBLAS's or oneDNN's, cpu_sgemm.hpp); attention
// is computed block by block with an online softmax (no more than one [block, block] tile
// of scores exists at a time, forward or backward); the output head and loss run over row chunks, so no full
// [tokens, vocab] logits tensor exists either. In bf16 and fp16 (GptOptions::precision)
// the model rounds where docs/mixed-precision.md says; its bf16 matmuls are oneDNN's and
// its attention holds one [64, seq_len] panel of scores per core.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/core/dtype.hpp"
#include "strata/model/cuda_kernel_plan.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/model/weight_source.hpp"

namespace strata {

enum class ActivationCheckpointing {
  None,      // keep every block's activations from forward for backward
  PerBlock,  // keep only each block's input; recompute the block in backward
};


struct GptOptions {
  int micro_batch = 1;   // sequences per forward
  ActivationCheckpointing checkpointing = ActivationCheckpointing::None;
  // The element type of the weights and gradients the model reads and writes (its
  // WeightSource's dtype()) and of its matmul operands: F32, BF16 or F16. Matmuls
  // accumulate in fp32; layer norms, softmax, GELU, the loss and the residual stream are
  // fp32 whatever this is.
  DType precision = DType::F32;
  // With checkpointing: the block inputs and the final residual (the checkpoints) are the
  // weight source's (WeightSource::activation_store(), activation_store.hpp), which may keep
  // them off the device between forward and backward; the model does not allocate them.
  // The source must offer a store exactly when this is set.
  bool checkpoints_from_source = false;
  CudaKernels cuda_kernels = CudaKernels::Reference;  // the cuda model's kernels; cpu: Reference only
};

// A GPT on some backend, as a trainer drives it (make_gpt picks the implementation).
class GptModel {
 public:
  virtual ~GptModel() = default;
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptShape& shape() const { return shape_; }
  const GptOptions& options() const { return opts_; }

  // One micro-batch: inputs and targets are HOST arrays [micro_batch, seq_len] of token
  // ids. Returns the mean cross-entropy loss; every group's gradient of that mean, times
  // loss_scale (fp16 loss scaling; 1 otherwise), goes to ws's gradient buffers. Groups
  // are acquired in gpt_schedule's order.
  virtual double forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets,
                                  float loss_scale = 1.0f) = 0;
  // Loss only (evaluation): acquires 0, 1..L, L+1, 0 and releases them.
  virtual double forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) = 0;
  // The logits [vocab] after the last of `len` host tokens (1 <= len <= seq_len) of one
  // sequence, written to HOST memory: for sampling.
  virtual void next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* logits) = 0;
  // Bytes this model holds for activations and scratch at micro_batch x seq_len (host
  // memory on the cpu backend, device memory on cuda).
  virtual uint64_t activation_bytes() const = 0;

 protected:
  GptModel(const GptShape& shape, const GptOptions& opts) : shape_(shape), opts_(opts) {}
  GptShape shape_;
  GptOptions opts_;
};

// The cpu backend's GPT. Buffers the WeightSource hands out are host memory.
class Gpt final : public GptModel {
 public:
  Gpt(const GptShape& shape, const GptOptions& opts);
  ~Gpt() override;

  double forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets,
                          float loss_scale = 1.0f) override;
  double forward_loss(WeightSource& ws, const int32_t* inputs, const int32_t* targets) override;
  void next_token_logits(WeightSource& ws, const int32_t* tokens, int len, float* logits) override;
  uint64_t activation_bytes() const override;
  // Activation bytes a configuration needs, without building it (the planner, start-up checks).
  static uint64_t activation_bytes(const GptShape& shape, const GptOptions& opts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The GPT for a backend: Gpt on cpu, GptCuda (gpt_cuda.hpp) on cuda. Throws ConfigError
// for the sim backend (tensors without bytes) and for cuda in a build without it.
std::unique_ptr<GptModel> make_gpt(Backend backend, const GptShape& shape, const GptOptions& opts);

// Measured fp32 matmul peak of a backend, FLOP/s: cpu_sgemm on this machine's cores
// (cpu) or cuBLAS sgemm without TF32 on the current GPU (cuda); the best of a few runs of
// about `seconds` in total. The peak MFU is measured against.
double measure_matmul_peak(Backend backend, double seconds = 0.5);
// The same for a model computing in `precision`: F32 as above; on the cpu, BF16 and F16
// are the model's own matmul path (cpu_matmul_path) at a GPT-2-small MLP shape,
// 4096 x 3072 x 768. Throws ConfigError for 16 bits on other backends.
double measure_matmul_peak(Backend backend, DType precision, double seconds);

// The path the cpu model's matmuls over 16-bit operands (BF16, F16) take in this process,
// and why, in words: oneDNN's 16-bit matmul, or fp32 sgemm over converted operands where
// oneDNN has none for the type or converting measured faster (model/src/gemm_cpu.hpp;
// STRATA_CPU_GEMM_BF16 / _FP16 force either). Decided on first use; a bad variable throws
// ConfigError.
std::string cpu_matmul_path(DType precision);

// A WeightSource over plain host buffers, one per group (sampling from a checkpoint,
// tests). The fp32 groups it is given are held as `dtype` (rounded to nearest even when
// 16-bit); gradients land in host buffers of that type, which grads() reads as fp32.
class HostWeights final : public WeightSource {
 public:
  explicit HostWeights(std::vector<std::vector<float>> groups, DType dtype = DType::F32);
  int num_groups() const override { return static_cast<int>(numel_.size()); }
  uint64_t group_numel(int g) const override { return numel_.at(g); }
  DType dtype() const override { return dtype_; }
  const void* acquire_params(int g) override;
  void release_params(int g) override;
  void* gradient_buffer(int g) override;
  void grads_ready(int g) override;
  // Group g's last gradient, as fp32.
  std::vector<float> grads(int g) const;

 private:
  DType dtype_;
  std::vector<uint64_t> numel_;
  std::vector<std::vector<std::byte>> params_, grads_;
  std::vector<int> held_;
};

// Measured fp32 matmul peak of this machine's cores (cpu_sgemm on square matrices,
// best of a few runs of about `seconds` in total), FLOP/s: the cpu backend's peak for MFU.
double measure_cpu_matmul_peak(double seconds = 0.5);
// Sustained fp32 sgemm rate of this machine's cores, FLOP/s: the same products, one after
// another while keep_going() says so (asked between products; one product at least), their
// FLOPs over the whole time. What compute gets while something else runs beside it (bench io
// --beside-compute); the peak above is the best single product instead.
struct MatmulRate {
  double flops_per_s = 0;
  double seconds = 0;  // how long the products ran
};
MatmulRate cpu_matmul_rate_while(const std::function<bool()>& keep_going);

}  // namespace strata
