#include "strata/runtime/formats/export.hpp"
#include "strata/runtime/formats/peft.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/output_guard.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/core/value_checks.hpp"
#include "strata/runtime/config/config.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What a full disk under --out asks for (IoError).
constexpr const char* kOutFull = "free space on it or give --out on a disk with room";

// Writes through a buffer, so that tensors go out in large writes.
class Writer {
 public:
  Writer(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kBuf); }
  void put(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const size_t k = std::min(n, kBuf - buf_.size());
      buf_.insert(buf_.end(), c, c + k);
      c += k;
      n -= k;
      if (buf_.size() == kBuf) flush();
    }
  }
  void flush() {
    size_t done = 0;
    while (done < buf_.size()) {
      const ssize_t w = ::pwrite(fd_, buf_.data() + done, buf_.size() - done, static_cast<off_t>(off_));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw IoError("writing the safetensors file", path_, off_, buf_.size() - done, w < 0 ? errno : ENOSPC, kOutFull);
      done += static_cast<size_t>(w);
      off_ += static_cast<uint64_t>(w);
    }
    buf_.clear();
  }
  uint64_t written() const { return off_ + buf_.size(); }

 private:
  static constexpr size_t kBuf = 8 << 20;
  int fd_;
  std::string path_;
  uint64_t off_ = 0;
  std::vector<char> buf_;
};

}  // namespace

std::vector<int64_t> gpt2_shape(const GptTensor& t) {
  if (!t.transposed_in_gpt2) return t.shape;
  return {t.shape[1], t.shape[0]};
}

GptShape checkpoint_gpt_shape(const CheckpointInfo& info) {
  // Only the model section: the rest (NVMe paths, ...) may name things of the machine
  // that trained, which need not exist here.
  const json& c = info.config;
  if (!c.is_object() || !c.contains("strata") || !c["strata"].is_object() || !c["strata"].contains("model"))
    throw ConfigError("the configuration stored in checkpoint '" + info.dir +
                      "' has no strata.model section, so its GPT shape is unknown; export reads GPT checkpoints "
                      "written by strata train");
  GptShape shape;
  try {
    json section = {{"model", c["strata"]["model"]}};
    if (c["strata"].contains("lora")) section["lora"] = c["strata"]["lora"];  // its adapters
    shape = parse_config(json{{"strata", section}}).strata.model;
  } catch (const ConfigError& e) {
    throw ConfigError("the configuration stored in checkpoint '" + info.dir +
                      "' cannot be read as a Strata configuration (" + e.what() +
                      "); export reads GPT checkpoints written by strata train");
  }
  const std::vector<GptGroup> groups = gpt_groups(shape);
  const std::string what =
      "checkpoint '" + info.dir + "' is not of the model its configuration describes (" + describe(shape) + "): ";
  const std::string fix = "; export reads GPT checkpoints written by strata train";
  const std::vector<CheckpointGroup> saved = checkpoint_model_groups(info);
  if (groups.size() != saved.size())
    throw ConfigError(what + "it has " + std::to_string(saved.size()) + " parameter groups, the GPT " +
                      std::to_string(groups.size()) + fix);
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].numel != saved[g].numel)  // names are informative (save may not know them)
      throw ConfigError(what + "its group " + std::to_string(g) + " is '" + saved[g].name + "' of " +
                        std::to_string(saved[g].numel) + " elements, the GPT's is '" + groups[g].name + "' of " +
                        std::to_string(groups[g].numel) + fix);
  return shape;
}

void check_checkpoint_model(const CheckpointInfo& info, const GptShape& here, const std::string& flag) {
  const json& c = info.config;
  const bool has_model = c.is_object() && c.contains("strata") && c["strata"].is_object() && c["strata"].contains("model");
  const GptShape saved = has_model ? checkpoint_gpt_shape(info) : parse_config(json::object()).strata.model;
  // A LoRA run starts from a base model's weights (--init-from a checkpoint without adapters).
  GptShape compared = here;
  if (flag == "--init-from" && !saved.has_lora()) compared.lora = LoraSpec{};
  const std::vector<ModelDifference> diffs = model_differences(saved, compared);
  if (diffs.empty()) return;
  std::string list;
  for (const ModelDifference& d : diffs)
    list += (list.empty() ? "" : "; ") + d.field + " is " + d.first + " in the checkpoint, " + d.second + " here";
  throw ConfigError(flag + ": the model in checkpoint '" + info.dir +
                    "' is not this run's strata.model (its shape and every setting that changes what it computes "
                    "must match): " + list + ". Fix: set strata.model to the checkpoint's (" + describe(saved) +
                    "; its manifest.json holds it under config.strata.model)" +
                    (flag == "--init-from" ? "" : ", or start a new run with another strata.checkpoint_dir"));
}

