#include "strata/runtime/formats/peft.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/engine/parted_source.hpp"
#include "strata/runtime/engine/zero_engine.hpp"
#include "strata/runtime/formats/safetensors.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

std::string peft_tensor_name(const GptShape& s, const std::string& name) {
  return std::string("base_model.model.") + (s.llama() ? "" : "transformer.") + name;
}

json peft_adapter_config(const GptShape& s) {
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", nullptr},
          {"r", s.lora.rank},
          {"lora_alpha", s.lora.alpha},
          {"lora_dropout", 0.0},
          {"target_modules", lora_target_names(s.arch, s.lora.targets)},
          {"fan_in_fan_out", !s.llama()},  // GPT-2's Conv1D base weights are [in, out]
          {"bias", "none"},
          {"use_rslora", false},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"modules_to_save", nullptr}};
}

namespace {

// The groups of a LoRA shape that are adapters, in block order.
std::vector<GptGroup> adapter_groups(const GptShape& s) {
  std::vector<GptGroup> all = gpt_groups(s);
  return {all.begin() + gpt_lora_group(s, 0), all.end()};
}

std::vector<std::vector<float>> default_values(const GptShape& s, uint64_t seed) {
  std::vector<std::vector<float>> out;
  for (const GptGroup& g : adapter_groups(s)) {
    std::vector<float> v(g.numel, 0.0f);
    std::mt19937_64 rng(seed ^ (0x10a5ull << 32) ^ std::hash<std::string>{}(g.name));
    for (const GptTensor& t : g.tensors) {
      if (t.init != GptInit::KaimingUniform) continue;  // B: zero
      const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
      std::uniform_real_distribution<float> u(-bound, bound);
      for (uint64_t i = 0; i < t.numel(); ++i) v[t.offset + i] = u(rng);
    }
    out.push_back(std::move(v));
  }
  return out;
}

void check_peft_config(const GptShape& s, const std::string& dir) {
  const fs::path cp = fs::path(dir) / "adapter_config.json";
  std::ifstream f(cp);
  if (!f)
    throw ConfigError("--lora-init '" + dir + "' has no adapter_config.json: give a directory peft's save_pretrained "
                      "wrote (adapter_config.json and adapter_model.safetensors)");
  json c;
  try {
    c = json::parse(f);
  } catch (const json::exception& e) {
    throw ConfigError(cp.string() + " is not valid JSON (" + e.what() + ")");
  }
  const std::string where = cp.string() + ": ";
  const std::string fix = "; set strata.lora to the adapter's (rank, alpha, target), or give adapters made with it";
  if (c.value("peft_type", std::string("LORA")) != "LORA")
    throw ConfigError(where + "peft_type is " + c["peft_type"].dump() + ", not \"LORA\"");
  for (const char* k : {"use_dora", "use_rslora"})
    if (c.value(k, false)) throw ConfigError(where + k + " is true; Strata's LoRA is plain LoRA (scale alpha / r)");
  if (!c.contains("r") || !c["r"].is_number_integer() || c["r"].get<int>() != s.lora.rank)
    throw ConfigError(where + "r is " + (c.contains("r") ? c["r"].dump() : "missing") + ", strata.lora.rank is " +
                      std::to_string(s.lora.rank) + fix);
  if (!c.contains("lora_alpha") || !c["lora_alpha"].is_number() || c["lora_alpha"].get<double>() != s.lora.alpha) {
    std::ostringstream a;
    a << s.lora.alpha;
    throw ConfigError(where + "lora_alpha is " + (c.contains("lora_alpha") ? c["lora_alpha"].dump() : "missing") +
                      ", strata.lora.alpha is " + a.str() + fix);
  }
  if (c.contains("rank_pattern") && c["rank_pattern"].is_object() && !c["rank_pattern"].empty())
    throw ConfigError(where + "rank_pattern gives some modules another rank; Strata's adapters share one rank");
  if (c.contains("alpha_pattern") && c["alpha_pattern"].is_object() && !c["alpha_pattern"].empty())
    throw ConfigError(where + "alpha_pattern gives some modules another alpha; Strata's adapters share one alpha");
  std::vector<std::string> want = lora_target_names(s.arch, s.lora.targets), have;
  if (c.contains("target_modules") && c["target_modules"].is_array())
    for (const json& t : c["target_modules"])
      if (t.is_string()) have.push_back(t.get<std::string>());
  std::sort(want.begin(), want.end());
  std::sort(have.begin(), have.end());
  if (want != have) {
    auto list = [](const std::vector<std::string>& v) {
      std::string o;
      for (const auto& x : v) o += (o.empty() ? "" : ", ") + x;
      return "[" + o + "]";
    };
    throw ConfigError(where + "target_modules is " + (c.contains("target_modules") ? c["target_modules"].dump() : "missing") +
                      ", strata.lora.target is " + list(want) + fix);
  }
}

DType safetensors_type(const SafetensorsTensor& t, const std::string& file) {
  if (t.dtype == "F32") return DType::F32;
  if (t.dtype == "BF16") return DType::BF16;
  if (t.dtype == "F16") return DType::F16;
  throw ConfigError(file + ": tensor '" + t.name + "' is " + t.dtype + "; adapters are read in F32, BF16 or F16");
}

std::vector<std::vector<float>> peft_values(const GptShape& s, const std::string& dir) {
  check_peft_config(s, dir);
  const std::string file = (fs::path(dir) / "adapter_model.safetensors").string();
  std::error_code ec;
  if (!fs::exists(file, ec))
    throw ConfigError("--lora-init '" + dir + "' has no adapter_model.safetensors (peft's file of the adapters; an "
                      "adapter_model.bin is not read: save with safe_serialization=True)");
  const SafetensorsHeader h = read_safetensors_header(file);
  std::ifstream in(file, std::ios::binary);
  std::vector<std::vector<float>> out;
  size_t used = 0;
  for (const GptGroup& g : adapter_groups(s)) {
    std::vector<float> v(g.numel, 0.0f);
    for (const GptTensor& t : g.tensors) {
      const std::string name = peft_tensor_name(s, t.name);
      const SafetensorsTensor* st = h.find(name);
      if (!st)
        throw ConfigError(file + " has no tensor '" + name + "': the adapters are not of this model (strata.model and "
                          "strata.lora.target must be those the adapters were made for)");
      const std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      if (st->shape != shape)
        throw ConfigError(file + ": tensor '" + name + "' has shape " + json(st->shape).dump() + ", this model's is " +
                          json(shape).dump());
      const DType dt = safetensors_type(*st, file);
      std::vector<char> raw(st->bytes);
      in.seekg(static_cast<std::streamoff>(st->offset));
      in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
      if (!in) throw IoError("reading the adapters", file, st->offset, st->bytes, EIO, "");
      convert_to_f32(v.data() + t.offset, raw.data(), dt, t.numel());
      for (uint64_t i = 0; i < t.numel(); ++i)
        if (!std::isfinite(v[t.offset + i]))
          throw ConfigError(file + ": tensor '" + name + "' holds a NaN or inf at index " + std::to_string(i));
      ++used;
    }
    out.push_back(std::move(v));
  }
  // A tensor of another module or layer would be dropped silently: refuse it.
  if (used != h.tensors.size())
    for (const SafetensorsTensor& t : h.tensors) {
      bool ours = false;
      for (const GptGroup& g : adapter_groups(s))
        for (const GptTensor& x : g.tensors) ours = ours || peft_tensor_name(s, x.name) == t.name;
      if (!ours)
        throw ConfigError(file + " holds '" + t.name + "', which this model's adapters do not have (another module, "
                          "layer or an embedding/bias adapter): strata.lora must describe the adapters exactly");
    }
  return out;
}

}  // namespace

