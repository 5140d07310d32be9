// `strata export`: a checkpoint's fp32 master weights consolidated into one safetensors
// file with GPT-2's tensor names and layout, for PyTorch / Hugging Face and others, or
// (export_hf) into a Hugging Face model directory.
//
// The file (https://github.com/huggingface/safetensors, "Format"): 8 bytes, the header's
// length N as a little-endian uint64; N bytes of JSON, padded with spaces so the data
// start 8-byte aligned; then the tensors' bytes, row-major, little-endian, back to back.
// The JSON maps each name to {"dtype": "F32", "shape": [...], "data_offsets": [begin,
// end]} (relative to the data's start) and "__metadata__" to string values: "format":
// "pt", "strata_step", "strata_shape" (the GptShape as JSON) and "strata_config" (the
// run's configuration as JSON).
//
// Names and shapes are GPT-2's (Hugging Face GPT2Model's state dict): wte.weight
// [vocab, d], wpe.weight [seq_len, d], h.<l>.ln_1.weight, h.<l>.attn.c_attn.weight
// [d, 3d], ..., ln_f.bias. Linear weights are written in GPT-2's Conv1D layout [in, out]
// (transposed from Strata's [out, in]). The output head is tied to wte, as in GPT-2, and
// not written.
//
// The file is written under a temporary name in the same directory, fsync'd and renamed
// into place: a failed export leaves no partial file, and an existing file is replaced
// only when asked (overwrite), atomically.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "strata/core/value_checks.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/runtime/formats/checkpoint.hpp"

namespace strata {

struct ExportSummary {
  std::string checkpoint;   // the step-<N> directory read
  std::string out;          // the file written
  int64_t step = 0;
  DType dtype = DType::F32; // of the tensors written
  GptShape shape;
  int tensors = 0;
  uint64_t parameters = 0;  // elements written
  uint64_t bytes = 0;       // size of the file(s)
  int files = 1;            // safetensors files written
};

// The GPT shape of a checkpoint written by `strata train`: from its configuration
// (strata.model), checked against its parameter groups. Throws ConfigError when the
// checkpoint is not of a GPT (e.g. another model's groups) or its config is unreadable.
GptShape checkpoint_gpt_shape(const CheckpointInfo& info);
// The rule by which a run takes a checkpoint's model as its own, one for --resume,
// --resume-from and --init-from (sample, eval and export compute the model the checkpoint
// holds, read by checkpoint_gpt_shape above): model_differences (model/gpt_layout.hpp)
// between the checkpoint's strata.model and `here` must be empty; the same parameter
// counts are not enough (heads, rope_theta, norm_eps change what the weights compute).
// Otherwise a ConfigError that begins with `flag` ("--resume"), names every field that
// differs with both values, and says to set strata.model to the checkpoint's. A
// checkpoint whose config has no strata.model was saved by a run of the default model.
void check_checkpoint_model(const CheckpointInfo& info, const GptShape& here, const std::string& flag);
// GPT-2's shape of a tensor as its checkpoints store it: Conv1D weights [in, out].
std::vector<int64_t> gpt2_shape(const GptTensor& t);

// checkpoint: a step-<N> directory, or a checkpoint_dir (its latest complete
// checkpoint is used). Throws ConfigError (bad arguments, `out` exists and overwrite is
// false, not a GPT checkpoint), CorruptionError (damaged checkpoint), IoError (writing).
// dtype: F32, BF16 or F16 tensors (the fp32 master weights, rounded to nearest even);
// nullopt: the precision the run trained in. A weight beyond dtype's range (fp16: 65504)
// is a ConfigError naming the tensor, its largest magnitude and the limit, and nothing is
// written; out_of_range Clamp (`--clamp`) writes the largest finite value of its sign
// instead. A NaN or inf weight is refused (read_checkpoint_group).
ExportSummary export_safetensors(const std::string& checkpoint, const std::string& out, bool overwrite,
                                 std::optional<DType> dtype = std::nullopt,
                                 OutOfRange out_of_range = OutOfRange::Refuse);

// `strata export --format hf`: a Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory
// that `transformers` loads with from_pretrained(out) and hf_import.hpp reads back:
// config.json, and model.safetensors, or above shard_bytes model-0000i-of-0000n.safetensors
// with model.safetensors.index.json (save_pretrained's names: "transformer." + GPT-2's,
// Llama's as they are; a tensor is never split). `out` must not exist, or be an empty directory, or with
// overwrite an earlier export (only config.json, model*.safetensors and the index in it);
// it is written as a temporary directory beside it and renamed into place. dtype and
// out_of_range as for export_safetensors.
ExportSummary export_hf(const std::string& checkpoint, const std::string& out, bool overwrite,
                        std::optional<DType> dtype = std::nullopt, uint64_t shard_bytes = 5'000'000'000ull,
                        OutOfRange out_of_range = OutOfRange::Refuse);

// `strata export --format peft`: a LoRA checkpoint's adapters as peft saves them, which
// PeftModel.from_pretrained(base, out) loads: adapter_model.safetensors (peft's names,
// e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight [r, in]) and
// adapter_config.json (r, lora_alpha, target_modules; formats/peft.hpp). `out` as for
// export_hf. A checkpoint without adapters is a ConfigError. (`--format hf` of a LoRA
// checkpoint writes the base with the adapters merged: W + alpha / r B A.)
ExportSummary export_peft(const std::string& checkpoint, const std::string& out, bool overwrite,
                          std::optional<DType> dtype = std::nullopt);

}  // namespace strata
