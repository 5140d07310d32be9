#include "strata/model/gpt_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <type_traits>

#include "strata/core/error.hpp"

namespace strata {

uint64_t GptTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const char* arch_name(Arch a) { return a == Arch::Llama ? "llama" : "gpt2"; }

int GptShape::ffn_dim() const {
  if (ffn > 0) return ffn;
  if (arch == Arch::Gpt2) return 4 * d_model;
  // Meta's Llama rule: 2/3 of 4d, rounded up to a multiple of 256 (4096 -> 11008).
  const int64_t h = (8LL * d_model / 3 + 255) / 256 * 256;
  return static_cast<int>(std::min<int64_t>(h, 4LL * kMaxDModel));
}

std::string describe(const GptShape& s) {
  auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  std::string d = std::string(arch_name(s.arch)) + ": layers " + std::to_string(s.layers) + ", d_model " +
                  std::to_string(s.d_model) + ", heads " + std::to_string(s.heads);
  if (s.llama()) d += ", kv_heads " + std::to_string(s.kv()) + ", ffn " + std::to_string(s.ffn_dim());
  d += ", seq_len " + std::to_string(s.seq_len) + ", vocab " + std::to_string(s.vocab);
  if (s.llama())
    d += ", rope_theta " + num(s.rope_theta) + ", norm_eps " + num(s.norm_eps) + (s.tied_head ? ", tied head" : ", untied head");
  return d;
}

std::vector<ModelDifference> model_differences(const GptShape& a, const GptShape& b) {
  // The shortest text that reads back as x: 1e-05, not 1.0000000000000001e-05; and two
  // values that differ never print alike.
  auto num = [](double x) {
    char buf[32];
    for (int digits = 6; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, x);
      if (std::strtod(buf, nullptr) == x) break;
    }
    return std::string(buf);
  };
  std::vector<ModelDifference> out;
  auto field = [&](const char* name, auto x, auto y) {
    if (x == y) return;
    if constexpr (std::is_same_v<decltype(x), double>)
      out.push_back({name, num(x), num(y)});
    else
      out.push_back({name, std::to_string(x), std::to_string(y)});
  };
  if (a.arch != b.arch) out.push_back({"arch", arch_name(a.arch), arch_name(b.arch)});
  field("layers", a.layers, b.layers);
  field("d_model", a.d_model, b.d_model);
  field("heads", a.heads, b.heads);
  if (a.heads > 0 && b.heads > 0) field("head_dim", a.head_dim(), b.head_dim());
  if (a.llama() || b.llama()) field("kv_heads", a.kv(), b.kv());
  field("ffn", a.ffn_dim(), b.ffn_dim());
  field("vocab", a.vocab, b.vocab);
  if (!a.llama() || !b.llama()) field("seq_len", a.seq_len, b.seq_len);
  // GPT-2's LayerNorm has neither (validate keeps them at their defaults there).
  if (a.llama() || b.llama()) {
    field("rope_theta", a.rope_theta, b.rope_theta);
    field("norm_eps", a.norm_eps, b.norm_eps);
  }
  if (a.tied() != b.tied())
    out.push_back({"tied_head", a.tied() ? "true" : "false", b.tied() ? "true" : "false"});
  if (a.has_lora() || b.has_lora()) {
    auto targets = [](const GptShape& x) {
      std::string t;
      for (const std::string& n : lora_target_names(x.arch, x.lora.targets)) t += (t.empty() ? "" : ",") + n;
      return x.has_lora() ? "[" + t + "]" : std::string("none");
    };
    field("lora.rank", a.lora.rank, b.lora.rank);
    if (a.has_lora() && b.has_lora()) field("lora.alpha", a.lora.alpha, b.lora.alpha);
    if (targets(a) != targets(b)) out.push_back({"lora.target", targets(a), targets(b)});
  }
  return out;
}

LlamaBlockLayout llama_block_layout(const GptShape& s) {
  const uint64_t d = static_cast<uint64_t>(s.d_model), kvd = static_cast<uint64_t>(s.kv_dim()),
                 f = static_cast<uint64_t>(s.ffn_dim());
  LlamaBlockLayout b{};
  uint64_t o = 0;
  b.attn_norm = o; o += d;
  b.qkv_w = o; o += (d + 2 * kvd) * d;
  b.o_w = o; o += d * d;
  b.mlp_norm = o; o += d;
  b.gate_up_w = o; o += 2 * f * d;
  b.down_w = o; o += f * d;
  b.numel = o;
  return b;
}