std::vector<std::vector<float>> lora_start_values(const GptShape& s, const std::string& dir, uint64_t seed) {
  STRATA_CHECK(s.has_lora(), "lora_start_values: the shape has no adapters");
  return dir.empty() ? default_values(s, seed) : peft_values(s, dir);
}

void write_lora_groups(ZeroEngine& engine, const PartedSource& source, const GptShape& s,
                       const std::vector<std::vector<float>>& values) {
  const int rank = engine.comm().rank();
  for (int l = 0; l < s.layers; ++l) {
    const int g = source.inner(gpt_lora_group(s, l), 0);  // an adapter group is one part
    const std::vector<float>& v = values.at(static_cast<size_t>(l));
    STRATA_CHECK(v.size() == engine.group_numel(g), "write_lora_groups: values of another size");
    const uint64_t n = engine.shard_numel(g);
    std::vector<float> m(n, 0.0f), zeros(n, 0.0f);
    const uint64_t lo = std::min<uint64_t>(v.size(), static_cast<uint64_t>(rank) * n), hi = std::min<uint64_t>(v.size(), lo + n);
    std::copy(v.begin() + static_cast<long>(lo), v.begin() + static_cast<long>(hi), m.begin());
    engine.write_optimizer_shard(g, m.data(), zeros.data(), zeros.data(), 0);
  }
}

}  // namespace strata
