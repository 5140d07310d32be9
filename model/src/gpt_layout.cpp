#include "strata/model/gpt_layout.hpp"

#include <cstdio>

#include "strata/core/error.hpp"

namespace strata {

uint64_t GptTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

GptBlockLayout gpt_block_layout(int d_model) {
  const uint64_t d = static_cast<uint64_t>(d_model);
  GptBlockLayout b{};
  uint64_t o = 0;
  b.ln1_w = o; o += d;
  b.ln1_b = o; o += d;
  b.qkv_w = o; o += 3 * d * d;
  b.qkv_b = o; o += 3 * d;
  b.attn_proj_w = o; o += d * d;
  b.attn_proj_b = o; o += d;
  b.ln2_w = o; o += d;
  b.ln2_b = o; o += d;
  b.fc_w = o; o += 4 * d * d;
  b.fc_b = o; o += 4 * d;
  b.mlp_proj_w = o; o += 4 * d * d;
  b.mlp_proj_b = o; o += d;
  b.numel = o;
  return b;
}

void validate(const GptShape& s) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw ConfigError(what);
  };
  need(s.layers >= 1, "model layers = " + std::to_string(s.layers) + " must be at least 1");
  need(s.d_model >= 1, "model d_model = " + std::to_string(s.d_model) + " must be at least 1");
  need(s.heads >= 1, "model heads = " + std::to_string(s.heads) + " must be at least 1");
  need(s.seq_len >= 1, "model seq_len = " + std::to_string(s.seq_len) + " must be at least 1");
  need(s.vocab >= 2, "model vocab = " + std::to_string(s.vocab) + " must be at least 2");
  auto at_most = [&](int v, int max, const char* name) {
    need(v <= max, std::string("model ") + name + " = " + std::to_string(v) + " is more than Strata's limit of " +
                       std::to_string(max) + ": give a smaller " + name);
  };
  at_most(s.layers, kMaxLayers, "layers");
  at_most(s.d_model, kMaxDModel, "d_model");
  at_most(s.seq_len, kMaxSeqLen, "seq_len");
  at_most(s.vocab, kMaxVocab, "vocab");
  // Within those limits the count fits easily in a double and a uint64_t.
  const double d = s.d_model, params = double(s.layers) * (12 * d * d + 13 * d) + (double(s.vocab) + s.seq_len) * d + 2 * d;
  if (params > kMaxParams) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "model of %.3g parameters is more than Strata's limit of %.3g", params, kMaxParams);
    need(false, std::string(buf) + ": give fewer layers or a smaller d_model");
  }
  need(s.d_model % s.heads == 0,
       "model d_model = " + std::to_string(s.d_model) + " is not divisible by heads = " + std::to_string(s.heads) +
           ": each head needs d_model / heads channels; change one so heads divides d_model");
}

std::vector<GptGroup> gpt_groups(const GptShape& s) {
  validate(s);
  const int64_t d = s.d_model, V = s.vocab, T = s.seq_len;
  std::vector<GptGroup> groups;

  GptGroup emb{"embeddings", 0, 0, {}};
  emb.tensors.push_back({"wte.weight", 0, 0, {V, d}, GptInit::Normal, false});
  emb.tensors.push_back({"wpe.weight", 0, static_cast<uint64_t>(V * d), {T, d}, GptInit::Normal, false});
  emb.numel = static_cast<uint64_t>((V + T) * d);
  // The tied output head's matmul runs while this group is held a second time.
  emb.forward_flops_per_token = 2.0 * static_cast<double>(V) * static_cast<double>(d);
  groups.push_back(std::move(emb));

  const GptBlockLayout b = gpt_block_layout(s.d_model);
  for (int l = 0; l < s.layers; ++l) {
    const int g = gpt_block_group(l);
    const std::string p = "h." + std::to_string(l) + ".";
    GptGroup blk{"block." + std::to_string(l), b.numel, 0, {}};
    blk.tensors = {
        {p + "ln_1.weight", g, b.ln1_w, {d}, GptInit::Ones, false},
        {p + "ln_1.bias", g, b.ln1_b, {d}, GptInit::Zeros, false},
        {p + "attn.c_attn.weight", g, b.qkv_w, {3 * d, d}, GptInit::Normal, true},
        {p + "attn.c_attn.bias", g, b.qkv_b, {3 * d}, GptInit::Zeros, false},
        {p + "attn.c_proj.weight", g, b.attn_proj_w, {d, d}, GptInit::Normal, true},
        {p + "attn.c_proj.bias", g, b.attn_proj_b, {d}, GptInit::Zeros, false},
        {p + "ln_2.weight", g, b.ln2_w, {d}, GptInit::Ones, false},
        {p + "ln_2.bias", g, b.ln2_b, {d}, GptInit::Zeros, false},
        {p + "mlp.c_fc.weight", g, b.fc_w, {4 * d, d}, GptInit::Normal, true},
        {p + "mlp.c_fc.bias", g, b.fc_b, {4 * d}, GptInit::Zeros, false},
        {p + "mlp.c_proj.weight", g, b.mlp_proj_w, {d, 4 * d}, GptInit::Normal, true},
        {p + "mlp.c_proj.bias", g, b.mlp_proj_b, {d}, GptInit::Zeros, false},
    };
    // qkv 3d^2 + proj d^2 + fc 4d^2 + proj 4d^2 = 12 d^2 multiply-adds, plus causal
    // attention (QK^T and AV over the lower triangle: ~T d each, per token).
    const double dd = static_cast<double>(d);
    blk.forward_flops_per_token = 2.0 * 12.0 * dd * dd + 2.0 * static_cast<double>(T) * dd;
    groups.push_back(std::move(blk));
  }

  const int gf = gpt_final_group(s);
  GptGroup fin{"final", static_cast<uint64_t>(2 * d), 0, {}};
  fin.tensors = {{"ln_f.weight", gf, 0, {d}, GptInit::Ones, false},
                 {"ln_f.bias", gf, static_cast<uint64_t>(d), {d}, GptInit::Zeros, false}};
  groups.push_back(std::move(fin));
  return groups;
}

uint64_t gpt_param_count(const GptShape& s) {
  uint64_t n = 0;
  for (const auto& g : gpt_groups(s)) n += g.numel;
  return n;
}

std::vector<int> gpt_schedule(const GptShape& s) {
  std::vector<int> order;
  order.push_back(gpt_embeddings_group());
  for (int l = 0; l < s.layers; ++l) order.push_back(gpt_block_group(l));
  order.push_back(gpt_final_group(s));
  order.push_back(gpt_embeddings_group());
  for (int l = s.layers - 1; l >= 0; --l) order.push_back(gpt_block_group(l));
  return order;
}

double gpt_flops_per_token(const GptShape& s) {
  double f = 0;
  for (const auto& g : gpt_groups(s)) f += g.forward_flops_per_token;
  return 3.0 * f;
}

}  // namespace strata