void rope_tables(const GptShape& s, float* cos_out, float* sin_out) {
  const int h2 = s.head_dim() / 2;
  for (int i = 0; i < h2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(s.head_dim());
    const float inv = 1.0f / std::pow(static_cast<float>(s.rope_theta), e);
    for (int p = 0; p < s.seq_len; ++p) {
      const float a = static_cast<float>(p) * inv;
      cos_out[static_cast<size_t>(p) * h2 + i] = std::cos(a);
      sin_out[static_cast<size_t>(p) * h2 + i] = std::sin(a);
    }
  }
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

const std::vector<std::string>& lora_modules(Arch a) {
  static const std::vector<std::string> llama = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  static const std::vector<std::string> gpt2 = {"c_attn", "c_proj", "c_fc"};
  return a == Arch::Llama ? llama : gpt2;
}

std::vector<std::string> lora_target_names(Arch a, uint32_t targets) {
  std::vector<std::string> out;
  const auto& m = lora_modules(a);
  for (size_t i = 0; i < m.size(); ++i)
    if (targets & (1u << i)) out.push_back(m[i]);
  return out;
}

std::vector<LoraSite> lora_sites(const GptShape& s) {
  std::vector<LoraSite> out;
  if (!s.has_lora()) return out;
  const int d = s.d_model;
  // In the block's layout order: module, target bit, fused weight, first column, out, in.
  std::vector<LoraSite> all;
  if (s.llama()) {
    const LlamaBlockLayout b = llama_block_layout(s);
    const int kvd = s.kv_dim(), f = s.ffn_dim();
    all = {{"self_attn.q_proj", 0, b.qkv_w, 0, d, d},          {"self_attn.k_proj", 1, b.qkv_w, d, kvd, d},
           {"self_attn.v_proj", 2, b.qkv_w, d + kvd, kvd, d},  {"self_attn.o_proj", 3, b.o_w, 0, d, d},
           {"mlp.gate_proj", 4, b.gate_up_w, 0, f, d},         {"mlp.up_proj", 5, b.gate_up_w, f, f, d},
           {"mlp.down_proj", 6, b.down_w, 0, d, f}};
  } else {
    const GptBlockLayout b = gpt_block_layout(d);
    all = {{"attn.c_attn", 0, b.qkv_w, 0, 3 * d, d},
           {"attn.c_proj", 1, b.attn_proj_w, 0, d, d},
           {"mlp.c_fc", 2, b.fc_w, 0, 4 * d, d},
           {"mlp.c_proj", 1, b.mlp_proj_w, 0, d, 4 * d}};
  }
  const uint64_t r = static_cast<uint64_t>(s.lora.rank);
  uint64_t o = 0;
  for (LoraSite& x : all) {
    if (!(s.lora.targets & (1u << x.target))) continue;
    x.a = o; o += r * static_cast<uint64_t>(x.in);
    x.b = o; o += static_cast<uint64_t>(x.out) * r;
    out.push_back(x);
  }
  return out;
}

uint64_t lora_group_numel(const GptShape& s) {
  uint64_t n = 0;
  for (const LoraSite& x : lora_sites(s)) n += static_cast<uint64_t>(s.lora.rank) * (x.in + x.out);
  return n;
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
  need(s.d_model % s.heads == 0,
       "model d_model = " + std::to_string(s.d_model) + " is not divisible by heads = " + std::to_string(s.heads) +
           ": each head needs d_model / heads channels; change one so heads divides d_model");
  if (s.arch == Arch::Gpt2) {
    // Llama's keys at other values than their defaults would be accepted and ignored.
    const GptShape plain;
    auto gpt2_fixed = [&](bool same, const std::string& what) {
      need(same, "model " + what + " applies to arch \"llama\" only; GPT-2 has " +
                     "none (remove it, or set arch to \"llama\")");
    };
    gpt2_fixed(s.kv_heads == 0 || s.kv_heads == s.heads, "kv_heads = " + std::to_string(s.kv_heads));
    gpt2_fixed(s.ffn == 0 || s.ffn == 4 * s.d_model, "ffn = " + std::to_string(s.ffn));
    gpt2_fixed(s.rope_theta == plain.rope_theta, "rope_theta");
    gpt2_fixed(s.norm_eps == plain.norm_eps, "norm_eps");
    gpt2_fixed(!s.tied_head, "tied_head (GPT-2's head is always tied)");
  } else {
    need(s.kv_heads >= 0 && s.kv() <= s.heads && s.heads % s.kv() == 0,
         "model kv_heads = " + std::to_string(s.kv_heads) + " does not divide heads = " + std::to_string(s.heads) +
             ": each key/value head serves heads / kv_heads query heads; give a divisor of heads (heads itself "
             "for plain multi-head attention)");
    need(s.head_dim() % 2 == 0, "model d_model / heads = " + std::to_string(s.head_dim()) +
                                    " is odd: rotary embeddings rotate pairs of channels; give an even head size");
    need(s.ffn >= 0 && s.ffn <= 4 * kMaxDModel, "model ffn = " + std::to_string(s.ffn) + " must be between 1 and " +
                                                   std::to_string(4 * kMaxDModel) + " (or 0 for Meta's rule)");
    need(std::isfinite(s.rope_theta) && s.rope_theta > 1, "model rope_theta must be a finite number above 1");
    need(std::isfinite(s.norm_eps) && s.norm_eps > 0 && s.norm_eps < 1,
         "model norm_eps must be a number between 0 and 1 (exclusive)");
  }
  if (s.lora.rank != 0 || s.lora.targets != 0) {
    const auto& mods = lora_modules(s.arch);
    need(s.lora.rank >= 1 && s.lora.rank <= 65536,
         "lora rank = " + std::to_string(s.lora.rank) + " must be between 1 and 65536");
    need(std::isfinite(s.lora.alpha) && s.lora.alpha > 0, "lora alpha must be a finite number above 0");
    need(s.lora.targets != 0 && s.lora.targets < (1u << mods.size()),
         std::string("lora targets name no linear of a ") + arch_name(s.arch) + " block");
  }
  // Within those limits the count fits easily in a double and a uint64_t.
  const double d = s.d_model, kvd = double(s.kv()) * s.head_dim(), f = s.ffn_dim();
  const double block = s.llama() ? d * (d + 2 * kvd) + d * d + 3 * d * f + 2 * d : 12 * d * d + 13 * d;
  const double ends = s.llama() ? double(s.vocab) * d * (s.tied_head ? 1 : 2) + d : (double(s.vocab) + s.seq_len) * d + 2 * d;
  const double params = double(s.layers) * block + ends;
  if (params > kMaxParams) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "model of %.3g parameters is more than Strata's limit of %.3g", params, kMaxParams);
    need(false, std::string(buf) + ": give fewer layers or a smaller d_model");
  }
}

