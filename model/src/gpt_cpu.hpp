// The cpu GPT (Gpt, gpt.hpp): its state, Gpt::Impl, and the buffers it computes in. One
// model in four files: gpt.cpp (construction, sizes, the public entry points),
// gpt_cpu_layers.cpp (norms, linears and their gradients, attention), gpt_cpu_blocks.cpp
// (GPT-2's and Llama's blocks) and gpt_cpu_head.cpp (embeddings, the head and its loss).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gemm_cpu.hpp"
#include "strata/model/group_view.hpp"
#include "parallel.hpp"
#include "strata/core/convert.hpp"
#include "strata/model/gpt.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/model/weight_source.hpp"

namespace strata {

namespace detail {

// Splits rows [0, rows) in chunks of 64 over the cores: fn(r0, r1).
template <class Fn>
void for_row_chunks(long rows, Fn&& fn) {
  parallel_for((rows + 63) / 64, 1, [&](long c) { fn(c * 64, std::min(rows, c * 64 + 64)); });
}

// dx += LN backward of dy; dw, db overwritten with the parameter gradients.
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, long rows, int n);

// dx += RMSNorm backward of dy; dw overwritten with the gain's gradient.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      long rows, int n);

}  // namespace detail

// A host buffer whose element type is the model's precision: the activations that feed
// matmuls (fp32, or 16-bit copies rounded once where they are made).
struct TypedBuffer {
  DType type = DType::F32;
  std::vector<std::byte> bytes;
  void* data() { return bytes.data(); }
  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  uint16_t* h16() { return reinterpret_cast<uint16_t*>(bytes.data()); }
  // The element at `row` rows of `width` elements in.
  void* at(long row, int width) { return bytes.data() + static_cast<size_t>(row) * width * dtype_size(type); }
};

// Sizes the model's host buffers, or only counts them (activation_bytes): one list of
// buffers serves both, as the cuda model's Arena does, so the count cannot drift.
struct HostBuffers {
  bool count_only = false;
  uint64_t bytes = 0;
  void take(std::vector<float>& v, uint64_t n) {
    bytes += n * sizeof(float);
    if (!count_only) v.resize(n);
  }
  void take_bytes(std::vector<std::byte>& v, uint64_t n) {
    bytes += n;
    if (!count_only) v.resize(n);
  }
  void take(TypedBuffer& v, uint64_t n, DType t) {
    v.type = t;
    bytes += n * dtype_size(t);
    if (!count_only) v.bytes.resize(n * dtype_size(t));
  }
};

// Activations one block keeps from forward for backward (all [rows = B*T] x width). "t":
// the model's precision (docs/mixed-precision.md); the rest fp32. Llama's blocks keep
// the same with RMSNorm (no means), q and rotated k, v repeated to every head, and the
// SwiGLU MLP: fc is [gate, up] (2 ffn), gel silu(gate) * up (ffn).
struct BlockActs {
  TypedBuffer ln1;                        // [BT, d] t
  std::vector<float> mean1, rstd1;        // [BT], [BT]   (mean: GPT-2 only)
  TypedBuffer qkv;                        // [BT, 3d] t   attention's q, k, v, one per head
  TypedBuffer att;                        // [BT, d] t
  std::vector<float> lse;                 // [B, H, T]
  std::vector<float> x2;                  // [BT, d]  residual after attention
  TypedBuffer ln2;                        // [BT, d] t
  std::vector<float> mean2, rstd2;        // [BT], [BT]
  std::vector<float> fc;                  // [BT, 4d] before GELU; Llama [BT, 2 ffn]
  TypedBuffer gel;                        // [BT, 4d] t, after GELU; Llama [BT, ffn]
  void carve(HostBuffers& a, long bt, const GptShape& s, DType t) {
    const int d = s.d_model;
    const uint64_t means = s.llama() ? 0 : bt;
    const uint64_t mlp_in = s.llama() ? 2ull * s.ffn_dim() : 4ull * d, mlp_mid = s.llama() ? s.ffn_dim() : 4ull * d;
    a.take(ln1, bt * d, t); a.take(mean1, means); a.take(rstd1, bt);
    a.take(qkv, bt * 3 * d, t);
    a.take(att, bt * d, t); a.take(lse, static_cast<uint64_t>(bt) * s.heads);
    a.take(x2, bt * d);
    a.take(ln2, bt * d, t); a.take(mean2, means); a.take(rstd2, bt);
    a.take(fc, bt * mlp_in); a.take(gel, bt * mlp_mid, t);
  }
};

