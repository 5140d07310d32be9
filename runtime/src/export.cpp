#include "strata/runtime/export.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/runtime/config.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What a full disk under --out asks for (IoError).
constexpr const char* kOutFull = "free space on it or give --out on a disk with room";

json shape_json(const GptShape& s) {
  return {{"layers", s.layers}, {"d_model", s.d_model}, {"heads", s.heads}, {"seq_len", s.seq_len}, {"vocab", s.vocab}};
}

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
    shape = parse_config(json{{"strata", {{"model", c["strata"]["model"]}}}}).strata.model;
  } catch (const ConfigError& e) {
    throw ConfigError("the configuration stored in checkpoint '" + info.dir +
                      "' cannot be read as a Strata configuration (" + e.what() +
                      "); export reads GPT checkpoints written by strata train");
  }
  const std::vector<GptGroup> groups = gpt_groups(shape);
  const std::string what = "checkpoint '" + info.dir + "' is not of the GPT its configuration describes (layers " +
                           std::to_string(shape.layers) + ", d_model " + std::to_string(shape.d_model) + ", seq_len " +
                           std::to_string(shape.seq_len) + ", vocab " + std::to_string(shape.vocab) + "): ";
  const std::string fix = "; export reads GPT checkpoints written by strata train";
  if (groups.size() != info.groups.size())
    throw ConfigError(what + "it has " + std::to_string(info.groups.size()) + " parameter groups, the GPT " +
                      std::to_string(groups.size()) + fix);
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].numel != info.groups[g].numel)  // names are informative (save may not know them)
      throw ConfigError(what + "its group " + std::to_string(g) + " is '" + info.groups[g].name + "' of " +
                        std::to_string(info.groups[g].numel) + " elements, the GPT's is '" + groups[g].name + "' of " +
                        std::to_string(groups[g].numel) + fix);
  return shape;
}

ExportSummary export_safetensors(const std::string& checkpoint, const std::string& out, bool overwrite,
                                std::optional<DType> dtype) {
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
  // A checkpoint_dir stands for its latest complete checkpoint.
  std::string dir = checkpoint;
  if (fs::is_directory(dir, ec) && !fs::exists(fs::path(dir) / "manifest.json", ec)) {
    if (auto latest = latest_checkpoint(dir)) dir = *latest;
  }
  const CheckpointInfo info = read_checkpoint_info(dir);
  const GptShape shape = checkpoint_gpt_shape(info);
  // The checkpoint holds fp32 master weights; a 16-bit export rounds them to nearest even,
  // which gives exactly the working parameters the run computed with.
  const DType type = dtype ? *dtype : parse_precision(info.precision);
  const char* st_dtype = type == DType::BF16 ? "BF16" : type == DType::F16 ? "F16" : "F32";
  const uint64_t eb = dtype_size(type);


  // Header: every tensor with its offsets, in the order the data follow.
  const std::vector<GptGroup> groups = gpt_groups(shape);
  json header = json::object();
  uint64_t offset = 0, params = 0;
  int tensors = 0;
  for (const GptGroup& g : groups)
    for (const GptTensor& t : g.tensors) {
      const uint64_t bytes = t.numel() * eb;
      header[t.name] = {{"dtype", st_dtype}, {"shape", gpt2_shape(t)}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
      params += t.numel();
      ++tensors;
    }
  header["__metadata__"] = {{"format", "pt"},
                            {"strata_step", std::to_string(info.step)},
                            {"strata_precision", info.precision},
                            {"strata_shape", shape_json(shape).dump()},
                            {"strata_config", info.config.dump()}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t hlen = text.size();

  const fs::path tmp = parent / ("." + outp.filename().string() + ".tmp-" + std::to_string(::getpid()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("creating the safetensors file", tmp.string(), 0, 0, errno, kOutFull);
  try {
    Writer w(fd, tmp.string());
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hlen >> (8 * i));  // little-endian
    w.put(len, 8);
    w.put(text.data(), text.size());
    std::vector<float> tr;
    std::vector<std::byte> typed;
    const auto put = [&](const float* src, uint64_t n) {
      typed.resize(n * eb);
      convert_from_f32(typed.data(), type, src, n);
      w.put(typed.data(), typed.size());
    };
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<float> flat = read_checkpoint_group(info, static_cast<int>(g));
      for (const GptTensor& t : groups[g].tensors) {
        const float* src = flat.data() + t.offset;
        if (!t.transposed_in_gpt2) {
          put(src, t.numel());
          continue;
        }
        // [out, in] -> [in, out]
        const auto rows = static_cast<uint64_t>(t.shape[0]), cols = static_cast<uint64_t>(t.shape[1]);
        tr.resize(rows * cols);
        for (uint64_t r = 0; r < rows; ++r)
          for (uint64_t c = 0; c < cols; ++c) tr[c * rows + r] = src[r * cols + c];
        put(tr.data(), tr.size());
      }
    }
    w.flush();
    STRATA_CHECK(w.written() == 8 + hlen + offset, "export wrote " + std::to_string(w.written()) + " bytes, planned " +
                                                      std::to_string(8 + hlen + offset));
    if (::fsync(fd) != 0) throw IoError("fsync of the safetensors file", tmp.string(), 0, 0, errno, kOutFull);
    const int closed = ::close(fd);
    fd = -1;
    if (closed != 0) throw IoError("closing the safetensors file", tmp.string(), 0, 0, errno, kOutFull);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    fs::remove(tmp, ec);
    throw;
  }
  try {
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
  if (const int d = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);  // the rename's durability; the file itself is complete either way
    ::close(d);
  }
  ExportSummary s;
  s.checkpoint = info.dir;
  s.out = out;
  s.step = info.step;
  s.dtype = type;
  s.shape = shape;
  s.tensors = tensors;
  s.parameters = params;
  s.bytes = 8 + hlen + offset;
  return s;
}

}  // namespace strata