namespace {

std::vector<GptGroup> llama_groups(const GptShape& s) {
  const int64_t d = s.d_model, V = s.vocab, T = s.seq_len, kvd = s.kv_dim(), f = s.ffn_dim();
  const double head_flops = 2.0 * static_cast<double>(V) * static_cast<double>(d);
  std::vector<GptGroup> groups;
  GptGroup emb{"embeddings", static_cast<uint64_t>(V * d), s.tied_head ? head_flops : 0.0, {}};
  emb.tensors.push_back({"model.embed_tokens.weight", 0, 0, {V, d}, GptInit::Normal, false});
  groups.push_back(std::move(emb));

  const LlamaBlockLayout b = llama_block_layout(s);
  const uint64_t ud = static_cast<uint64_t>(d), ukv = static_cast<uint64_t>(kvd), uf = static_cast<uint64_t>(f);
  for (int l = 0; l < s.layers; ++l) {
    const int g = gpt_block_group(l);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    GptGroup blk{"block." + std::to_string(l), b.numel, 0, {}};
    blk.tensors = {
        {p + "input_layernorm.weight", g, b.attn_norm, {d}, GptInit::Ones, false},
        {p + "self_attn.q_proj.weight", g, b.qkv_w, {d, d}, GptInit::Normal, false},
        {p + "self_attn.k_proj.weight", g, b.qkv_w + ud * ud, {kvd, d}, GptInit::Normal, false},
        {p + "self_attn.v_proj.weight", g, b.qkv_w + (ud + ukv) * ud, {kvd, d}, GptInit::Normal, false},
        {p + "self_attn.o_proj.weight", g, b.o_w, {d, d}, GptInit::Normal, false},
        {p + "post_attention_layernorm.weight", g, b.mlp_norm, {d}, GptInit::Ones, false},
        {p + "mlp.gate_proj.weight", g, b.gate_up_w, {f, d}, GptInit::Normal, false},
        {p + "mlp.up_proj.weight", g, b.gate_up_w + uf * ud, {f, d}, GptInit::Normal, false},
        {p + "mlp.down_proj.weight", g, b.down_w, {d, f}, GptInit::Normal, false},
    };
    const double dd = static_cast<double>(d);
    blk.forward_flops_per_token = 2.0 * (dd * (dd + 2.0 * static_cast<double>(kvd)) + dd * dd + 3.0 * dd * static_cast<double>(f)) +
                                  2.0 * static_cast<double>(T) * dd;
    groups.push_back(std::move(blk));
  }

  const int gf = gpt_final_group(s);
  GptGroup fin{"final", static_cast<uint64_t>(d), 0, {}};
  fin.tensors = {{"model.norm.weight", gf, 0, {d}, GptInit::Ones, false}};
  if (!s.tied_head) {
    fin.tensors.push_back({"lm_head.weight", gf, ud, {V, d}, GptInit::Normal, false});
    fin.numel += static_cast<uint64_t>(V * d);
    fin.forward_flops_per_token = head_flops;
  }
  groups.push_back(std::move(fin));
  return groups;
}

// Block l's adapter group: A and B of each adapted linear, named as peft names them
// without its "base_model.model." prefix (GPT-2's also without "transformer.").
GptGroup lora_group(const GptShape& s, int l) {
  const int64_t r = s.lora.rank;
  const int g = gpt_lora_group(s, l);
  const std::string p = (s.llama() ? "model.layers." : "h.") + std::to_string(l) + ".";
  GptGroup grp{"lora." + std::to_string(l), lora_group_numel(s), 0, {}};
  for (const LoraSite& x : lora_sites(s)) {
    grp.tensors.push_back({p + x.module + ".lora_A.weight", g, x.a, {r, x.in}, GptInit::KaimingUniform, false});
    grp.tensors.push_back({p + x.module + ".lora_B.weight", g, x.b, {x.out, r}, GptInit::Zeros, false});
    grp.forward_flops_per_token += 2.0 * static_cast<double>(r) * (x.in + x.out);
  }
  return grp;
}

std::vector<GptGroup> gpt_base_groups(const GptShape& s);

}  // namespace

