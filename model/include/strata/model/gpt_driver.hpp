// The order in which a GPT asks its WeightSource for each group, computes with it and
// hands it back: one copy for every backend (gpt_cpu.hpp's Gpt::Impl on the cpu, gpt_cuda.cpp's
// GptCuda::Impl on cuda) and for the simulator (runtime's SimGpt, whose kernels only take
// the planner's times on the sim backend), so the sequence the engine sees is the one the
// cpu tests check and the one the plan's simulation times. Public for that reason: the
// runtime drives its timing-only model through these same templates.
//
// An implementation M provides, all over its own activation buffers:
//   void load_tokens(const int32_t* inputs, const int32_t* targets, long n)  // host arrays; targets may be null
// (parameter and gradient buffers are the WeightSource's, of its dtype(), untyped here)
//   void embed(const void* w, int B, int T)                  // residual[0] from the loaded inputs
//   void block_forward(int l, ParamView& w, bool keep_output, int B, int T)
//   double head(const void* wf, const void* wte, long bt, void* dwte, void* dlnf, float loss_scale, bool backward)
//                                             // loss; with backward, the final residual's gradient
//                                             // (of loss x loss_scale) and, when dlnf, the weights';
//                                             // wte and dwte null for an untied head (in wf)
//   void bind_adapters(const void* a, void* ga) // LoRA: block l's adapter group (and its gradient, in
//                                             // backward) for the block calls that follow; null: none
//   void block_backward(int l, ParamView& w, GradView& grad, int B, int T)
//   void embed_backward(void* g0, int B, int T)
//   void last_logits(const void* wf, const void* wte, int len, float* host_out)
//   void release(WeightSource&, int g)   // done reading group g's parameters (cuda: with an event
//                                        // of the kernels still reading them, release_params_after)
//   void ready(WeightSource&, int g)     // group g's gradient is written (cuda: grads_ready_after)
//   void release(ParamView&)             // a block's: every part still held (cuda: each with an event;
//                                        // with a checkpoint store, after a synchronisation)
//   void ready(GradView&)                // a block's: every part not yet handed back (cuda: with events)
// A block's parameters and gradient go through group_view.hpp's views, so that a source
// that gathers it in parts (per tensor, tiles) hands each part out and back on its own.
//   void bind_resid(int i, float* p)     // checkpoint i (block i's input; i = L: the final
//                                        // residual) is at p from now on: the store's buffer
// With a checkpoint store (GptOptions::checkpoints_from_source) the driver binds each
// checkpoint to the store's buffer before the model touches it and hands it back after
// release() (which synchronises the model's work on cuda when there is a store).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/model/gpt.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/model/weight_source.hpp"
#include "strata/model/group_view.hpp"

