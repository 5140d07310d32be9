// LoRA adapters in peft's files, and at the start of a run (strata.lora; the math is the
// model's, model/gpt_layout.hpp's LoraSpec and LoraSite).
//
// A new run's adapter group "lora.l" starts as peft's default initialisation (A uniform
// in +-1/sqrt(in), torch's kaiming_uniform_(a = sqrt(5)); B zero: the model starts as its
// base), drawn from strata.seed, or from a peft adapter directory (`--lora-init DIR`,
// strata.lora.init): adapter_config.json, whose r, lora_alpha and target_modules must be
// strata.lora's, and adapter_model.safetensors, whose tensors are peft's
// (base_model.model.model.layers.<l>.self_attn.q_proj.lora_A.weight [r, in], lora_B [out, r];
// GPT-2's under base_model.model.transformer.h.<l>.), each present with its shape, in F32,
// BF16 or F16. Anything else is a ConfigError naming the file, key or tensor and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "strata/model/gpt_layout.hpp"

namespace strata {

class ZeroEngine;
class PartedSource;

// peft's name of a tensor of an adapter group (GptTensor::name): "base_model.model." and,
// for GPT-2, "transformer." before it.
std::string peft_tensor_name(const GptShape& s, const std::string& name);

// The adapter_config.json peft writes for these adapters (the keys PeftModel.from_pretrained
// reads; the rest take peft's defaults).
nlohmann::json peft_adapter_config(const GptShape& s);

// Every block's adapter group values (index l: "lora.l"): peft's default drawn from `seed`,
// or the adapters in peft directory `dir` when it is not empty.
std::vector<std::vector<float>> lora_start_values(const GptShape& s, const std::string& dir, uint64_t seed);

// Writes the adapter groups' values into the engine: each rank its shard (fresh moments).
void write_lora_groups(ZeroEngine& engine, const PartedSource& source, const GptShape& s,
                       const std::vector<std::vector<float>>& values);

}  // namespace strata
