// Strategy's description and validation, and the activation bytes a strategy keeps
// (plan.hpp), apart from the planner.
#include <algorithm>
#include <sstream>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/plan/plan.hpp"

namespace strata::plan {

std::string Strategy::describe() const {
  std::ostringstream os;
  os << "stage " << stage;
  if (stage == 3) os << ", params " << to_string(offload_param);
  os << ", optimizer " << to_string(offload_optimizer) << ", micro-batch " << micro_batch;
  if (grad_accum > 1) os << " x " << grad_accum << " accumulated";
  os << (checkpointing ? ", checkpointing" : ", no checkpointing");
  if (precision != DType::F32) os << ", " << precision_name(precision);
  if (speculative) os << ", speculative";
  if (optimizer_ratio < 1.0) os << ", optimizer ratio " << optimizer_ratio;
  if (checkpointing && checkpoints != OffloadDevice::None) os << ", checkpoints on " << to_string(checkpoints);
  if (part_elems > 0) os << ", gathers of at most " << part_elems << " elements";
  if (tile_factor > 1) os << ", tile factor " << tile_factor;
  if (tile_size > 0) os << ", tiles of at most " << tile_size << " elements";
  if (stage == 3 && prefetch_groups != Strategy{}.prefetch_groups) os << ", look-ahead " << prefetch_groups;
  if (frozen_fraction > 0) os << ", " << frozen_fraction << " frozen";
  if (mics_shard_size > 0) os << ", MiCS " << mics_shard_size;
  if (hpz > 1) os << ", hpZ " << hpz;
  if (qwz) os << ", qwZ";
  if (qgz) os << ", qgZ";
  if ((qwz || qgz) && quantized_block != Strategy{}.quantized_block) os << " (blocks of " << quantized_block << ")";
  return os.str();
}

void validate(const Strategy& s) {
  if (s.stage < 1 || s.stage > 3)
    throw ConfigError("--stage " + std::to_string(s.stage) + " is not a ZeRO stage; give 1, 2 or 3");
  if (s.stage < 3 && s.offload_param != OffloadDevice::None)
    throw ConfigError("--offload-param " + std::string(to_string(s.offload_param)) + " needs --stage 3 (stages 1 and 2 "
                      "keep every parameter on the device); give --stage 3 or --offload-param none");
  if (s.micro_batch < 1) throw ConfigError("--micro-batch must be at least 1, not " + std::to_string(s.micro_batch));
  if (s.seq_len < 0) throw ConfigError("--seq must be positive (or 0 for the model's), not " + std::to_string(s.seq_len));
  if (s.grad_accum < 1) throw ConfigError("--grad-accum must be at least 1, not " + std::to_string(s.grad_accum));
  if (s.prefetch_groups < 0) throw ConfigError("--prefetch-groups must be 0 or more");
  if (s.tile_factor < 1) throw ConfigError("--tile-factor must be at least 1 (1: untiled), not " + std::to_string(s.tile_factor));
  if (s.parted() && s.stage != 3)
    throw ConfigError("--tile-factor, --tile-size and --bucket-elems cut stage 3's gathers; stages 1 and 2 gather nothing: give "
                      "--stage 3, or drop them");
  if (!(s.frozen_fraction >= 0.0 && s.frozen_fraction <= 1.0))
    throw ConfigError("--frozen-fraction must lie in [0, 1] (the fraction of the parameters that is not trained, "
                      "0.99 for a LoRA-like run), not " + std::to_string(s.frozen_fraction));
  if (s.mics_shard_size < 0 || s.hpz < 1)
    throw ConfigError("--mics-shard-size must be 0 (off) or a number of ranks, and --hpz 1 (off) or a number of ranks");
  if (s.mics_shard_size > 0 && s.hpz > 1)
    throw ConfigError("--mics-shard-size and --hpz are two ways to keep collectives inside a node, and Strata runs one "
                      "at a time: drop one of them");
  if (s.hpz > 1 && s.stage != 3)
    throw ConfigError("--hpz " + std::to_string(s.hpz) + " partitions stage 3's parameters: give --stage 3, or drop --hpz");
  if (s.qwz && s.stage != 3)
    throw ConfigError("--quantized-weights quantizes stage 3's parameter gathers: give --stage 3, or drop "
                      "--quantized-weights");
  if (s.qgz && s.stage == 1)
    throw ConfigError("--quantized-gradients quantizes the reduce-scatters of stages 2 and 3, and stage 1 all-reduces "
                      "its gradient once a step: give --stage 2 or 3, or drop --quantized-gradients");
  if (s.qgz && s.mics_shard_size > 0)
    throw ConfigError("--quantized-gradients quantizes a reduce-scatter over every rank, and --mics-shard-size reduces "
                      "within groups then all-reduces across them: drop one of them");
  if (s.quantized_block < 16 || s.quantized_block > (1 << 20))
    throw ConfigError("--quantized-block must lie in [16, 1048576] elements, not " + std::to_string(s.quantized_block));
  if (!s.checkpointing && s.checkpoints != OffloadDevice::None)
    throw ConfigError("--cpu-checkpointing moves the checkpoints of activation checkpointing, and "
                      "--no-checkpointing turns it off: drop one of the two");
}

double activation_bytes(const GptShape& s, int micro_batch, bool checkpointing, DType precision) {
  // Per token of the micro-batch. A block saves for backward: ln_1's input and output,
  // q, k, v, the attention output, the residual, ln_2's output, the MLP's input to GELU
  // and its output (4d each), and per head the softmax statistics: 16 d + 2 heads values.
  // In 16 bits the ones that feed matmuls (ln_1 and ln_2 outputs, q, k, v, the attention
  // output, GELU's output: 10 d) are 16-bit, the rest fp32 (docs/mixed-precision.md).
  // Attention is computed block-wise (no [seq, seq] scores) and the head in row chunks
  // (no full logits), as the cpu model does (model/gpt.hpp).
  // Llama's block saves the block input, the residual after attention, gate and up (2 ffn)
  // and two RMSNorm statistics in fp32, and the norms' outputs, q, k and v repeated to
  // every head, the attention output and SwiGLU's output (6 d + ffn) in the model's type.
  const double T = double(micro_batch) * s.seq_len;
  const double d = s.d_model, f = s.ffn_dim();
  const double e = double(dtype_size(precision));
  const double block = s.llama() ? ((2 * d + 2 * f + 2.0 + s.heads) * 4 + (6 * d + f) * e) * T
                                 : ((6 * d + 2.0 * s.heads) * 4 + 10 * d * e) * T;
  // Embedding output, final norm in and out; with checkpointing the first two are the
  // engine's checkpoints 0 and L.
  const double boundary = (checkpointing ? 1 : 3) * d * 4 * T;
  const double logits_chunk = std::min<double>(T, 1024) * s.vocab * 4 * 2;  // a chunk and its gradient
  const double blocks = checkpointing ? block : s.layers * block;
  // Backward keeps one block's activation gradients alive on top (about 4 d per token).
  return blocks + boundary + logits_chunk + 4 * d * 4 * T;
}

double checkpoint_bytes(const GptShape& s, int micro_batch) {
  return double(micro_batch) * s.seq_len * s.d_model * sizeof(float);
}

}  // namespace strata::plan
