// The decoder's shape and parameter layout: which parameter groups exist, which tensors
// each holds at which offset, their names, initialisers and FLOP counts (and Llama's
// rotary tables, which both backends share). No other math here: the engine (groups),
// checkpoints and export (names, shapes), the planner and the sim backend (sizes, FLOPs)
// all read the same table, so they cannot disagree.
//
// Two architectures share the driver, the groups and the schedule (GptShape::arch):
//  - GPT-2: learned positions, pre-LayerNorm blocks with biases, GELU MLP of 4d, tied head.
//  - Llama: rotary positions (Hugging Face's rotate-half, rope_theta), RMSNorm, no biases,
//    grouped-query attention (kv_heads), SwiGLU MLP of `ffn`, tied or untied head.
//
// Groups, in the order the model first acquires them:
//   0          "embeddings"  GPT-2: wte [vocab, d], wpe [seq_len, d]   Llama: embed_tokens [vocab, d]
//                            (with a tied head, wte / embed_tokens is also the output head)
//   1 .. L     "block.l"     GPT-2: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
//                            Llama: input_layernorm, q/k/v_proj, o_proj, post_attention_layernorm,
//                                   gate_proj, up_proj, down_proj
//   L + 1      "final"       GPT-2: ln_f   Llama: norm, and lm_head [vocab, d] when untied
//   L + 2 + l  "lora.l"      with LoRA (GptShape::lora, strata.lora) only: block l's adapters,
//                            A [rank, in] and B [out, rank] per adapted linear (peft's layout)
// Linear weights are stored [out, in], row-major (torch.nn.Linear's layout; y = x W^T + b).
// GPT-2 checkpoints store them [in, out] (Conv1D): `transposed_in_gpt2` says which. Names
// are GPT-2's (without "transformer.") and Hugging Face Llama's (with "model.").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// The largest shape Strata accepts, in a config and in `strata plan` alike: far beyond
// any model trained (GPT-3 175B: 96 layers, d_model 12288), and small enough that every
// size below is computed without overflow and no table of layers is absurd.
inline constexpr int kMaxLayers = 16384;
inline constexpr int kMaxDModel = 1 << 20;   // 1,048,576
inline constexpr int kMaxSeqLen = 1 << 24;   // 16,777,216
inline constexpr int kMaxVocab = 1 << 24;    // 16,777,216 (token files: uint16 or uint32 ids)
inline constexpr double kMaxParams = 1e15;   // 30 times `strata plan`'s gpt-32t

enum class Arch { Gpt2 = 0, Llama = 1 };
const char* arch_name(Arch a);  // "gpt2", "llama"

// LoRA (strata.lora; peft's LoraConfig): each adapted linear of every block gains
// y += (alpha / rank) (x A^T) B^T, A [rank, in], B [out, rank]; the base model is frozen
// and only the adapters train (their own groups, "lora.l"). The targets are peft's module
// names (lora_modules): Llama's q_proj, k_proj, v_proj (rows of the one fused q/k/v
// matmul here), o_proj, gate_proj, up_proj (rows of the fused gate/up matmul), down_proj;
// GPT-2's c_attn (the whole fused q/k/v), c_proj (both attn.c_proj and mlp.c_proj, as
// peft matches it) and c_fc.
struct LoraSpec {
  int rank = 0;          // 0: no adapters
  double alpha = 0;      // the scale is alpha / rank
  uint32_t targets = 0;  // bit i: lora_modules(arch)[i]
  double scale() const { return rank > 0 ? alpha / rank : 0.0; }
  bool operator==(const LoraSpec&) const = default;
};

struct GptShape {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int seq_len = 64;   // context length (GPT-2: wpe rows)
  int vocab = 256;
  Arch arch = Arch::Gpt2;
  // Llama only (validate refuses other values for GPT-2):
  int kv_heads = 0;            // key/value heads, dividing heads (grouped-query attention); 0: heads
  int ffn = 0;                 // MLP width; 0: GPT-2's 4d, Llama's 256-multiple of 8d/3 (Meta's rule)
  double rope_theta = 10000;   // rotary base (Hugging Face's rope_theta)
  double norm_eps = 1e-5;      // RMSNorm's epsilon (rms_norm_eps); GPT-2's LayerNorm has 1e-5
  bool tied_head = false;      // Llama: lm_head is embed_tokens (tie_word_embeddings); GPT-2: always
  LoraSpec lora;               // adapters on a frozen base (rank 0: none, the whole model trains)