// A parameter vector (layer-norm gain or bias, linear bias) of a group: the model reads
// and writes these in fp32, in 16 bits through a scratch copy at `slot`.
struct VecRef {
  uint64_t offset;  // elements into the group
  int n;
  long slot;        // floats into the vector scratch
};

struct Gpt::Impl {
  GptShape s;
  GptOptions o;
  GptBlockLayout lay;
  LlamaBlockLayout llay;                  // Llama only
  bool llama;
  DType t;                                // the precision: weights, gradients, matmul operands
  bool half;                              // t is BF16 or F16
  long bt_max;
  long chunk_rows;
  std::vector<float*> resid;              // [L+1][BT, d]: block inputs, then the final residual: resid_own's,
  std::vector<std::vector<float>> resid_own;  // or the checkpoint store's (GptOptions::checkpoints_from_source)
  std::vector<BlockActs> acts;            // L (no checkpointing) or 1 (recompute scratch)
  TypedBuffer lnf;                        // [BT, d] t
  std::vector<float> meanf, rstdf;        // [BT], [BT]
  std::vector<float> dres, dsmall, dbig, dqkv;  // gradients: [BT, d], [BT, d], [BT, 4d], [BT, 3d]
                                          // (Llama: dbig [BT, max(2 ffn, d + 2 kvd)]; dqkv also
                                          // the q, k, v projection's output in forward)
  std::vector<float> dmid;                // Llama: [BT, ffn] gradient of SwiGLU's output
  std::vector<float> rope_cos, rope_sin;  // Llama: [seq_len, head_dim / 2]
  std::vector<float> logits;              // [chunk rows, V]
  std::vector<float> ones;                // [BT] for column sums (fp32 only: bias gradients)
  // 16 bits only (empty in fp32):
  TypedBuffer dy;                         // [max(BT * 4d, chunk rows * V)] t: a gradient rounded for a matmul
  std::vector<float> vecs, vec_grads;     // [13d] a group's parameter vectors and their gradients
  std::vector<float> col_parts;           // [threads, 4d] partial column sums (bias gradients)
  std::vector<float> dembed;              // [V + T, d] the embeddings' gradient (wte's tied)
  std::vector<std::byte> att_workspace;   // attention16's, one scratch per core
  // Converting matmuls only (gemm_native(t) false): wte as fp32 [V, d], and the gemm's workspace.
  std::vector<float> wte32, gemm_workspace;
  std::array<VecRef, 8> block_vecs;       // ln1 w, b; qkv b; attn proj b; ln2 w, b; fc b; mlp proj b
  std::array<VecRef, 2> final_vecs;       // ln_f w, b
  std::array<VecRef, 2> llama_vecs;       // input_layernorm, post_attention_layernorm
  std::array<VecRef, 1> llama_final;      // norm
  // LoRA (GptShape::lora; fp32 only): the base is frozen (no weight gradient is computed
  // or asked for) and each adapted linear adds scale (X A^T) B^T to its output columns.
  bool frozen = false;                    // the shape has LoRA adapters
  std::vector<LoraSite> lora;             // a block's adapted linears
  float lora_scale = 0;                   // alpha / rank
  const float* lora_w = nullptr;          // the bound adapter group (bind_adapters), or null
  float* lora_g = nullptr;                // its gradient (backward), or null
  std::vector<float> lora_u, lora_du;     // [BT, rank]: X A^T and the gradient of it
  std::vector<float> frozen_vec_grads;    // [13d]: the frozen norms' gradients, computed and dropped
  detail::CpuGemm gemm;
  uint64_t bytes = 0;                     // every buffer above (activation_bytes)
  const int32_t* inputs = nullptr;        // the caller's host arrays, this micro-batch
  const int32_t* targets = nullptr;

  enum { kLn1W, kLn1B, kQkvB, kProjB, kLn2W, kLn2B, kFcB, kMlpProjB };