namespace strata::detail {

inline void check_tokens(const int32_t* t, long n, int vocab, const char* what) {
  for (long i = 0; i < n; ++i)
    if (t[i] < 0 || t[i] >= vocab)
      throw Error(std::string(what) + " token " + std::to_string(t[i]) + " at position " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// The model computes in o.precision and reads and writes buffers of that type: the
// WeightSource must hand out the same.
inline void check_precision(const WeightSource& ws, const GptOptions& o) {
  if (ws.dtype() != o.precision)
    throw Error(std::string("the model was built for ") + to_string(o.precision) + " weights but its weight source holds " +
                to_string(ws.dtype()) + "; build the model with GptOptions::precision = the source's dtype()");
}

// The embeddings, the final group and LoRA's adapter groups are read through one
// pointer: whole (one part).
inline void check_whole_ends(const WeightSource& ws, const GptShape& s) {
  std::vector<int> whole = {gpt_embeddings_group(), gpt_final_group(s)};
  for (int l = 0; s.has_lora() && l < s.layers; ++l) whole.push_back(gpt_lora_group(s, l));
  for (int g : whole)
    if (ws.num_parts(g) != 1)
      throw Error("the weight source gathers group " + std::to_string(g) + " in " + std::to_string(ws.num_parts(g)) +
                  " parts; the model reads the embeddings, the final group and the adapters whole (only blocks may "
                  "have parts)");
}

inline void check_checkpoint_options(const GptOptions& o) {
  if (o.checkpoints_from_source && o.checkpointing == ActivationCheckpointing::None)
    throw ConfigError("GptOptions::checkpoints_from_source needs activation checkpointing (PerBlock): without it "
                      "the model keeps every block's activations itself");
}

// The source's checkpoint store when the model takes its checkpoints from it, else null;
// the model's options and the source must agree, and the store must fit the model.
inline ActivationStore* checkpoint_store(WeightSource& ws, const GptShape& s, const GptOptions& o) {
  ActivationStore* cp = ws.activation_store();
  if (!o.checkpoints_from_source) {
    if (cp)
      throw Error("the weight source holds the activation checkpoints but the model keeps its own; build the model "
                  "with GptOptions::checkpoints_from_source (and activation checkpointing)");
    return nullptr;
  }
  if (!cp)
    throw Error("the model takes its activation checkpoints from its weight source "
                "(GptOptions::checkpoints_from_source), and this source holds none");
  const uint64_t need = static_cast<uint64_t>(o.micro_batch) * s.seq_len * s.d_model * sizeof(float);
  if (cp->count() != s.layers + 1 || cp->bytes() < need)
    throw Error("the weight source's checkpoint store holds " + std::to_string(cp->count()) + " checkpoints of " +
                std::to_string(cp->bytes()) + " bytes; this model needs " + std::to_string(s.layers + 1) + " of " +
                std::to_string(need) + " (layers + 1, micro_batch x seq_len x d_model fp32)");
  return cp;
}

// Embeddings and every block forward, each group acquired just before use and released
// after. With a checkpoint store, each block's input goes back to it once the block has
// read it (kept for backward when keep; dead otherwise); the final residual stays bound.
template <class M>
void gpt_forward_blocks(M& m, WeightSource& ws, const GptShape& s, ActivationStore* cp, bool keep, int B, int T) {
  const int ge = gpt_embeddings_group();
  if (cp) m.bind_resid(0, static_cast<float*>(cp->begin_write(0)));
  m.embed(ws.acquire_params(ge), B, T);
  m.release(ws, ge);
  for (int l = 0; l < s.layers; ++l) {
    const int g = gpt_block_group(l);
    if (cp) m.bind_resid(l + 1, static_cast<float*>(cp->begin_write(l + 1)));
    ParamView w(ws, g);
    const int lg = s.has_lora() ? gpt_lora_group(s, l) : -1;
    m.bind_adapters(lg >= 0 ? ws.acquire_params(lg) : nullptr, nullptr);
    m.block_forward(l, w, true, B, T);
    m.release(w);
    if (lg >= 0) m.release(ws, lg);
    m.bind_adapters(nullptr, nullptr);
    if (cp) cp->end_forward(l, keep);
  }
}

// Checks and loads a micro-batch of tokens, then runs the embeddings and every block
// forward. Returns the rows, micro_batch x seq_len.
template <class M>
long gpt_forward_batch(M& m, WeightSource& ws, const GptShape& s, const GptOptions& o, const int32_t* inputs,
                       const int32_t* targets, ActivationStore* cp, bool keep) {
  check_precision(ws, o);
  const long bt = static_cast<long>(o.micro_batch) * s.seq_len;
  check_tokens(inputs, bt, s.vocab, "input");
  check_tokens(targets, bt, s.vocab, "target");
  check_whole_ends(ws, s);
  m.load_tokens(inputs, targets, bt);
  gpt_forward_blocks(m, ws, s, cp, keep, o.micro_batch, s.seq_len);
  return bt;
}

// Acquires 0, 1..L, L+1, 0, then L..1 (gpt_schedule); hands in L+1, L..1, then 0, whose
// gradient buffer is held from the head (tied weights) to the embedding backward. An
// untied head is in L+1: group 0 is not acquired for it, and its gradient buffer is asked
// for at the embedding backward. With LoRA the base is frozen (no gradient buffer of group
// 0, L+1 or any block is asked for; the embedding backward does not run): each block's
// adapter group is acquired after the block, and its gradient handed in after the block's
// backward.
template <class M>
double gpt_forward_backward(M& m, WeightSource& ws, const GptShape& s, const GptOptions& o, const int32_t* inputs,
                            const int32_t* targets, float loss_scale) {
  ActivationStore* cp = checkpoint_store(ws, s, o);
  const long bt = gpt_forward_batch(m, ws, s, o, inputs, targets, cp, true);
  const int B = o.micro_batch, T = s.seq_len;
  const int ge = gpt_embeddings_group(), gf = gpt_final_group(s);
  const bool tied = s.tied(), frozen = s.has_lora();
  const void* wf = ws.acquire_params(gf);
  const void* wte = tied ? ws.acquire_params(ge) : nullptr;
  void* g0 = tied && !frozen ? ws.gradient_buffer(ge) : nullptr;  // held until the embedding backward at the end
  void* gfin = frozen ? nullptr : ws.gradient_buffer(gf);
  const double loss = m.head(wf, wte, bt, g0, gfin, loss_scale, true);
  if (tied) m.release(ws, ge);
  m.release(ws, gf);
  if (cp) cp->end_forward(s.layers, false);
  if (!frozen) m.ready(ws, gf);
  for (int l = s.layers - 1; l >= 0; --l) {
    const int g = gpt_block_group(l);
    if (cp) m.bind_resid(l, static_cast<float*>(const_cast<void*>(cp->read(l))));
    ParamView w(ws, g);
    const int lg = frozen ? gpt_lora_group(s, l) : -1;
    const void* la = frozen ? ws.acquire_params(lg) : nullptr;
    m.bind_adapters(la, nullptr);
    if (o.checkpointing != ActivationCheckpointing::None) {
      m.block_forward(l, w, false, B, T);  // recompute
      w.restart();
    }
    GradView grad(ws, g);  // unused when frozen: no element of it is asked for
    if (frozen) m.bind_adapters(la, ws.gradient_buffer(lg));
    m.block_backward(l, w, grad, B, T);
    m.release(w);
    if (frozen) {
      m.release(ws, lg);
      m.bind_adapters(nullptr, nullptr);
    }
    if (cp) cp->finish(l);
    if (frozen)
      m.ready(ws, lg);
    else
      m.ready(grad);
  }
  if (frozen) return loss;
  m.embed_backward(tied ? g0 : ws.gradient_buffer(ge), B, T);
  m.ready(ws, ge);
  return loss;
}

template <class M>
double gpt_forward_loss(M& m, WeightSource& ws, const GptShape& s, const GptOptions& o, const int32_t* inputs,
                        const int32_t* targets) {
  ActivationStore* cp = checkpoint_store(ws, s, o);
  const long bt = gpt_forward_batch(m, ws, s, o, inputs, targets, cp, false);
  const int ge = gpt_embeddings_group(), gf = gpt_final_group(s);
  const void* wf = ws.acquire_params(gf);
  const void* wte = s.tied() ? ws.acquire_params(ge) : nullptr;
  const double loss = m.head(wf, wte, bt, nullptr, nullptr, 1.0f, false);
  if (s.tied()) m.release(ws, ge);
  m.release(ws, gf);
  if (cp) cp->end_forward(s.layers, false);
  return loss;
}

template <class M>
void gpt_next_token_logits(M& m, WeightSource& ws, const GptShape& s, const GptOptions& o, const int32_t* tokens, int len,
                           float* out) {
  if (len < 1 || len > s.seq_len)
    throw Error("next_token_logits: " + std::to_string(len) + " tokens; the context holds 1 to " +
                std::to_string(s.seq_len));
  check_tokens(tokens, len, s.vocab, "input");
  check_precision(ws, o);
  ActivationStore* cp = checkpoint_store(ws, s, o);
  check_whole_ends(ws, s);
  m.load_tokens(tokens, nullptr, len);
  const int ge = gpt_embeddings_group(), gf = gpt_final_group(s);
  gpt_forward_blocks(m, ws, s, cp, false, 1, len);
  const void* wf = ws.acquire_params(gf);
  const void* wte = s.tied() ? ws.acquire_params(ge) : nullptr;
  m.last_logits(wf, wte, len, out);
  if (s.tied()) m.release(ws, ge);
  m.release(ws, gf);
  if (cp) cp->end_forward(s.layers, false);
}

}  // namespace strata::detail