namespace {

// A checkpoint's GPT tensors, planned into safetensors files: each tensor's file, name
// and offset, so that every file's header can be written before its data.
struct PlannedTensor {
  const GptTensor* t = nullptr;
  size_t group = 0;
  std::string name;
  uint64_t bytes = 0;
  size_t file = 0;
  uint64_t offset = 0;  // in its file's data
};

// Groups [first, end) of `groups` (a LoRA checkpoint's base, or its adapters).
std::vector<PlannedTensor> plan_tensors(const std::vector<GptGroup>& groups, uint64_t element_bytes,
                                        const std::string& prefix, uint64_t shard_bytes, size_t* files,
                                        size_t first = 0, size_t end = SIZE_MAX) {
  std::vector<PlannedTensor> out;
  size_t file = 0;
  uint64_t in_file = 0;
  for (size_t g = first; g < std::min(end, groups.size()); ++g)
    for (const GptTensor& t : groups[g].tensors) {
      const uint64_t bytes = t.numel() * element_bytes;
      if (in_file > 0 && in_file + bytes > shard_bytes) ++file, in_file = 0;  // a tensor is never split
      out.push_back({&t, g, prefix + t.name, bytes, file, in_file});
      in_file += bytes;
    }
  *files = file + 1;
  return out;
}

// Writes file `f` of the plan to `path` (created; the caller renames it into place):
// header, then the tensors' data converted from the checkpoint's fp32 masters (a group is
// read when first needed; *cache holds the last one read).
// Model group g of a checkpoint; with `merge` (a LoRA shape), a block's weights with its
// adapters merged in: W[c0 + i, :] += (alpha / r) (B A)[i, :], as peft's merge_and_unload.
std::vector<float> read_group(const CheckpointInfo& info, size_t g, const GptShape* merge) {
  std::vector<float> w = read_checkpoint_group(info, static_cast<int>(g));
  if (!merge || !merge->has_lora() || g < 1 || g > static_cast<size_t>(merge->layers)) return w;
  const int l = static_cast<int>(g) - 1, r = merge->lora.rank;
  const std::vector<float> ad = read_checkpoint_group(info, gpt_lora_group(*merge, l));
  const double scale = merge->lora.scale();
  for (const LoraSite& x : lora_sites(*merge)) {
    const float* A = ad.data() + x.a;  // [r, in]
    const float* B = ad.data() + x.b;  // [out, r]
    for (int i = 0; i < x.out; ++i) {
      float* row = w.data() + x.weight + static_cast<uint64_t>(x.col0 + i) * static_cast<uint64_t>(x.in);
      for (int c = 0; c < x.in; ++c) {
        double sum = 0;
        for (int k = 0; k < r; ++k) sum += static_cast<double>(B[i * r + k]) * A[static_cast<size_t>(k) * x.in + c];
        row[c] += static_cast<float>(scale * sum);
      }
    }
  }
  return w;
}

uint64_t write_planned_file(const std::string& path, const std::vector<PlannedTensor>& plan, size_t f, DType type,
                            OutOfRange out_of_range, const CheckpointInfo& info, const json& metadata,
                            std::pair<size_t, std::vector<float>>* cache, const GptShape* merge = nullptr) {
  const char* st_dtype = type == DType::BF16 ? "BF16" : type == DType::F16 ? "F16" : "F32";
  const uint64_t eb = dtype_size(type);
  json header = json::object();
  uint64_t data = 0;
  for (const PlannedTensor& p : plan)
    if (p.file == f) {
      header[p.name] = {{"dtype", st_dtype}, {"shape", gpt2_shape(*p.t)}, {"data_offsets", {p.offset, p.offset + p.bytes}}};
      data = p.offset + p.bytes;
    }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t hlen = text.size();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("creating the safetensors file", path, 0, 0, errno, kOutFull);
  try {
    Writer w(fd, path);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hlen >> (8 * i));  // little-endian
    w.put(len, 8);
    w.put(text.data(), text.size());
    std::vector<float> tr;
    std::vector<std::byte> typed;
    // A 16-bit export narrows: a weight beyond the type's range is refused or clamped.
    const auto put = [&](const PlannedTensor& p, const float* src, uint64_t n) {
      typed.resize(n * eb);
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", largest_finite(type));
      narrow_from_f32(typed.data(), type, src, n, out_of_range, "tensor '" + p.name + "' of checkpoint '" + info.dir + "'",
                      std::string("export it in a type whose range holds it (--dtype bf16 or f32), or pass --clamp to "
                                  "clamp such values to +-") + limit);
      w.put(typed.data(), typed.size());
    };
    for (const PlannedTensor& p : plan) {
      if (p.file != f) continue;
      if (cache->first != p.group || cache->second.empty())
        *cache = {p.group, read_group(info, p.group, merge)};
      const GptTensor& t = *p.t;
      const float* src = cache->second.data() + t.offset;
      if (!t.transposed_in_gpt2) {
        put(p, src, t.numel());
        continue;
      }
      // [out, in] -> [in, out]
      const auto rows = static_cast<uint64_t>(t.shape[0]), cols = static_cast<uint64_t>(t.shape[1]);
      tr.resize(rows * cols);
      for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < cols; ++c) tr[c * rows + r] = src[r * cols + c];
      put(p, tr.data(), tr.size());
    }
    w.flush();
    STRATA_CHECK(w.written() == 8 + hlen + data, "export wrote " + std::to_string(w.written()) + " bytes, planned " +
                                                    std::to_string(8 + hlen + data));
    if (::fsync(fd) != 0) throw IoError("fsync of the safetensors file", path, 0, 0, errno, kOutFull);
    const int closed = ::close(fd);
    fd = -1;
    if (closed != 0) throw IoError("closing the safetensors file", path, 0, 0, errno, kOutFull);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  return 8 + hlen + data;
}

