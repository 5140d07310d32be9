// Hugging Face model directories into Strata checkpoints (hf_import.hpp).
#include "strata/runtime/formats/hf_import.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/core/value_checks.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/formats/export.hpp"
#include "strata/runtime/formats/safetensors.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const fs::path& p, const std::string& what) {
  json j = parse_untrusted_json(read_input_file(p.string(), what, 64ull << 20));
  if (j.is_discarded() || !j.is_object())
    throw ConfigError(what + " '" + p.string() + "' is not a JSON object: the model directory is damaged");
  return j;
}

int int_key(const json& c, const std::string& file, std::initializer_list<const char*> names,
            std::optional<int> fallback = std::nullopt) {
  for (const char* n : names)
    if (c.contains(n) && !(fallback && c[n].is_null())) {
      if (!c[n].is_number_integer() || c[n].get<int64_t>() < 1 || c[n].get<int64_t>() > INT32_MAX)
        throw ConfigError(file + ": '" + n + "' is " + c[n].dump() + ", not a positive whole number");
      return static_cast<int>(c[n].get<int64_t>());
    }
  if (fallback) return *fallback;
  throw ConfigError(file + " has no '" + *names.begin() + "': it is not a complete config.json");
}

double number_key(const json& c, const std::string& file, const char* name, double fallback) {
  if (!c.contains(name)) return fallback;
  if (!c[name].is_number() || !std::isfinite(c[name].get<double>()))
    throw ConfigError(file + ": '" + name + "' is " + c[name].dump() + ", not a number");
  return c[name].get<double>();
}

// The rotary embeddings' base. transformers 4.x writes rope_theta (and rope_scaling) at the
// top level; 5.x writes rope_parameters {"rope_type", "rope_theta", and a scaled type's
// own keys} instead, and reads either. Only the unscaled ("default") type is imported.
double llama_rope_theta(const json& cfg, const std::string& cfg_name) {
  const double top = number_key(cfg, cfg_name, "rope_theta", 10000.0);
  if (!cfg.contains("rope_parameters") || cfg["rope_parameters"].is_null()) return top;
  const json& rp = cfg["rope_parameters"];
  auto refuse = [&](const std::string& why) {
    throw ConfigError(cfg_name + ": rope_parameters = " + rp.dump() + ", " + why);
  };
  if (!rp.is_object()) refuse("not an object");
  if (rp.contains("rope_type") && rp["rope_type"] != "default")
    refuse("but Strata's rotary embeddings are unscaled (rope_type default: Llama 2, Llama 3; not Llama 3.1's "
           "long-context scaling)");
  const double theta = number_key(rp, cfg_name + " rope_parameters", "rope_theta", top);
  if (cfg.contains("rope_theta") && theta != top)
    refuse("whose rope_theta disagrees with the top-level rope_theta " + cfg["rope_theta"].dump());
  return theta;
}

// LlamaForCausalLM's config.json (LlamaConfig's defaults where a key is absent) as a
// Strata shape; what Strata's Llama does not compute as Hugging Face's does is refused.
GptShape llama_shape(const json& cfg, const std::string& cfg_name) {
  GptShape s;
  s.arch = Arch::Llama;
  s.layers = int_key(cfg, cfg_name, {"num_hidden_layers"});
  s.d_model = int_key(cfg, cfg_name, {"hidden_size"});
  s.heads = int_key(cfg, cfg_name, {"num_attention_heads"});
  s.kv_heads = int_key(cfg, cfg_name, {"num_key_value_heads"}, s.heads);
  s.ffn = int_key(cfg, cfg_name, {"intermediate_size"});
  s.seq_len = int_key(cfg, cfg_name, {"max_position_embeddings"});
  s.vocab = int_key(cfg, cfg_name, {"vocab_size"});
  s.rope_theta = llama_rope_theta(cfg, cfg_name);
  s.norm_eps = number_key(cfg, cfg_name, "rms_norm_eps", 1e-6);
  s.tied_head = cfg.contains("tie_word_embeddings") && cfg["tie_word_embeddings"] == true;
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(cfg_name + ": " + key + " = " + cfg[key].dump() + ", " + why);
  };
  if (cfg.contains("hidden_act") && cfg["hidden_act"] != "silu")
    refuse("hidden_act", "but Strata's Llama MLP is SwiGLU with silu");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (cfg.contains(k) && cfg[k] != false) refuse(k, "but Strata's Llama has no biases");
  if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null())
    refuse("rope_scaling", "but Strata's rotary embeddings are unscaled (Llama 2, Llama 3; not Llama 3.1's "
                           "long-context scaling)");
  if (cfg.contains("head_dim") && !cfg["head_dim"].is_null() && s.heads > 0 &&
      cfg["head_dim"] != s.d_model / s.heads)
    refuse("head_dim", "but Strata's heads are hidden_size / num_attention_heads wide");
  return s;
}

