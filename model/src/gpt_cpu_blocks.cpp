// The cpu GPT's blocks (gpt_cpu.hpp): GPT-2's (layer norms, GELU MLP) and Llama's
// (RMSNorm, rotary positions, grouped k and v, SwiGLU MLP), forward and backward.
#include <algorithm>

#include "gpt_cpu.hpp"
#include "kernels_cpu.hpp"
#include "parallel.hpp"

namespace strata {

using detail::for_row_chunks;
using detail::GradView;
using detail::layernorm_backward;
using detail::ParamView;
using detail::parallel_for;
using detail::rmsnorm_backward;

namespace {

// y += x over [rows, n], split over the cores.
void add_rows(float* y, const float* x, long rows, int n) {
  for_row_chunks(rows, [&](long r0, long r1) { detail::add_into(y + r0 * n, x + r0 * n, (r1 - r0) * n); });
}

}  // namespace

// x [BT, d] -> a's activations; writes x + block(x) to out when out is not null.
void Gpt::Impl::block_forward(ParamView& w, const float* x, BlockActs& a, float* out, int B, int T) {
  const int d = s.d_model;
  const long bt = static_cast<long>(B) * T;
  const auto& v = block_vecs;
  layernorm(x, vec(w, v[kLn1W]), vec(w, v[kLn1B]), a.ln1, a.mean1.data(), a.rstd1.data(), bt, d);
  done(w, v[kLn1W]);
  done(w, v[kLn1B]);
  linear(a.ln1.data(), w, lay.qkv_w, vec(w, v[kQkvB]), a.qkv.data(), t, bt, 3 * d, d);
  done(w, v[kQkvB]);
  attention_forward(a, B, T);
  linear(a.att.data(), w, lay.attn_proj_w, vec(w, v[kProjB]), a.x2.data(), DType::F32, bt, d, d);
  done(w, v[kProjB]);
  float* x2 = a.x2.data();
  add_rows(x2, x, bt, d);
  layernorm(x2, vec(w, v[kLn2W]), vec(w, v[kLn2B]), a.ln2, a.mean2.data(), a.rstd2.data(), bt, d);
  done(w, v[kLn2W]);
  done(w, v[kLn2B]);
  linear(a.ln2.data(), w, lay.fc_w, vec(w, v[kFcB]), a.fc.data(), DType::F32, bt, 4 * d, d);
  done(w, v[kFcB]);
  const float* fc = a.fc.data();
  parallel_for((bt + 15) / 16, 1, [&](long c) {
    const long r0 = c * 16, r1 = std::min(bt, r0 + 16);
    if (half) return detail::gelu_forward_16(fc + r0 * 4 * d, a.gel.h16() + r0 * 4 * d, t, (r1 - r0) * 4 * d);
    detail::gelu_forward(fc + r0 * 4 * d, a.gel.f32() + r0 * 4 * d, (r1 - r0) * 4 * d);
  });
  if (!out) return;
  linear(a.gel.data(), w, lay.mlp_proj_w, vec(w, v[kMlpProjB]), out, DType::F32, bt, d, 4 * d);
  done(w, v[kMlpProjB]);
  add_rows(out, x2, bt, d);
}

// dres: gradient of the block's output in, of its input out. g: the block's gradient.
void Gpt::Impl::block_backward(ParamView& w, const float* x, BlockActs& a, GradView& g, int B, int T) {
  const int d = s.d_model;
  const long bt = static_cast<long>(B) * T;
  const auto& v = block_vecs;
  float* dr = dres.data();
  // MLP: out = x2 + gelu(fc(ln2(x2))) Wp^T + bp
  const void* dy_proj = matmul_grad(dr, vec_grad(g, v[kMlpProjB]), bt, d);
  wrote(g, v[kMlpProjB]);
  linear_backward(dy_proj, a.gel.data(), w, lay.mlp_proj_w, dbig.data(), g, bt, d, 4 * d);
  const void* dy_fc = gelu_matmul_grad(dbig.data(), a.fc.data(), vec_grad(g, v[kFcB]), bt, 4 * d);
  wrote(g, v[kFcB]);
  linear_backward(dy_fc, a.ln2.data(), w, lay.fc_w, dsmall.data(), g, bt, 4 * d, d);
  layernorm_backward(dsmall.data(), a.x2.data(), vec(w, v[kLn2W]), a.mean2.data(), a.rstd2.data(), dr,
                     vec_grad(g, v[kLn2W]), vec_grad(g, v[kLn2B]), bt, d);
  done(w, v[kLn2W]);
  wrote(g, v[kLn2W]);
  wrote(g, v[kLn2B]);
  // Attention: x2 = x + attn(ln1(x)) Wo^T + bo
  const void* dy_att = matmul_grad(dr, vec_grad(g, v[kProjB]), bt, d);
  wrote(g, v[kProjB]);
  linear_backward(dy_att, a.att.data(), w, lay.attn_proj_w, dsmall.data(), g, bt, d, d);
  attention_backward(a, B, T);
  const void* dy_qkv = matmul_grad(dqkv.data(), vec_grad(g, v[kQkvB]), bt, 3 * d);
  wrote(g, v[kQkvB]);
  linear_backward(dy_qkv, a.ln1.data(), w, lay.qkv_w, dsmall.data(), g, bt, 3 * d, d);
  layernorm_backward(dsmall.data(), x, vec(w, v[kLn1W]), a.mean1.data(), a.rstd1.data(), dr, vec_grad(g, v[kLn1W]),
                     vec_grad(g, v[kLn1B]), bt, d);
  done(w, v[kLn1W]);
  wrote(g, v[kLn1W]);
  wrote(g, v[kLn1B]);
  round_vec_grads(g, v);
}

// ---- Llama ----------------------------------------------------------------------

// The projection p [BT, d + 2 kvd] (fp32) -> attention's q, k, v [BT, 3d]: q and k rotated
// at their positions (rotate-half: channel i pairs with i + hd/2), then k and v repeated
// to the heads / kv_heads query heads that share them (Hugging Face's repeat_kv).
void Gpt::Impl::rope_expand(const float* p, TypedBuffer& qkv, int T, long bt) {
  const int d = s.d_model, hd = s.head_dim(), h2 = hd / 2, H = s.heads, rep = H / s.kv(), kvd = s.kv_dim();
  const int pw = d + 2 * kvd;
  rows_into(qkv, bt, 3 * d, [&](long r, float* o) {
    const float* c = rope_cos.data() + (r % T) * h2;
    const float* sn = rope_sin.data() + (r % T) * h2;
    const float* pr = p + r * pw;
    auto rotate = [&](const float* x, float* y) {
      for (int i = 0; i < h2; ++i) {
        y[i] = x[i] * c[i] - x[i + h2] * sn[i];
        y[i + h2] = x[i + h2] * c[i] + x[i] * sn[i];
      }
    };
    for (int h = 0; h < H; ++h) {
      rotate(pr + h * hd, o + h * hd);
      rotate(pr + d + (h / rep) * hd, o + d + h * hd);
      std::copy_n(pr + d + kvd + (h / rep) * hd, hd, o + 2 * d + h * hd);
    }
  });
}

// Backward of rope_expand: dqkv [BT, 3d] -> dp [BT, d + 2 kvd], q and k rotated back
// (the transpose), the repeated heads' k and v gradients summed into their kv head.
void Gpt::Impl::rope_reduce(const float* dqkv_full, float* dp, int T, long bt) {
  const int d = s.d_model, hd = s.head_dim(), h2 = hd / 2, H = s.heads, rep = H / s.kv(), kvd = s.kv_dim();
  const int pw = d + 2 * kvd;
  parallel_for(bt, 16, [&](long r) {
    const float* c = rope_cos.data() + (r % T) * h2;
    const float* sn = rope_sin.data() + (r % T) * h2;
    const float* g = dqkv_full + r * 3 * d;
    float* o = dp + r * pw;
    std::fill(o, o + pw, 0.0f);
    auto unrotate_add = [&](const float* x, float* y) {
      for (int i = 0; i < h2; ++i) {
        y[i] += x[i] * c[i] + x[i + h2] * sn[i];
        y[i + h2] += x[i + h2] * c[i] - x[i] * sn[i];
      }
    };
    for (int h = 0; h < H; ++h) {
      unrotate_add(g + h * hd, o + h * hd);
      unrotate_add(g + d + h * hd, o + d + (h / rep) * hd);
      detail::add_into(o + d + kvd + (h / rep) * hd, g + 2 * d + h * hd, hd);
    }
  });
}

// x [BT, d] -> a's activations; writes x + block(x) to out when out is not null.
//   h = x + o_proj(attention(rope(q), rope(k), v of input_layernorm(x)))
//   out = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
void Gpt::Impl::llama_block_forward(ParamView& w, const float* x, BlockActs& a, float* out, int B, int T) {
  const int d = s.d_model, ff = s.ffn_dim(), pw = d + 2 * s.kv_dim();
  const long bt = static_cast<long>(B) * T;
  rmsnorm(x, vec(w, llama_vecs[0]), a.ln1, a.rstd1.data(), bt, d);
  done(w, llama_vecs[0]);
  linear(a.ln1.data(), w, llay.qkv_w, nullptr, dqkv.data(), DType::F32, bt, pw, d);
  rope_expand(dqkv.data(), a.qkv, T, bt);
  attention_forward(a, B, T);
  float* x2 = a.x2.data();
  linear(a.att.data(), w, llay.o_w, nullptr, x2, DType::F32, bt, d, d);
  add_rows(x2, x, bt, d);
  rmsnorm(x2, vec(w, llama_vecs[1]), a.ln2, a.rstd2.data(), bt, d);
  done(w, llama_vecs[1]);
  linear(a.ln2.data(), w, llay.gate_up_w, nullptr, a.fc.data(), DType::F32, bt, 2 * ff, d);
  const float* gu = a.fc.data();
  rows_into(a.gel, bt, ff, [&](long r, float* o) { detail::swiglu_forward(gu + r * 2 * ff, o, 1, ff); });
  if (!out) return;
  linear(a.gel.data(), w, llay.down_w, nullptr, out, DType::F32, bt, d, ff);
  add_rows(out, x2, bt, d);
}

// dres: gradient of the block's output in, of its input out. g: the block's gradient.
void Gpt::Impl::llama_block_backward(ParamView& w, const float* x, BlockActs& a, GradView& g, int B, int T) {
  const int d = s.d_model, ff = s.ffn_dim(), pw = d + 2 * s.kv_dim();
  const long bt = static_cast<long>(B) * T;
  float* dr = dres.data();
  // MLP
  linear_backward(grad_operand(dr, bt, d), a.gel.data(), w, llay.down_w, dmid.data(), g, bt, d, ff);
  // SwiGLU's backward, the gradient of [gate, up] written as the matmuls read it: fp32
  // in dbig, or rounded once into dy.
  auto swiglu_grad = [&](long r, float* o) {
    detail::swiglu_backward(dmid.data() + r * ff, a.fc.data() + r * 2 * ff, o, 1, ff);
  };
  if (half)
    rows_into(dy, bt, 2 * ff, swiglu_grad);
  else
    for_row_chunks(bt, [&](long r0, long r1) {
      for (long r = r0; r < r1; ++r) swiglu_grad(r, dbig.data() + r * 2 * ff);
    });
  const void* dy_gu = half ? dy.data() : static_cast<const void*>(dbig.data());
  linear_backward(dy_gu, a.ln2.data(), w, llay.gate_up_w, dsmall.data(), g, bt, 2 * ff, d);
  rmsnorm_backward(dsmall.data(), a.x2.data(), vec(w, llama_vecs[1]), a.rstd2.data(), dr,
                   vec_grad(g, llama_vecs[1]), bt, d);
  done(w, llama_vecs[1]);
  wrote(g, llama_vecs[1]);
  // Attention
  linear_backward(grad_operand(dr, bt, d), a.att.data(), w, llay.o_w, dsmall.data(), g, bt, d, d);
  attention_backward(a, B, T);
  rope_reduce(dqkv.data(), dbig.data(), T, bt);
  linear_backward(grad_operand(dbig.data(), bt, pw), a.ln1.data(), w, llay.qkv_w, dsmall.data(), g, bt, pw, d);
  rmsnorm_backward(dsmall.data(), x, vec(w, llama_vecs[0]), a.rstd1.data(), dr, vec_grad(g, llama_vecs[0]), bt, d);
  done(w, llama_vecs[0]);
  wrote(g, llama_vecs[0]);
  round_vec_grads(g, llama_vecs);
}

}  // namespace strata