ExportSummary summary(const CheckpointInfo& info, const std::string& out, DType type, const GptShape& shape,
                      const std::vector<PlannedTensor>& plan, int files) {
  ExportSummary s;
  s.checkpoint = info.dir;
  s.out = out;
  s.step = info.step;
  s.dtype = type;
  s.shape = shape;
  s.tensors = static_cast<int>(plan.size());
  for (const auto& p : plan) s.parameters += p.t->numel();
  s.files = files;
  return s;
}

void fsync_directory(const fs::path& dir) {
  if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);  // the rename's durability; the files themselves are complete either way
    ::close(d);
  }
}

// What an export reads: the checkpoint `checkpoint` names (a checkpoint_dir stands for
// its latest), its GPT, and the tensors' type. The checkpoint holds fp32 master weights;
// a 16-bit export rounds them to nearest even, which gives exactly the working
// parameters the run computed with.
struct Source {
  CheckpointInfo info;
  GptShape shape;
  DType type = DType::F32;
  std::vector<GptGroup> groups;
};

// The checkpoint `checkpoint` names: itself, or a checkpoint_dir's latest complete one.
std::string checkpoint_to_read(const std::string& checkpoint) {
  std::error_code ec;
  std::string dir = checkpoint;
  if (fs::is_directory(dir, ec) && !fs::exists(fs::path(dir) / "manifest.json", ec)) {
    if (auto latest = latest_checkpoint(dir)) dir = *latest;
  }
  return dir;
}

// No output of the export is what it reads (output_guard.hpp): --out and standard output
// against the checkpoint `dir` and its files. After the rules of --out alone, whose
// messages say more about a path inside a checkpoint.
void check_export_outputs(const std::string& dir, const std::string& out) {
  std::vector<RunPath> inputs = files_in(dir, "--checkpoint");
  inputs.push_back({dir, "--checkpoint"});
  check_outputs_replace_no_input(inputs, {{out, "--out"}, standard_output()});
}