// One safetensors file, its header read once.
struct Shard {
  std::string path;
  int index = 0;  // in ImportSummary::files_read
  SafetensorsHeader header;
  int fd = -1;
  ~Shard() {
    if (fd >= 0) ::close(fd);
  }
};

DType tensor_dtype(const SafetensorsTensor& t, const std::string& where) {
  if (t.dtype == "F32") return DType::F32;
  if (t.dtype == "BF16") return DType::BF16;
  if (t.dtype == "F16") return DType::F16;
  throw ConfigError(where + ": tensor '" + t.name + "' is " + t.dtype + "; Strata imports F32, BF16 and F16 weights");
}

// The architecture config.json names: "LlamaForCausalLM" or "GPT2LMHeadModel"; any other
// is refused.
std::string hf_architecture(const json& cfg, const std::string& cfg_name) {
  std::string arch = cfg.contains("architectures") && cfg["architectures"].is_array() &&
                             !cfg["architectures"].empty() && cfg["architectures"][0].is_string()
                         ? cfg["architectures"][0].get<std::string>()
                         : "";
  const std::string model_type = cfg.contains("model_type") && cfg["model_type"].is_string()
                                     ? cfg["model_type"].get<std::string>()
                                     : "";
  const bool llama = arch == "LlamaForCausalLM" || (arch.empty() && model_type == "llama");
  if (!llama && !(arch == "GPT2LMHeadModel" || (arch.empty() && model_type == "gpt2")))
    throw ConfigError(cfg_name + " describes " + (arch.empty() ? "no architecture" : "a " + arch) +
                      (model_type.empty() ? "" : " (model_type '" + model_type + "')") +
                      ", which Strata does not import: it imports GPT2LMHeadModel (model_type gpt2) and "
                      "LlamaForCausalLM (model_type llama)");
  return llama ? "LlamaForCausalLM" : "GPT2LMHeadModel";
}