  struct CountOnly {};
  // Lays the buffers out without allocating: bytes only (activation_bytes).
  Impl(const GptShape& shape, const GptOptions& opts, CountOnly);
  Impl(const GptShape& shape, const GptOptions& opts);
  void carve(HostBuffers& a);
  uint64_t converting_workspace() const;

  BlockActs& acts_for(int l) { return o.checkpointing == ActivationCheckpointing::None ? acts[l] : acts[0]; }

  // Element `offset` of a parameter or gradient group of type t.
  const void* at(const void* group, uint64_t offset) const {
    return static_cast<const std::byte*>(group) + offset * dtype_size(t);
  }
  void* at(void* group, uint64_t offset) const { return static_cast<std::byte*>(group) + offset * dtype_size(t); }

  // A parameter vector as fp32: the group's own elements, or converted into its slot.
  const float* vec(const void* w, const VecRef& v) {
    if (!half) return static_cast<const float*>(w) + v.offset;
    convert_to_f32(vecs.data() + v.slot, at(w, v.offset), t, v.n);
    return vecs.data() + v.slot;
  }
  // Where a vector's fp32 gradient is written: the gradient group itself, or its slot,
  // rounded into the group by round_vec_grads once complete.
  float* vec_grad(void* g, const VecRef& v) {
    return half ? vec_grads.data() + v.slot : static_cast<float*>(g) + v.offset;
  }
  void round_vec_grads(void* g, std::span<const VecRef> vs) {
    if (half)
      for (const VecRef& v : vs) convert_from_f32(at(g, v.offset), t, vec_grads.data() + v.slot, v.n);
  }

  // The same for a block, through its views (group_view.hpp): parts are acquired as they
  // are read and go once done (a vector read in place, fp32: after the operation that
  // read it, done(w, v)); gradient parts go back once written (wrote(g, v); in 16 bits the
  // vectors are written by round_vec_grads).
  const float* vec(detail::ParamView& w, const VecRef& v) {
    if (!half) return static_cast<const float*>(w.at(v.offset));
    convert_to_f32(vecs.data() + v.slot, w.at(v.offset), t, v.n);
    w.done(v.offset, static_cast<uint64_t>(v.n));
    return vecs.data() + v.slot;
  }
  void done(detail::ParamView& w, const VecRef& v) {
    if (!half) w.done(v.offset, static_cast<uint64_t>(v.n));
  }
  float* vec_grad(detail::GradView& g, const VecRef& v) {
    if (frozen) return frozen_vec_grads.data() + v.slot;
    return half ? vec_grads.data() + v.slot : static_cast<float*>(g.at(v.offset));
  }
  void wrote(detail::GradView& g, const VecRef& v) {
    if (!half && !frozen) g.wrote(v.offset, static_cast<uint64_t>(v.n));
  }
  void round_vec_grads(detail::GradView& g, std::span<const VecRef> vs) {
    if (!half || frozen) return;
    for (const VecRef& v : vs) {
      convert_from_f32(g.at(v.offset), t, vec_grads.data() + v.slot, v.n);
      g.wrote(v.offset, static_cast<uint64_t>(v.n));
    }
  }
  // Element `col` of a row of a matrix of type ty at p.
  static const void* shifted(const void* p, DType ty, long col) {
    return static_cast<const std::byte*>(p) + static_cast<size_t>(col) * dtype_size(ty);
  }
  static void* shifted(void* p, DType ty, long col) {
    return static_cast<std::byte*>(p) + static_cast<size_t>(col) * dtype_size(ty);
  }