  int head_dim() const { return d_model / heads; }
  int kv() const { return kv_heads > 0 ? kv_heads : heads; }  // key/value heads
  int kv_dim() const { return kv() * head_dim(); }             // channels of k (and of v)
  int ffn_dim() const;                                         // the MLP's width, ffn resolved
  bool llama() const { return arch == Arch::Llama; }
  bool tied() const { return arch == Arch::Gpt2 || tied_head; }
  bool has_lora() const { return lora.rank > 0; }
  bool operator==(const GptShape&) const = default;
};

// "gpt2: layers 4, d_model 128, heads 4, seq_len 64, vocab 256" (Llama's keys added): for
// messages that say which model something holds.
std::string describe(const GptShape& s);

// A field in which two models differ, named as strata.model names it (head_dim: d_model /
// heads), with the value in each.
struct ModelDifference {
  std::string field;
  std::string first, second;  // the value in a and in b
};

// The one rule by which a checkpoint's model is the model a run computes (resume,
// --init-from; runtime/formats/export.hpp: check_checkpoint_model): every field that
// changes the function, each resolved (kv_heads 0 is heads, ffn 0 its default), in this
// order: arch, layers, d_model, heads, head_dim, kv_heads, ffn, vocab, seq_len, rope_theta,
// norm_eps, tied_head. seq_len counts for GPT-2 only, whose wpe has a row per position:
// Llama's rotary positions hold no weights, so another context computes the same function
// on the positions both have. Empty: the same model.
std::vector<ModelDifference> model_differences(const GptShape& a, const GptShape& b);

// KaimingUniform: peft's LoRA A, torch's kaiming_uniform_(a = sqrt(5)): uniform in
// +-1 / sqrt(in) (the runtime writes it: lora_init_values).
enum class GptInit { Normal, Zeros, Ones, KaimingUniform };

struct GptTensor {
  std::string name;             // GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  int group = 0;
  uint64_t offset = 0;          // elements into the group's flat buffer
  std::vector<int64_t> shape;   // as stored here ([out, in] for linear weights)
  GptInit init = GptInit::Normal;
  bool transposed_in_gpt2 = false;  // GPT-2 (Conv1D) stores this weight [in, out]
  uint64_t numel() const;
};

struct GptGroup {
  std::string name;             // "embeddings", "block.3", "final"
  uint64_t numel = 0;           // elements
  double forward_flops_per_token = 0;  // matmul FLOPs of this group's forward, per token
  std::vector<GptTensor> tensors;
};

// Offsets inside one block's group, in elements (every block has the same layout).
struct GptBlockLayout {
  uint64_t ln1_w, ln1_b;        // [d]
  uint64_t qkv_w, qkv_b;        // [3d, d], [3d]   rows: q (d), k (d), v (d); heads contiguous
  uint64_t attn_proj_w, attn_proj_b;  // [d, d], [d]
  uint64_t ln2_w, ln2_b;        // [d]
  uint64_t fc_w, fc_b;          // [4d, d], [4d]
  uint64_t mlp_proj_w, mlp_proj_b;    // [d, 4d], [d]
  uint64_t numel;
};
GptBlockLayout gpt_block_layout(int d_model);

// The same for a Llama block. q, k and v are one [d + 2 kv_dim, d] matrix (one matmul),
// gate and up one [2 ffn, d]; the names split them as Hugging Face has them.
struct LlamaBlockLayout {
  uint64_t attn_norm;           // [d]
  uint64_t qkv_w;               // [d + 2 kvd, d]   rows: q (d), k (kvd), v (kvd); heads contiguous
  uint64_t o_w;                 // [d, d]
  uint64_t mlp_norm;            // [d]
  uint64_t gate_up_w;           // [2 ffn, d]       rows: gate (ffn), up (ffn)
  uint64_t down_w;              // [d, ffn]
  uint64_t numel;
};
LlamaBlockLayout llama_block_layout(const GptShape& s);