// `dir`: checkpoint_to_read's.
Source export_source(const std::string& dir, std::optional<DType> dtype) {
  Source src;
  src.info = read_checkpoint_info(dir);
  src.shape = checkpoint_gpt_shape(src.info);
  src.type = dtype ? *dtype : parse_precision(src.info.precision);
  src.groups = gpt_groups(src.shape);
  return src;
}

}  // namespace

ExportSummary export_safetensors(const std::string& checkpoint, const std::string& out, bool overwrite,
                                 std::optional<DType> dtype, OutOfRange out_of_range) {
  if (checkpoint.empty()) throw ConfigError("no checkpoint given: pass --checkpoint DIR (a step-<N> directory)");
  if (out.empty()) throw ConfigError("no output file given: pass --out FILE.safetensors");
  std::error_code ec;
  // The output first: refused before the checkpoint is read or anything is written.
  const fs::path outp(out);
  if (fs::is_directory(outp, ec)) throw ConfigError("--out '" + out + "' is a directory: give a file name");
  // Not a device, a FIFO, ... and not inside a checkpoint, with --force or without: the
  // rename below would replace whatever is there.
  check_output_path(out, "--out");
  if (fs::exists(outp, ec) && !overwrite)
    throw ConfigError("--out '" + out + "' exists already: pass --force to replace it, or choose another name");
  fs::path parent = outp.parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    throw ConfigError("--out '" + out + "': directory '" + parent.string() + "' does not exist; create it first");
  const std::string dir = checkpoint_to_read(checkpoint);
  check_export_outputs(dir, out);
  const Source src = export_source(dir, dtype);
  const CheckpointInfo& info = src.info;
  const GptShape& shape = src.shape;
  const DType type = src.type;
  size_t files = 0;
  const std::vector<PlannedTensor> plan = plan_tensors(src.groups, dtype_size(type), "", UINT64_MAX, &files);
  const json metadata = {{"format", "pt"},
                         {"strata_step", std::to_string(info.step)},
                         {"strata_precision", info.precision},
                         {"strata_shape", model_json(shape).dump()},
                         {"strata_config", info.config.dump()}};
  const fs::path tmp = parent / ("." + outp.filename().string() + ".tmp-" + std::to_string(::getpid()));
  std::pair<size_t, std::vector<float>> cache{0, {}};
  uint64_t bytes = 0;
  try {
    bytes = write_planned_file(tmp.string(), plan, 0, type, out_of_range, info, metadata, &cache);
    check_output_path(out, "--out");  // again: minutes have passed since the first look
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  if (::rename(tmp.c_str(), outp.c_str()) != 0) {
    const int err = errno;
    fs::remove(tmp, ec);
    throw IoError("renaming the safetensors file into place", out, 0, 0, err, kOutFull);
  }
  fsync_directory(parent);
  ExportSummary s = summary(info, out, type, shape, plan, 1);
  s.bytes = bytes;
  return s;
}

namespace {

// LlamaConfig's keys for this shape, as save_pretrained writes them.
json llama_hf_config(const GptShape& s, const char* torch_dtype, const CheckpointInfo& info) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"num_hidden_layers", s.layers},
          {"hidden_size", s.d_model},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv()},
          {"head_dim", s.head_dim()},
          {"intermediate_size", s.ffn_dim()},
          {"max_position_embeddings", s.seq_len},
          {"vocab_size", s.vocab},
          {"rms_norm_eps", s.norm_eps},
          {"rope_theta", s.rope_theta},
          {"rope_scaling", nullptr},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"pretraining_tp", 1},
          {"tie_word_embeddings", s.tied_head},
          {"torch_dtype", torch_dtype},
          {"strata_checkpoint", info.dir},
          {"strata_step", info.step}};
}

// GPT2Config's keys for this shape, as save_pretrained writes them.
json gpt2_hf_config(const GptShape& s, const char* torch_dtype, const CheckpointInfo& info) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_layer", s.layers},
          {"n_embd", s.d_model},
          {"n_head", s.heads},
          {"n_positions", s.seq_len},
          {"n_ctx", s.seq_len},
          {"vocab_size", s.vocab},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"tie_word_embeddings", true},
          {"scale_attn_weights", true},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"torch_dtype", torch_dtype},
          {"strata_checkpoint", info.dir},
          {"strata_step", info.step}};
}

