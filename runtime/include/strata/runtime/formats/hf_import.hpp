// `strata import --hf DIR --out CKPT`: a Hugging Face model directory read into a Strata
// checkpoint that `strata train --init-from CKPT` fine-tunes (weights only, a fresh
// optimizer) and `--resume-from` continues.
//
// Reads config.json and model.safetensors, or the shards model.safetensors.index.json
// lists; tensors in F32, BF16 or F16. Architectures: GPT2LMHeadModel (model_type "gpt2";
// names with or without the "transformer." prefix, Conv1D weights [in, out] transposed to
// Strata's [out, in], the tied lm_head and the attention-mask buffers skipped). A config
// this GPT cannot compute as Hugging Face does (another GELU, layer-norm epsilon, an
// untied head, another MLP width) is refused naming the key. Every safetensors header is
// checked (runtime/safetensors.hpp) and every tensor's shape against config.json before
// a byte of it is used. The checkpoint is written one parameter group at a time
// (InitialCheckpointWriter), so memory holds one group, not the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/value_checks.hpp"
#include "strata/model/gpt_layout.hpp"

namespace strata {

struct ImportSummary {
  std::string checkpoint;      // the step-00000000 directory written
  std::string architecture;    // "GPT2LMHeadModel"
  GptShape shape;
  std::string precision;       // recorded in the checkpoint: what training resumes in by default
  uint64_t parameters = 0;
  int tensors = 0;             // read
  int files = 0;               // safetensors files read
  uint64_t bytes_read = 0;     // tensor bytes this rank read from them
  uint64_t bytes_read_all = 0; // ... and all ranks together
  std::vector<std::string> files_read;  // the safetensors files, in the order opened
  struct Read {
    int file = 0;              // index into files_read
    uint64_t offset = 0, bytes = 0;
  };
  std::vector<Read> reads;     // every read this rank made, in order
};

// `precision`: the checkpoint's recorded precision; default: the tensors' (BF16 -> bf16,
// F16 -> fp16, else f32). Throws ConfigError (unsupported architecture, a missing file or
// tensor, a shape that disagrees with config.json, --out holding checkpoints) or
// CorruptionError (a damaged safetensors file), leaving no checkpoint behind.
//
// With a host communicator of several ranks (strata import under mpirun) it is collective:
// every rank reads the headers, and of the tensors only the byte ranges of its own shard of
// each group (ceil(numel / ranks) elements; GPT-2's transposed weights one run per file
// row), and writes its rank file of the checkpoint. No rank ever holds more than one
// group's shard; the ranks' reads are disjoint and together cover every tensor once.
//
// Every weight read is checked: a NaN or inf is a ConfigError naming the tensor (as the
// file names it) and its flat index in the file, and no checkpoint is written. With a
// 16-bit precision, a weight beyond its range (fp16: 65504, where a bf16 or f32 weight
// may lie) would be inf in training: refused the same way, naming the largest magnitude
// and the limit, or with out_of_range Clamp (`--clamp`) stored as the largest finite value
// of its sign.
ImportSummary import_hf(const std::string& hf_dir, const std::string& out, std::optional<DType> precision = {},
                        coll::Communicator* host = nullptr, OutOfRange out_of_range = OutOfRange::Refuse);

}  // namespace strata