std::vector<GptGroup> gpt_groups(const GptShape& s) {
  std::vector<GptGroup> groups = gpt_base_groups(s);
  for (int l = 0; s.has_lora() && l < s.layers; ++l) groups.push_back(lora_group(s, l));
  return groups;
}

namespace {

std::vector<GptGroup> gpt_base_groups(const GptShape& s) {
  validate(s);
  if (s.llama()) return llama_groups(s);
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

}  // namespace

uint64_t gpt_param_count(const GptShape& s) {
  uint64_t n = 0;
  for (const auto& g : gpt_groups(s)) n += g.numel;
  return n;
}

std::vector<int> gpt_schedule(const GptShape& s) {
  std::vector<int> order;
  auto block = [&](int l) {
    order.push_back(gpt_block_group(l));
    if (s.has_lora()) order.push_back(gpt_lora_group(s, l));
  };
  order.push_back(gpt_embeddings_group());
  for (int l = 0; l < s.layers; ++l) block(l);
  order.push_back(gpt_final_group(s));
  if (s.tied()) order.push_back(gpt_embeddings_group());
  for (int l = s.layers - 1; l >= 0; --l) block(l);
  return order;
}

std::vector<std::vector<uint64_t>> gpt_parts(const GptShape& s, uint64_t bucket_elems, int tile_factor,
                                              uint64_t tile_size) {
  if (bucket_elems == 0)
    throw ConfigError("zero_optimization.stage3_prefetch_bucket_size = 0: it bounds each gather (and the look-ahead), "
                      "so 0 leaves nothing to gather; give at least 1 (one tensor or tile per gather; DeepSpeed's "
                      "default is 50000000)");
  if (tile_factor < 1)
    throw ConfigError("strata.tile_factor = " + std::to_string(tile_factor) +
                      " must be at least 1 (1: linears untiled)");
  const std::vector<GptGroup> groups = gpt_groups(s);
  if (tile_factor > 1) {
    uint64_t common = 0;  // gcd of every linear's rows
    std::string bad;
    for (const GptGroup& g : groups) {
      if (g.name.rfind("block.", 0) != 0) continue;
      for (const GptTensor& t : g.tensors) {
        if (t.shape.size() != 2) continue;
        const uint64_t rows = static_cast<uint64_t>(t.shape[0]);
        common = std::gcd(common, rows);
        if (bad.empty() && rows % static_cast<uint64_t>(tile_factor) != 0)
          bad = t.name + " has " + std::to_string(rows) + " output rows";
      }
      break;  // every block has the same layout
    }
    if (!bad.empty()) {
      std::string ok;
      int listed = 0;
      for (uint64_t k = 1; k <= common && listed < 8; ++k)
        if (common % k == 0) ok += (listed++ ? ", " : "") + std::to_string(k);
      throw ConfigError("strata.tile_factor = " + std::to_string(tile_factor) + " does not divide every linear: " + bad +
                        ", and each tile is a whole number of output rows; give one of " + ok +
                        (listed == 8 ? ", ..." : "") + " (divisors of " + std::to_string(common) +
                        "; the smallest workable value is 1, no tiling)");
    }
  }
  // Tiles of each linear: tile_factor, or the fewest above it (dividing its rows) whose
  // tiles hold at most tile_size elements. Every block has the same layout: counted once
  // per tensor offset, not once per block and pass.
  std::map<uint64_t, uint64_t> tiles_at;
  auto count_tiles = [&](const GptTensor& t) -> uint64_t {
    if (t.shape.size() != 2) return 1;
    const uint64_t rows = static_cast<uint64_t>(t.shape[0]), cols = static_cast<uint64_t>(t.shape[1]);
    uint64_t d = static_cast<uint64_t>(tile_factor);
    if (tile_size == 0) return d;
    for (; d <= rows; ++d)
      if (rows % d == 0 && rows / d * cols <= tile_size) return d;
    uint64_t widest = 0;  // one row per tile is the least: the longest row of any linear
    for (const GptGroup& g : groups)
      if (g.name.rfind("block.", 0) == 0)
        for (const GptTensor& u : g.tensors)
          if (u.shape.size() == 2) widest = std::max(widest, static_cast<uint64_t>(u.shape[1]));
    throw ConfigError("strata.tile_size = " + std::to_string(tile_size) + " is smaller than one output row of " +
                      t.name + " (" + std::to_string(cols) + " elements), and a tile holds whole rows; give at least " +
                      std::to_string(widest) + " (one row of the widest linear), or 0 for no size limit");
  };
  auto tiles_of = [&](const GptTensor& t) -> uint64_t {
    auto [it, fresh] = tiles_at.try_emplace(t.offset, 0);
    if (fresh) it->second = count_tiles(t);
    return it->second;
  };
  std::vector<std::vector<uint64_t>> parts;
  for (const GptGroup& g : groups) {
    std::vector<uint64_t> begins{0};
    const bool block = g.name.rfind("block.", 0) == 0;
    bool tiled = false;
    if (block)
      for (const GptTensor& t : g.tensors) tiled = tiled || tiles_of(t) > 1;
    if (!block || (g.numel <= bucket_elems && !tiled)) {
      parts.push_back(std::move(begins));
      continue;
    }
    std::vector<const GptTensor*> ts;
    for (const GptTensor& t : g.tensors) ts.push_back(&t);
    std::sort(ts.begin(), ts.end(), [](const GptTensor* a, const GptTensor* b) { return a->offset < b->offset; });
    uint64_t open = 0;  // elements in the part being filled
    auto cut = [&](uint64_t at) {
      if (at > begins.back()) begins.push_back(at);
      open = 0;
    };
    for (const GptTensor* t : ts) {
      const uint64_t n = t->numel();
      if (const uint64_t tiles = tiles_of(*t); tiles > 1) {
        cut(t->offset);
        const uint64_t tile = n / tiles;
        for (uint64_t k = 1; k < tiles; ++k) cut(t->offset + tile * k);
        cut(t->offset + n);
        continue;
      }
      if (open > 0 && open + n > bucket_elems) cut(t->offset);
      open += n;
      if (open >= bucket_elems) cut(t->offset + n);
    }
    if (begins.back() == g.numel) begins.pop_back();
    parts.push_back(std::move(begins));
  }
  return parts;
}

double gpt_flops_per_token(const GptShape& s) {
  double f = 0;
  for (const auto& g : gpt_groups(s)) f += g.forward_flops_per_token;
  return 3.0 * f;
}

}  // namespace strata
