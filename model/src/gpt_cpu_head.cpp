// The cpu GPT's ends (gpt_cpu.hpp): the embeddings and their gradient, and the head: the
// final norm, the logits and the cross-entropy loss with its backward, or the last
// position's logits alone.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gemm_cpu.hpp"
#include "gpt_cpu.hpp"
#include "kernels_cpu.hpp"
#include "parallel.hpp"
#include "strata/core/math/gpt.hpp"

namespace strata {

using detail::for_row_chunks;
using detail::GemmOutput;
using detail::layernorm_backward;
using detail::MatRef;
using detail::parallel_for;
using detail::rmsnorm_backward;

// wte as the head's matmuls read it: as stored, or converted to fp32 once per head when
// matmuls of type t convert (rather than once per chunk and matmul).
MatRef Gpt::Impl::head_weights(const void* wte) {
  if (detail::gemm_native(t)) return {wte, t, s.d_model};
  for_row_chunks(s.vocab, [&](long r0, long r1) {
    convert_to_f32(wte32.data() + r0 * s.d_model, at(wte, r0 * s.d_model), t, (r1 - r0) * s.d_model);
  });
  return {wte32.data(), DType::F32, s.d_model};
}

void Gpt::Impl::last_logits(const void* wf, const void* wte, int len, float* out) {
  const int d = s.d_model;
  const float* x = resid[s.layers] + static_cast<long>(len - 1) * d;
  const void* hw = head_of(wf, wte);
  float mean, rstd;
  float* row = half ? dsmall.data() : lnf.f32();
  if (llama)
    math::rmsnorm_row(x, vec(wf, llama_final[0]), row, d, static_cast<float>(s.norm_eps), &rstd);
  else
    math::layernorm_row(x, vec(wf, final_vecs[0]), vec(wf, final_vecs[1]), row, d, &mean, &rstd);
  if (!half) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, s.vocab, d, 1.0f, static_cast<const float*>(hw), d, row, 1, 0.0f, out,
                1);
    return;
  }
  convert_from_f32(lnf.data(), t, row, d);
  gemm.run(1, s.vocab, d, {lnf.data(), t, d}, head_weights(hw).transposed(), nullptr, out, DType::F32, s.vocab,
           GemmOutput::Overwrite);
}

void Gpt::Impl::embed(const void* w, int B, int T) {
  const int32_t* tok = inputs;
  const int d = s.d_model;
  float* x = resid[0];
  if (llama) {  // x = wte[token]: no positions (they are rotary, in attention)
    parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
      convert_to_f32(x + r * d, at(w, static_cast<uint64_t>(tok[r]) * d), t, d);
    });
    return;
  }
  if (!half) {
    const auto* wte = static_cast<const float*>(w);
    const float* wpe = wte + static_cast<long>(s.vocab) * d;
    parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
      const int t = static_cast<int>(r % T);
      const float* e = wte + static_cast<long>(tok[r]) * d;
      const float* p = wpe + static_cast<long>(t) * d;
      for (int c = 0; c < d; ++c) x[r * d + c] = e[c] + p[c];
    });
    return;
  }
  // x = float(wte[token]) + float(wpe[t]), in fp32.
  const long wpe0 = static_cast<long>(s.vocab) * d;
  parallel_for(static_cast<long>(B) * T, 64, [&](long r) {
    convert_to_f32(x + r * d, at(w, static_cast<uint64_t>(tok[r]) * d), t, d);
    accumulate_f32(x + r * d, at(w, wpe0 + (r % T) * d), t, d);
  });
}