// An existing --out (dirp): an empty directory, or (with --force) an earlier export, which
// holds nothing but what an export writes. Anything else is never replaced. Returns
// whether dirp holds an earlier export to replace.
bool check_hf_out(const std::string& out, const fs::path& dirp, bool overwrite, bool peft = false) {
  std::error_code ec;
  if (!fs::exists(dirp, ec)) return false;
  if (!fs::is_directory(dirp, ec)) throw ConfigError("--out '" + out + "' exists and is not a directory");
  bool empty = true, ours = fs::exists(dirp / (peft ? "adapter_config.json" : "config.json"), ec);
  for (const auto& e : fs::directory_iterator(dirp, ec)) {
    empty = false;
    const std::string n = e.path().filename().string();
    if (peft ? !(n == "adapter_config.json" || n == "adapter_model.safetensors")
             : !(n == "config.json" || n == "model.safetensors.index.json" ||
                 (n.rfind("model", 0) == 0 && n.ends_with(".safetensors"))))
      ours = false;
  }
  if (!empty && !(overwrite && ours))
    throw ConfigError("--out '" + out + "' is not empty" +
                      (ours ? std::string(": pass --force to replace the earlier export in it")
                            : ": it holds files an export does not write, which are never replaced; give a new directory"));
  return !empty;
}

}  // namespace


// A finished export directory tmp into place at dirp (its parent's entry): an earlier
// export is moved aside first (replace) and removed after; on a failure it comes back.
static void move_into_place(const fs::path& tmp, const fs::path& dirp, bool replace) {
  std::error_code ec;
  const fs::path parent = dirp.parent_path();
  fsync_directory(tmp);
  const fs::path old = parent / ("." + dirp.filename().string() + ".old-" + std::to_string(::getpid()));
  if (replace && ::rename(dirp.c_str(), old.c_str()) != 0)
    throw IoError("moving the earlier export aside", dirp.string(), 0, 0, errno, kOutFull);
  if (!replace) fs::remove(dirp, ec);  // an empty directory
  if (::rename(tmp.c_str(), dirp.c_str()) != 0) {
    const int err = errno;
    if (replace) ::rename(old.c_str(), dirp.c_str());
    throw IoError("renaming the export into place", dirp.string(), 0, 0, err, kOutFull);
  }
  if (replace) fs::remove_all(old, ec);
  fsync_directory(parent);
}