  // The driver's operations (gpt_driver.hpp).
  void load_tokens(const int32_t* in, const int32_t* tgt, long) {
    inputs = in;
    targets = tgt;
  }
  void release(WeightSource& ws, int g) { ws.release_params(g); }
  void ready(WeightSource& ws, int g) { ws.grads_ready(g); }
  void release(detail::ParamView& w) { w.release_all(); }
  void ready(detail::GradView& g) { g.finish(); }
  void bind_resid(int i, float* p) { resid[i] = p; }
  void bind_adapters(const void* a, void* ga) {
    lora_w = static_cast<const float*>(a);
    lora_g = static_cast<float*>(ga);
  }
  void block_forward(int l, detail::ParamView& w, bool keep_output, int B, int T) {
    float* out = keep_output ? resid[l + 1] : nullptr;
    if (llama) return llama_block_forward(w, resid[l], acts_for(l), out, B, T);
    block_forward(w, resid[l], acts_for(l), out, B, T);
  }
  void block_backward(int l, detail::ParamView& w, detail::GradView& g, int B, int T) {
    if (llama) return llama_block_backward(w, resid[l], acts_for(l), g, B, T);
    block_backward(w, resid[l], acts_for(l), g, B, T);
  }

  // The layers (gpt_cpu_layers.cpp).
  void layernorm(const float* x, const float* w, const float* b, TypedBuffer& y, float* mean, float* rstd, long rows,
                 int n);
  void rmsnorm(const float* x, const float* w, TypedBuffer& y, float* rstd, long rows, int n);
  void linear(const void* X, detail::ParamView& w, uint64_t off, const float* bias, void* Y, DType yt, long M, int N,
              int K);
  const void* matmul_grad(const float* dY, float* db, long M, int N);
  const void* gelu_matmul_grad(float* dg, const float* fc, float* db, long M, int N);
  template <class Fn>
  void column_sums(float* sums, long M, int N, Fn&& fn);
  void linear_backward(const void* dY, const void* X, detail::ParamView& w, uint64_t off, float* dX,
                       detail::GradView& g, long M, int N, int K);
  const void* grad_operand(const float* dY, long M, int N);
  // LoRA on the linear whose weight is at `off` (nothing when no adapter is bound or that
  // linear has none): Y [M, N] += scale (X A^T) B^T in its columns; backward: dA, dB into
  // the adapter gradient (overwritten) and dX [M, K] += the adapter's share. fp32.
  void lora_forward(uint64_t off, const void* X, void* Y, long M, int N, int K);
  void lora_backward(uint64_t off, const void* dY, const void* X, float* dX, long M, int N, int K);
  void attention_forward(BlockActs& a, int B, int T);
  void attention_backward(BlockActs& a, int B, int T);

  // Rows [r0, r1) of fn(r, out_row) writing `width` floats per row into y (of y's type):
  // in place in fp32, through one row of scratch rounded once in 16 bits.
  template <class Fn>
  void rows_into(TypedBuffer& y, long rows, int width, Fn&& fn) {
    detail::for_row_chunks(rows, [&](long r0, long r1) {
      std::vector<float> row(y.type == DType::F32 ? 0 : width);
      for (long r = r0; r < r1; ++r) {
        float* out = y.type == DType::F32 ? y.f32() + r * width : row.data();
        fn(r, out);
        if (y.type != DType::F32) convert_from_f32(y.at(r, width), t, out, width);
      }
    });
  }

  // The blocks (gpt_cpu_blocks.cpp).
  void block_forward(detail::ParamView& w, const float* x, BlockActs& a, float* out, int B, int T);
  void block_backward(detail::ParamView& w, const float* x, BlockActs& a, detail::GradView& g, int B, int T);
  void rope_expand(const float* p, TypedBuffer& qkv, int T, long bt);
  void rope_reduce(const float* dqkv_full, float* dp, int T, long bt);
  void llama_block_forward(detail::ParamView& w, const float* x, BlockActs& a, float* out, int B, int T);
  void llama_block_backward(detail::ParamView& w, const float* x, BlockActs& a, detail::GradView& g, int B, int T);

  // The embeddings and the head (gpt_cpu_head.cpp).

  // The output head's weights: wte (tied, group 0) or Llama's lm_head, after the final
  // norm's gain in the final group.
  const void* head_of(const void* wf, const void* wte) const { return s.tied() ? wte : at(wf, s.d_model); }
  detail::MatRef head_weights(const void* wte);
  void last_logits(const void* wf, const void* wte, int len, float* out);
  void embed(const void* w, int B, int T);
  double head(const void* wf, const void* wte, long bt, void* dwte_group, void* dlnf, float loss_scale, bool backward);
  void embed_backward(void* g0, int B, int T);
};

}  // namespace strata