// Final layer norm, tied head and mean cross-entropy over rows [0, bt). With dwte, also
// backward: dwte (overwritten; in 16 bits, through dembed until embed_backward) gets the
// head's gradient and dres the final residual's.
// An untied head (Llama's lm_head) is in the final group: its gradient goes to dlnf's,
// and dwte_group is null.
// With LoRA (frozen) backward gives dres alone: no weight gradient is computed.
double Gpt::Impl::head(const void* wf, const void* wte, long bt, void* dwte_group, void* dlnf, float loss_scale,
                       bool backward) {
  STRATA_CHECK(!backward || frozen || dlnf, "head: a backward needs the final group's gradient unless the base is frozen");
  const int d = s.d_model, V = s.vocab;
  const float* xf = resid[s.layers];
  const float* lnf_w = vec(wf, llama ? llama_final[0] : final_vecs[0]);
  if (llama)
    rmsnorm(xf, lnf_w, lnf, rstdf.data(), bt, d);
  else
    layernorm(xf, lnf_w, vec(wf, final_vecs[1]), lnf, meanf.data(), rstdf.data(), bt, d);
  const MatRef w = head_weights(head_of(wf, wte));
  void* dhead_group = s.tied() ? dwte_group : dlnf ? at(dlnf, d) : nullptr;
  float* dwte = !dhead_group ? nullptr : half ? dembed.data() : static_cast<float*>(dhead_group);
  double loss = 0;
  const float inv_n = loss_scale / static_cast<float>(bt);  // the gradient's scale
  float* dl = dsmall.data();  // gradient of lnf's output
  for (long r0 = 0; r0 < bt; r0 += chunk_rows) {
    const long nr = std::min(chunk_rows, bt - r0);
    float* lg = logits.data();
    gemm.run(nr, V, d, {lnf.at(r0, d), t, d}, w.transposed(), nullptr, lg, DType::F32, V, GemmOutput::Overwrite);
    std::vector<double> row_loss(nr);
    parallel_for(nr, 16, [&](long i) {
      float* z = lg + i * V;
      const int tgt = targets[r0 + i];
      const float zt = z[tgt];
      const float mx = detail::max_of(z, V);
      // z becomes exp(z - max); the loss is log(sum) - (z_t - max).
      const double sum = detail::exp_shifted(z, z, V, mx);
      row_loss[i] = std::log(sum) - static_cast<double>(zt - mx);
      if (backward) {
        detail::scale_into(z, static_cast<float>(inv_n / sum), V);
        z[tgt] -= inv_n;
        if (half) convert_from_f32(dy.at(i, V), t, z, V);  // dlogits, rounded for both matmuls
      }
    });
    for (double v : row_loss) loss += v;
    if (!backward) continue;
    const MatRef dlogits = half ? MatRef{dy.data(), t, V} : MatRef{lg, DType::F32, V};
    gemm.run(nr, d, V, dlogits, w, nullptr, dl + r0 * d, DType::F32, d, GemmOutput::Overwrite);
    if (dwte)
      gemm.run(V, d, nr, dlogits.transposed(), {lnf.at(r0, d), t, d}, nullptr, dwte, DType::F32, d,
               r0 == 0 ? GemmOutput::Overwrite : GemmOutput::Accumulate);
  }
  if (backward && !dlnf) {  // frozen: the final residual's gradient only (the norm's own is dropped)
    std::fill(dres.begin(), dres.begin() + bt * d, 0.0f);
    float* dw = frozen_vec_grads.data();
    if (llama)
      rmsnorm_backward(dl, xf, lnf_w, rstdf.data(), dres.data(), dw, bt, d);
    else
      layernorm_backward(dl, xf, lnf_w, meanf.data(), rstdf.data(), dres.data(), dw, dw + d, bt, d);
  } else if (backward) {
    std::fill(dres.begin(), dres.begin() + bt * d, 0.0f);
    if (llama) {
      rmsnorm_backward(dl, xf, lnf_w, rstdf.data(), dres.data(), vec_grad(dlnf, llama_final[0]), bt, d);
      round_vec_grads(dlnf, llama_final);
    } else {
      layernorm_backward(dl, xf, lnf_w, meanf.data(), rstdf.data(), dres.data(), vec_grad(dlnf, final_vecs[0]),
                         vec_grad(dlnf, final_vecs[1]), bt, d);
      round_vec_grads(dlnf, final_vecs);
    }
    if (half && !s.tied())  // lm_head's gradient is complete: rounded into the final group
      for_row_chunks(V, [&](long r0, long r1) {
        convert_from_f32(at(dhead_group, r0 * d), t, dembed.data() + r0 * d, (r1 - r0) * d);
      });
  }
  return loss / static_cast<double>(bt);
}

// Adds the embedding lookup's gradient to the head's in wte's part of g0 (dembed in 16
// bits) and writes wpe's part; in 16 bits, g0 is then rounded once from dembed.
void Gpt::Impl::embed_backward(void* g0, int B, int T) {
  const int32_t* tok = inputs;
  const int d = s.d_model;
  float* dwte = half ? dembed.data() : static_cast<float*>(g0);
  if (!s.tied()) std::fill(dwte, dwte + static_cast<long>(s.vocab) * d, 0.0f);  // no head gradient to add to
  float* dwpe = llama ? nullptr : dwte + static_cast<long>(s.vocab) * d;
  if (dwpe) std::fill(dwpe, dwpe + static_cast<long>(s.seq_len) * d, 0.0f);
  const float* dr = dres.data();
  // Rows with the same token add into one wte row: each thread owns a range of channels.
  constexpr int kCols = 64;
  parallel_for((d + kCols - 1) / kCols, 1, [&](long cb) {
    const int c0 = static_cast<int>(cb) * kCols, c1 = std::min(d, c0 + kCols);
    for (long r = 0; r < static_cast<long>(B) * T; ++r) {
      const float* v = dr + r * d;
      float* e = dwte + static_cast<long>(tok[r]) * d;
      for (int c = c0; c < c1; ++c) e[c] += v[c];
      if (!dwpe) continue;
      float* p = dwpe + (r % T) * d;
      for (int c = c0; c < c1; ++c) p[c] += v[c];
    }
  });
  if (!half) return;
  for_row_chunks(s.vocab + (llama ? 0 : s.seq_len), [&](long r0, long r1) {
    convert_from_f32(at(g0, r0 * d), t, dembed.data() + r0 * d, (r1 - r0) * d);
  });
}

}  // namespace strata