ExportSummary export_hf(const std::string& checkpoint, const std::string& out, bool overwrite,
                        std::optional<DType> dtype, uint64_t shard_bytes, OutOfRange out_of_range) {
  if (checkpoint.empty()) throw ConfigError("no checkpoint given: pass --checkpoint DIR (a step-<N> directory)");
  if (out.empty()) throw ConfigError("no output directory given: pass --out DIR");
  if (shard_bytes == 0) throw ConfigError("--shard-size is 0: give a size such as 5GB");
  std::error_code ec;
  const fs::path outp = fs::absolute(fs::path(out)).lexically_normal();
  const fs::path dirp = outp.filename().empty() ? outp.parent_path() : outp;
  if (const std::string ck = enclosing_checkpoint(dirp.string()); !ck.empty())
    throw ConfigError("--out '" + out + "' lies inside checkpoint directory '" + ck + "': write it outside");
  const bool replace = check_hf_out(out, dirp, overwrite);
  const fs::path parent = dirp.parent_path();
  if (!fs::is_directory(parent, ec))
    throw ConfigError("--out '" + out + "': directory '" + parent.string() + "' does not exist; create it first");
  const std::string dir = checkpoint_to_read(checkpoint);
  check_export_outputs(dir, out);
  const Source src = export_source(dir, dtype);
  const CheckpointInfo& info = src.info;
  const GptShape& shape = src.shape;
  const DType type = src.type;
  size_t files = 0;
  // save_pretrained's names: GPT2LMHeadModel's under "transformer." (its head is tied to wte
  // and not written); LlamaForCausalLM's as the layout has them (lm_head when untied).
  // A LoRA checkpoint: the base model with its adapters merged (no adapter tensors).
  const std::vector<PlannedTensor> plan =
      plan_tensors(src.groups, dtype_size(type), shape.llama() ? "" : "transformer.", shard_bytes, &files, 0,
                   static_cast<size_t>(gpt_final_group(shape)) + 1);
  auto file_name = [&](size_t f) {
    if (files == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", f + 1, files);
    return std::string(buf);
  };

  const fs::path tmp = parent / ("." + dirp.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw IoError("creating the export directory", tmp.string(), 0, 0, ec.value(), kOutFull);
  ExportSummary s;
  try {
    std::pair<size_t, std::vector<float>> cache{0, {}};
    for (size_t f = 0; f < files; ++f)
      s.bytes += write_planned_file((tmp / file_name(f)).string(), plan, f, type, out_of_range, info, {{"format", "pt"}},
                                    &cache, &shape);
    if (files > 1) {
      json map = json::object();
      uint64_t total = 0;
      for (const auto& p : plan) map[p.name] = file_name(p.file), total += p.bytes;
      const std::string idx = json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n";
      std::ofstream(tmp / "model.safetensors.index.json") << idx;
    }
    const char* torch_dtype = type == DType::BF16 ? "bfloat16" : type == DType::F16 ? "float16" : "float32";
    const json config =
        shape.llama() ? llama_hf_config(shape, torch_dtype, info) : gpt2_hf_config(shape, torch_dtype, info);
    std::ofstream cf(tmp / "config.json");
    cf << config.dump(2) << "\n";
    cf.close();
    if (!cf) throw IoError("writing config.json", (tmp / "config.json").string(), 0, 0, EIO, kOutFull);
    move_into_place(tmp, dirp, replace);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  const uint64_t bytes = s.bytes;
  s = summary(info, dirp.string(), type, shape, plan, static_cast<int>(files));
  s.bytes = bytes;
  return s;
}

ExportSummary export_peft(const std::string& checkpoint, const std::string& out, bool overwrite,
                          std::optional<DType> dtype) {
  if (checkpoint.empty()) throw ConfigError("no checkpoint given: pass --checkpoint DIR (a step-<N> directory)");
  if (out.empty()) throw ConfigError("no output directory given: pass --out DIR");
  std::error_code ec;
  const fs::path outp = fs::absolute(fs::path(out)).lexically_normal();
  const fs::path dirp = outp.filename().empty() ? outp.parent_path() : outp;
  if (const std::string ck = enclosing_checkpoint(dirp.string()); !ck.empty())
    throw ConfigError("--out '" + out + "' lies inside checkpoint directory '" + ck + "': write it outside");
  const bool replace = check_hf_out(out, dirp, overwrite, true);
  const fs::path parent = dirp.parent_path();
  if (!fs::is_directory(parent, ec))
    throw ConfigError("--out '" + out + "': directory '" + parent.string() + "' does not exist; create it first");
  const std::string dir = checkpoint_to_read(checkpoint);
  check_export_outputs(dir, out);
  const Source src = export_source(dir, dtype);
  const GptShape& shape = src.shape;
  if (!shape.has_lora())
    throw ConfigError("checkpoint '" + dir + "' has no LoRA adapters (its run had no strata.lora): export the whole "
                      "model with --format hf or --format safetensors");
  size_t files = 0;
  const std::vector<PlannedTensor> plan =
      plan_tensors(src.groups, dtype_size(src.type), std::string("base_model.model.") + (shape.llama() ? "" : "transformer."),
                   UINT64_MAX, &files, static_cast<size_t>(gpt_lora_group(shape, 0)));
  const fs::path tmp = parent / ("." + dirp.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw IoError("creating the export directory", tmp.string(), 0, 0, ec.value(), kOutFull);
  ExportSummary s;
  try {
    std::pair<size_t, std::vector<float>> cache{0, {}};
    s.bytes = write_planned_file((tmp / "adapter_model.safetensors").string(), plan, 0, src.type, OutOfRange::Refuse,
                                 src.info, {{"format", "pt"}}, &cache);
    std::ofstream cf(tmp / "adapter_config.json");
    cf << peft_adapter_config(shape).dump(2) << "\n";
    cf.close();
    if (!cf) throw IoError("writing adapter_config.json", (tmp / "adapter_config.json").string(), 0, 0, EIO, kOutFull);
    move_into_place(tmp, dirp, replace);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  const uint64_t bytes = s.bytes;
  s = summary(src.info, dirp.string(), src.type, shape, plan, 1);
  s.bytes = bytes;
  return s;
}

}  // namespace strata