// The shape, and what this model computes as Hugging Face's does.
GptShape hf_shape(const json& cfg, const std::string& cfg_name, bool llama) {
  GptShape shape = llama ? llama_shape(cfg, cfg_name) : GptShape{};
  if (!llama) {
    shape.layers = int_key(cfg, cfg_name, {"n_layer", "num_hidden_layers"});
    shape.d_model = int_key(cfg, cfg_name, {"n_embd", "hidden_size"});
    shape.heads = int_key(cfg, cfg_name, {"n_head", "num_attention_heads"});
    shape.seq_len = int_key(cfg, cfg_name, {"n_positions", "n_ctx", "max_position_embeddings"});
    shape.vocab = int_key(cfg, cfg_name, {"vocab_size"});
  }
  try {
    validate(shape);
  } catch (const ConfigError& e) {
    throw ConfigError(cfg_name + ": " + e.what());
  }
  if (llama) return shape;
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(cfg_name + ": " + key + " = " + cfg[key].dump() + ", " + why);
  };
  if (cfg.contains("activation_function") && cfg["activation_function"] != "gelu_new" &&
      cfg["activation_function"] != "gelu_pytorch_tanh")
    refuse("activation_function", "but Strata's GPT computes GELU with the tanh approximation (gelu_new)");
  if (cfg.contains("layer_norm_epsilon") &&
      (!cfg["layer_norm_epsilon"].is_number() || std::fabs(cfg["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
    refuse("layer_norm_epsilon", "but Strata's layer norms use 1e-5");
  if (cfg.contains("tie_word_embeddings") && cfg["tie_word_embeddings"] != true)
    refuse("tie_word_embeddings", "but Strata's GPT ties its head to wte");
  if (cfg.contains("n_inner") && !cfg["n_inner"].is_null() && cfg["n_inner"] != 4 * shape.d_model)
    refuse("n_inner", "but Strata's MLP is 4 x n_embd wide");
  if (cfg.contains("scale_attn_weights") && cfg["scale_attn_weights"] != true)
    refuse("scale_attn_weights", "but Strata scales attention by 1/sqrt(head_dim)");
  if (cfg.contains("scale_attn_by_inverse_layer_idx") && cfg["scale_attn_by_inverse_layer_idx"] != false)
    refuse("scale_attn_by_inverse_layer_idx", "which Strata's attention does not do");
  return shape;
}

// A model directory: its config.json's architecture and shape, and its safetensors files
// with their headers.
struct HfModel {
  fs::path dir;
  std::string hf_dir;  // as given
  std::string arch;
  bool llama = false;
  GptShape shape;
  std::vector<std::string> files;
  std::map<std::string, std::string> file_of;  // tensor name -> file name
  std::map<std::string, std::unique_ptr<Shard>> shards;  // by file name
};

// The files: one model.safetensors, or the shards of an index (which fills m.file_of).
void list_weight_files(HfModel& m) {
  const fs::path& dir = m.dir;
  const std::string& hf_dir = m.hf_dir;
  std::error_code ec;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const json idx = read_json(index_path, "model.safetensors.index.json");
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw ConfigError("'" + index_path.string() + "' has no weight_map: the model directory is damaged");
    std::set<std::string> seen;
    for (const auto& item : idx["weight_map"].items()) {
      if (!item.value().is_string() || item.value().get<std::string>().find('/') != std::string::npos)
        throw ConfigError("'" + index_path.string() + "': tensor '" + item.key() + "' maps to " +
                          item.value().dump() + ", not a file name in the directory");
      m.file_of[item.key()] = item.value().get<std::string>();
      if (seen.insert(item.value().get<std::string>()).second) m.files.push_back(item.value().get<std::string>());
    }
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    m.files.push_back("model.safetensors");
  } else {
    throw ConfigError("--hf '" + hf_dir + "' has neither model.safetensors nor model.safetensors.index.json (" +
                      "PyTorch .bin weights are not read: save the model with safe_serialization=True)");
  }
}

// Each file's header read and the file opened, in the order listed (sum.files_read); a
// single file's tensors go into m.file_of.
void open_shards(HfModel& m, ImportSummary& sum) {
  const fs::path& dir = m.dir;
  std::error_code ec;
  for (const std::string& f : m.files) {
    const fs::path p = dir / f;
    if (!fs::exists(p, ec))
      throw ConfigError("shard '" + p.string() + "' is missing: " +
                        (m.file_of.empty() ? std::string("the model directory is incomplete")
                                           : "model.safetensors.index.json lists it; download the model again"));
    auto s = std::make_unique<Shard>();
    s->path = p.string();
    s->index = static_cast<int>(sum.files_read.size());
    sum.files_read.push_back(s->path);
    s->header = read_safetensors_header(s->path);
    struct stat st {};
    s->fd = open_input_file(s->path, "safetensors file", &st);
    if (m.file_of.empty())
      for (const auto& t : s->header.tensors) m.file_of[t.name] = f;
    m.shards[f] = std::move(s);
  }
}

// Every tensor of the files must be one this GPT has, a tied head, or a mask buffer.
void check_no_unknown_tensors(const HfModel& m, const std::vector<GptGroup>& groups) {
  const bool llama = m.llama;
  std::set<std::string> wanted;
  for (const auto& g : groups)
    for (const auto& t : g.tensors) wanted.insert(t.name);
  auto strip = [&](const std::string& n) {
    return !llama && n.rfind("transformer.", 0) == 0 ? n.substr(12) : n;
  };
  // Skipped: a tied head (the embedding is the head), GPT-2's attention-mask buffers and
  // older Llama checkpoints' rotary inv_freq buffers (Strata computes them).
  auto skipped = [&](const std::string& n) {
    if (llama) return (m.shape.tied_head && n == "lm_head.weight") || n.ends_with(".rotary_emb.inv_freq");
    return n == "lm_head.weight" || n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias");
  };
  std::vector<std::string> unknown;
  for (const auto& [name, f] : m.file_of)
    if (!wanted.count(strip(name)) && !skipped(strip(name))) unknown.push_back(name);
  if (!unknown.empty())
    throw ConfigError("--hf '" + m.hf_dir + "' holds " + std::to_string(unknown.size()) + " tensor(s) " + m.arch +
                      " of this config.json does not have (" + unknown[0] + (unknown.size() > 1 ? ", ..." : "") +
                      "): it is not a plain " + m.arch + " of the shape config.json gives");
}

// Where each tensor of a group is: its file, its header entry and its type.
struct Found {
  const Shard* shard;
  const SafetensorsTensor* st;
  DType dt;
};

// Every tensor, by group, looked up and its type and shape checked; dtype: the last
// tensor's type, mixed: whether they differ.
struct FoundTensors {
  std::vector<std::vector<Found>> by_group;
  std::optional<DType> dtype;
  bool mixed = false;
};

FoundTensors find_tensors(const HfModel& m, const std::vector<GptGroup>& groups) {
  const bool llama = m.llama;
  FoundTensors out;
  std::vector<std::vector<Found>>& found = out.by_group;
  found.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (const GptTensor& t : groups[gi].tensors) {
      std::string key = t.name;
      if (!m.file_of.count(key) && !llama) key = "transformer." + t.name;
      if (!m.file_of.count(key))
        throw ConfigError("--hf '" + m.hf_dir + "' has no tensor '" + t.name + "'" +
                          (llama ? std::string() : " (nor 'transformer." + t.name + "')") +
                          ": the model directory is incomplete or not " + m.arch + "'s");
      const Shard& s = *m.shards.at(m.file_of.at(key));
      const SafetensorsTensor* st = s.header.find(key);
      if (!st)
        throw ConfigError("'" + s.path + "' has no tensor '" + key + "', which model.safetensors.index.json puts there");
      const DType dt = tensor_dtype(*st, "'" + s.path + "'");
      if (out.dtype && *out.dtype != dt) out.mixed = true;
      out.dtype = dt;
      const std::vector<int64_t> want = gpt2_shape(t);
      const std::vector<int64_t> got(st->shape.begin(), st->shape.end());
      if (got != want) {
        auto text = [](const std::vector<int64_t>& v) {
          std::string s = "[";
          for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
          return s + "]";
        };
        throw ConfigError("tensor '" + key + "' in '" + s.path + "' is " + text(got) + ", but config.json (" +
                          describe(m.shape) + ") makes it " + text(want) +
                          ": the weights and config.json are of different models");
      }
      found[gi].push_back({&s, st, dt});
    }
  return out;
}

// Reads a tensor's bytes from its file into raw: counted, and recorded in sum.reads.
struct TensorReader {
  ImportSummary& sum;
  std::vector<std::byte> raw;
  void read(const Found& f, uint64_t offset, uint64_t bytes) {
    raw.resize(bytes);
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t r = ::pread(f.shard->fd, raw.data() + done, bytes - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw IoError("reading tensor '" + f.st->name + "'", f.shard->path, offset + done, bytes - done,
                      r == 0 ? EIO : errno);
      done += static_cast<uint64_t>(r);
    }
    sum.bytes_read += bytes;
    sum.reads.push_back({f.shard->index, offset, bytes});
  }
};

// The checks on weights as they are read (hf_import.hpp): finite, and within the range of
// the precision training continues in.
struct WeightChecks {
  DType precision = DType::F32;
  OutOfRange out_of_range = OutOfRange::Refuse;
  // x: n values of f's tensor, from flat index `index` of the file's layout.
  void operator()(const Found& f, float* x, uint64_t n, uint64_t index) const {
    const std::string what = "tensor '" + f.st->name + "' in '" + f.shard->path + "'";
    check_finite(x, n, what,
                 "a model with a NaN or inf weight computes NaN, so it is not imported: the file is damaged or the "
                 "model diverged; import a sound copy",
                 index);
    if (precision == DType::F32) return;
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", largest_finite(precision));
    check_range(x, n, precision, out_of_range, what,
                std::string("import it with --precision bf16 or f32, whose range holds it, or pass --clamp to clamp "
                            "such values to +-") + limit,
                index);
  }
};

// The elements [lo, hi) of a group's flat layout that its tensor t holds, as fp32 into buf
// (element 0 of buf: lo), each checked (in the file's order, so that indices are the
// file's). tmp: scratch.
void read_tensor_range(TensorReader& reader, const GptTensor& t, const Found& f, uint64_t lo, uint64_t hi,
                       const WeightChecks& check, std::vector<float>& buf, std::vector<float>& tmp) {
  const std::vector<std::byte>& raw = reader.raw;
  const uint64_t es = dtype_size(f.dt);
  // The tensor's elements (in Strata's layout, from its start) in [lo, hi): [a, b).
  const uint64_t first = std::max(lo, t.offset), last = std::min(hi, t.offset + t.numel());
  if (first >= last) return;
  const uint64_t a = first - t.offset, b = last - t.offset;
  float* dst = buf.data() + (first - lo);
  if (!t.transposed_in_gpt2) {
    reader.read(f, f.st->offset + a * es, (b - a) * es);
    convert_to_f32(dst, raw.data(), f.dt, b - a);
    check(f, dst, b - a, a);
    return;
  }
  // Conv1D [in, out] in the file, [out, in] here: element (o, i) here is o * in + i,
  // in the file i * out + o. The whole tensor (one process) is one read; a part of it
  // is one read per file row i, of the contiguous run of o the range needs.
  const uint64_t in = static_cast<uint64_t>(t.shape[1]), outs = static_cast<uint64_t>(t.shape[0]);
  auto scatter = [&](uint64_t i, uint64_t o0, uint64_t o1, const float* row) {
    for (uint64_t o = o0; o < o1; ++o) buf[t.offset + o * in + i - lo] = row[o - o0];
  };
  if (a == 0 && b == t.numel()) {
    reader.read(f, f.st->offset, t.numel() * es);
    tmp.resize(t.numel());
    convert_to_f32(tmp.data(), raw.data(), f.dt, t.numel());
    check(f, tmp.data(), t.numel(), 0);
    for (uint64_t i = 0; i < in; ++i) scatter(i, 0, outs, tmp.data() + i * outs);
    return;
  }
  auto ceil_div = [](uint64_t x, uint64_t y) { return (x + y - 1) / y; };
  for (uint64_t i = 0; i < in; ++i) {
    const uint64_t o0 = a > i ? ceil_div(a - i, in) : 0, o1 = std::min(outs, b > i ? ceil_div(b - i, in) : 0);
    if (o1 <= o0) continue;
    reader.read(f, f.st->offset + (i * outs + o0) * es, (o1 - o0) * es);
    tmp.resize(o1 - o0);
    convert_to_f32(tmp.data(), raw.data(), f.dt, o1 - o0);
    check(f, tmp.data(), o1 - o0, i * outs + o0);
    scatter(i, o0, o1, tmp.data());
  }
}

// What a full disk during an import asks for: the checkpoint's own I/O names
// strata.checkpoint_dir, a training run's, but an import writes --out.
constexpr const char* kImportOutFull = "free space on it or give --out on a disk with room";

ImportSummary import_into(const std::string& hf_dir, const std::string& out, std::optional<DType> precision,
                          coll::Communicator* host, OutOfRange out_of_range) {
  HfModel m;
  m.dir = fs::path(hf_dir);
  m.hf_dir = hf_dir;
  const fs::path& dir = m.dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError("--hf '" + hf_dir + "' is not a directory: give a Hugging Face model directory (config.json "
                      "and model.safetensors)");
  const fs::path cfg_path = dir / "config.json";
  if (!fs::exists(cfg_path, ec))
    throw ConfigError("--hf '" + hf_dir + "' has no config.json: give a Hugging Face model directory");
  const json cfg = read_json(cfg_path, "config.json");
  const std::string cfg_name = "config.json of '" + hf_dir + "'";
  m.arch = hf_architecture(cfg, cfg_name);
  m.llama = m.arch == "LlamaForCausalLM";
  m.shape = hf_shape(cfg, cfg_name, m.llama);
  list_weight_files(m);
  ImportSummary sum;
  open_shards(m, sum);
  const std::vector<GptGroup> groups = gpt_groups(m.shape);
  check_no_unknown_tensors(m, groups);

  const std::string& arch = m.arch;
  const GptShape& shape = m.shape;
  sum.architecture = arch;
  sum.shape = shape;
  sum.files = static_cast<int>(m.files.size());
  // Every tensor is looked up and its type and shape checked on every rank (the headers
  // are read whole); only this rank's shard of each group is read from the files.
  const FoundTensors found = find_tensors(m, groups);

  const DType prec = precision ? *precision : (!found.mixed && found.dtype ? *found.dtype : DType::F32);
  const WeightChecks check{prec, out_of_range};

  InitialCheckpointWriter writer(out, host);
  std::vector<float> buf, tmp;
  TensorReader reader{sum, {}};
  std::exception_ptr failed;
  try {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const GptGroup& g = groups[gi];
      // This rank's elements of the group: [lo, hi) of the flat layout.
      const uint64_t n = writer.shard_size(g.numel), lo = writer.shard_begin(g.numel),
                     hi = std::min(lo + n, g.numel);
      buf.assign(n, 0.0f);
      for (size_t ti = 0; ti < g.tensors.size(); ++ti)
        read_tensor_range(reader, g.tensors[ti], found.by_group[gi][ti], lo, hi, check, buf, tmp);
      writer.add_group(g.name, buf.data(), g.numel);
      sum.tensors += static_cast<int>(g.tensors.size());
      sum.parameters += g.numel;
    }
  } catch (...) {
    failed = std::current_exception();
  }
  sum.precision = precision_name(prec);
  json config = {{"strata", {{"model", model_json(shape)}}}};
  if (prec == DType::BF16) config["bf16"] = {{"enabled", true}};
  if (prec == DType::F16) config["fp16"] = {{"enabled", true}};
  const json extra = {{"imported_from", fs::absolute(dir).lexically_normal().string()}, {"architecture", arch}};
  sum.checkpoint = writer.finish(config, sum.precision, extra, failed);
  sum.bytes_read_all = sum.bytes_read;
  if (host && host->size() > 1) {
    int64_t all = static_cast<int64_t>(sum.bytes_read);
    host->all_reduce(std::span<int64_t>(&all, 1)).wait();
    sum.bytes_read_all = static_cast<uint64_t>(all);
  }
  return sum;
}

}  // namespace

ImportSummary import_hf(const std::string& hf_dir, const std::string& out, std::optional<DType> precision,
                        coll::Communicator* host, OutOfRange out_of_range) {
  try {
    return import_into(hf_dir, out, precision, host, out_of_range);
  } catch (const IoError& e) {
    // Reading the model fills no disk: a full one is --out's.
    if (e.error_code() != ENOSPC && e.error_code() != EDQUOT) throw;
    throw IoError("writing the imported checkpoint into --out '" + out + "'", e.path(), e.offset(), e.length(),
                  e.error_code(), kImportOutFull);
  }
}

}  // namespace strata