// Llama's rotary tables as Hugging Face's LlamaRotaryEmbedding computes them, in fp32:
// inv_freq[i] = 1 / theta^(2i / hd), the angle at position p is p inv_freq[i] (one fp32
// product); cos and sin [seq_len, hd / 2] of it (both backends' models use these).
void rope_tables(const GptShape& s, float* cos_out, float* sin_out);

// peft's target names an architecture's blocks offer, in bit order (LoraSpec::targets).
const std::vector<std::string>& lora_modules(Arch a);
// "q_proj, v_proj": the targets of a mask, for messages and adapter_config.json.
std::vector<std::string> lora_target_names(Arch a, uint32_t targets);

// One adapted linear of a block: where its base weight is, which of the fused matmul's
// output columns it adapts, and where its A and B lie in the block's adapter group.
struct LoraSite {
  std::string module;   // Hugging Face's path inside a block: "self_attn.q_proj", "attn.c_attn"
  int target = 0;       // its bit in LoraSpec::targets
  uint64_t weight = 0;  // offset of the (fused) base weight in the block group
  int col0 = 0;         // first output column of the fused matmul this adapter adds to
  int out = 0, in = 0;  // its output and input width
  uint64_t a = 0, b = 0;  // offsets in the adapter group: A [rank, in], B [out, rank]
};
// The adapted linears of a block in the adapter group's order (empty without LoRA).
std::vector<LoraSite> lora_sites(const GptShape& s);
uint64_t lora_group_numel(const GptShape& s);

// Throws ConfigError when the shape cannot work (heads not dividing d_model, ...).
void validate(const GptShape& s);

std::vector<GptGroup> gpt_groups(const GptShape& s);
uint64_t gpt_param_count(const GptShape& s);

// Index of each group (see the table at the top).
inline int gpt_embeddings_group() { return 0; }
inline int gpt_block_group(int layer) { return 1 + layer; }
inline int gpt_final_group(const GptShape& s) { return s.layers + 1; }
inline int gpt_lora_group(const GptShape& s, int layer) { return s.layers + 2 + layer; }

// The order in which one forward + backward acquires groups:
//   0, 1..L, L+1, 0 (tied output head; forward and backward of the loss), L..1
// (with LoRA, each block's adapter group right after the block, both ways)
// (the final norm's forward and backward both run while L+1 and 0 are held; the
// embedding backward needs no weights, only the gradient buffer of group 0). An untied
// head is in L+1: 0, 1..L, L+1, L..1.
std::vector<int> gpt_schedule(const GptShape& s);

// How the engine gathers each group: in parts, contiguous element ranges that it gathers,
// releases and reduce-scatters one at a time (WeightSource::num_parts), so the device
// holds a few of a block's tensors rather than the whole block. The embeddings and the
// final group are one part each. A block is one part while it holds at most
// bucket_elems elements and tile_factor is 1; otherwise its tensors, in layout order,
// are coalesced into parts of at most bucket_elems (a larger tensor is a part of its
// own), and with tile_factor > 1 every linear weight is cut into tile_factor tiles of
// whole output rows (DeepSpeed's TiledLinear out_splits), each a part. tile_size > 0
// (strata.tile_size) tiles by size instead, or as well: a linear with more than tile_size
// elements is cut into the fewest tiles (at least tile_factor, a divisor of its rows) of
// at most tile_size elements each; smaller linears keep tile_factor. Returns, per
// group, the first element of each part (0 first; a part ends where the next begins).
// Throws ConfigError naming the key for bucket_elems 0, a tile factor below 1, one
// that does not divide every linear's rows (the message lists the workable ones), or a
// tile_size below one row of a linear (the message gives the smallest workable value).
std::vector<std::vector<uint64_t>> gpt_parts(const GptShape& s, uint64_t bucket_elems, int tile_factor,
                                             uint64_t tile_size = 0);

// Model FLOPs of one token's forward + backward (3x forward), without recompute:
// 6 x (parameters used in matmuls, the head included) + causal attention
// 6 x layers x seq_len x d_model (QK^T and AV over the lower triangle, forward 2x,
// backward 4x). This is what MFU counts.
double gpt_flops_per_token(const GptShape& s);

}  // namespace strata
