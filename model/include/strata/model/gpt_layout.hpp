// The GPT's shape and parameter layout: which parameter groups exist, which tensors
// each holds at which offset, their GPT-2 names, initialisers and FLOP counts. No math
// here: the engine (groups), checkpoints and export (names, shapes), the planner and
// the sim backend (sizes, FLOPs) all read the same table, so they cannot disagree.
//
// Groups, in the order the model first acquires them:
//   0          "embeddings"  wte [vocab, d], wpe [seq_len, d]   (wte is also the output head)
//   1 .. L     "block.l"     ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
//   L + 1      "final"       ln_f
// Linear weights are stored [out, in], row-major (torch.nn.Linear's layout; y = x W^T + b).
// GPT-2 checkpoints store them [in, out] (Conv1D): `transposed_in_gpt2` says which.
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

struct GptShape {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int seq_len = 64;   // context length (wpe rows)
  int vocab = 256;
  int head_dim() const { return d_model / heads; }
  bool operator==(const GptShape&) const = default;
};

enum class GptInit { Normal, Zeros, Ones };

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

// Throws ConfigError when the shape cannot work (heads not dividing d_model, ...).
void validate(const GptShape& s);

std::vector<GptGroup> gpt_groups(const GptShape& s);
uint64_t gpt_param_count(const GptShape& s);

// Index of each group (see the table at the top).
inline int gpt_embeddings_group() { return 0; }
inline int gpt_block_group(int layer) { return 1 + layer; }
inline int gpt_final_group(const GptShape& s) { return s.layers + 1; }

// The order in which one forward + backward acquires groups:
//   0, 1..L, L+1, 0 (output head; forward and backward of the loss), L..1
// (the final layer norm's forward and backward both run while L+1 and 0 are held; the
// embedding backward needs no weights, only the gradient buffer of group 0).
std::vector<int> gpt_schedule(const GptShape& s);

// Model FLOPs of one token's forward + backward (3x forward), without recompute:
// 6 x (parameters used in matmuls, the tied head included) + causal attention
// 6 x layers x seq_len x d_model (QK^T and AV over the lower triangle, forward 2x,
// backward 4x). This is what MFU counts.
double gpt_flops_per_token(const GptShape& s);

}  // namespace strata
