// Loading checkpoints (checkpoint.hpp): reading and checking a manifest and its files,
// and each rank's slices of the saved groups, resharded to the engine's ranks and groups.
#include <fcntl.h>
#include <sys/stat.h>

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>

#include "checkpoint_format.hpp"
#include "checkpoint_io.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/core/log.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/core/value_checks.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/runtime/engine/parted_source.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/formats/export.hpp"

namespace strata {

namespace fs = std::filesystem;

using namespace checkpoint_format;  // NOLINT: the format's names, used throughout
using namespace checkpoint_detail;  // NOLINT: checkpoint_io.hpp's file I/O and agreement

namespace {

// A regular file only (a FIFO would block, /dev/zero never end), of bounded size.
std::string read_text(const fs::path& p) { return read_input_file(p, "checkpoint manifest", 256 << 20); }

// Reading elements [begin, begin + count) of group g, of the states in `outs` (nullptr:
// not wanted), from the writers' files. Elements at or beyond numel are padding: 0.
// Every writer segment touched is read whole and its checksum verified.
void read_range(const CheckpointInfo& info, size_t g, uint64_t begin, uint64_t count, float* const outs[kStates]) {
  const CheckpointGroup& gr = info.groups.at(g);
  const uint64_t end = begin + count;
  for (int k = 0; k < kStates; ++k)
    if (outs[k] && end > gr.numel) {
      const uint64_t from = std::max(begin, gr.numel);
      std::fill(outs[k] + (from - begin), outs[k] + count, 0.0f);
    }
  const uint64_t data_end = std::min(end, gr.numel);
  if (begin >= data_end) return;
  const uint64_t S = gr.shard;
  const uint64_t goff = group_offset(info, g);
  std::vector<float> seg;
  for (uint64_t w = begin / S; w <= (data_end - 1) / S; ++w) {
    const CheckpointFile& file = info.files.at(w);
    const std::string path = (fs::path(info.dir) / file.name).string();
    Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.fd < 0) {
      const int err = errno;
      if (err == ENOENT)
        throw CorruptionError("checkpoint file '" + path + "' is missing: the checkpoint is incomplete; resume from another one");
      throw IoError("opening checkpoint file", path, 0, 0, err, kCheckpointDiskFull);
    }
    const uint64_t lo = std::max(begin, w * S), hi = std::min(data_end, (w + 1) * S);  // global
    for (int k = 0; k < kStates; ++k) {
      if (!outs[k]) continue;
      const uint64_t off = goff + static_cast<uint64_t>(k) * S * 4;
      // Same sharding: the slice is the whole segment, read straight into place.
      const bool whole = lo == w * S && hi - lo == S;
      float* dst = whole ? outs[k] + (lo - begin) : nullptr;
      if (!whole) {
        seg.resize(S);
        dst = seg.data();
      }
      read_exact(f.fd, dst, S * 4, off, path);
      const uint64_t got = XXH3_64bits(dst, S * 4), want = file.segments[kStates * g + k];
      if (got != want)
        throw CorruptionError("checkpoint file '" + path + "' is corrupt: the " + kStateNames[k] + " of group '" +
                              gr.name + "' (bytes " + std::to_string(off) + " to " + std::to_string(off + S * 4) +
                              ") has xxh3 " + hex64(got) + ", the manifest expects " + hex64(want) +
                              "; resume from another checkpoint");
      if (!whole) std::memcpy(outs[k] + (lo - begin), seg.data() + (lo - w * S), (hi - lo) * 4);
    }
  }
}

// Groups saved in parts (gpt_parts, "block.3@1536") belong to the group they cut: the
// model's groups, each with its parts' indices and first elements. A name without '@' is a
// whole group. Parts must follow each other from element 0.
struct ModelGroup {
  std::string name;
  uint64_t numel = 0;
  std::vector<size_t> parts;      // indices into the list the groups came from
  std::vector<uint64_t> offsets;  // each part's first element in the model group
};

template <class NameOf, class NumelOf>
std::vector<ModelGroup> merge_parts(size_t n, NameOf name_of, NumelOf numel_of, const std::string& where) {
  std::vector<ModelGroup> out;
  for (size_t k = 0; k < n; ++k) {
    const PartName pn = parse_part_name(name_of(k));
    if (pn.offset == 0 || out.empty() || out.back().name != pn.group) out.push_back({pn.group, 0, {}, {}});
    ModelGroup& m = out.back();
    if (pn.offset != m.numel)
      throw CorruptionError(where + ": group '" + name_of(k) + "' starts at element " + std::to_string(pn.offset) +
                            " of '" + pn.group + "', whose parts before it end at " + std::to_string(m.numel));
    m.parts.push_back(k);
    m.offsets.push_back(m.numel);
    m.numel += numel_of(k);
  }
  return out;
}

std::vector<ModelGroup> model_groups(const CheckpointInfo& info) {
  return merge_parts(
      info.groups.size(), [&](size_t k) { return info.groups[k].name; }, [&](size_t k) { return info.groups[k].numel; },
      "checkpoint '" + info.dir + "'");
}

std::vector<ModelGroup> model_groups(const ZeroEngine& engine) {
  return merge_parts(
      static_cast<size_t>(engine.num_groups()), [&](size_t k) { return engine.group_name(static_cast<int>(k)); },
      [&](size_t k) { return engine.group_numel(static_cast<int>(k)); }, "the engine's groups");
}

// Elements [begin, begin + count) of the model's group m (within its numel), of the states
// in `outs`, from whichever saved groups (parts) hold them.
void read_model_range(const CheckpointInfo& info, const ModelGroup& m, uint64_t begin, uint64_t count,
                      float* const outs[kStates]) {
  const uint64_t end = begin + count;
  STRATA_CHECK(end <= m.numel, "read_model_range beyond its group");
  for (size_t i = 0; i < m.parts.size(); ++i) {
    const uint64_t lo_p = m.offsets[i], hi_p = lo_p + info.groups[m.parts[i]].numel;
    const uint64_t lo = std::max(begin, lo_p), hi = std::min(end, hi_p);
    if (lo >= hi) continue;
    float* sub[kStates];
    for (int k = 0; k < kStates; ++k) sub[k] = outs[k] ? outs[k] + (lo - begin) : nullptr;
    read_range(info, m.parts[i], lo - lo_p, hi - lo, sub);
  }
}

// The tensors of a checkpoint's model groups, for messages about their values: a GPT
// checkpoint's are the layout's ("h.0.attn.c_attn.weight"); any other's (the C API's)
// are its groups, a tensor each.
class TensorNames {
 public:
  explicit TensorNames(const CheckpointInfo& info) : dir_(info.dir) {
    try {
      gpt_ = gpt_groups(checkpoint_gpt_shape(info));
    } catch (const ConfigError&) {
      gpt_.clear();  // not a GPT: named by group
    }
  }
  // fn(what, begin, end, index): for each tensor that elements [lo, hi) of model group mg
  // (named `group`) reach, its name, its part of the range and the part's first element's
  // flat index in the tensor.
  template <class F>
  void spans(size_t mg, const std::string& group, uint64_t lo, uint64_t hi, F&& fn) const {
    const std::string in = "checkpoint '" + dir_ + "': ";
    if (mg >= gpt_.size()) return fn(in + "group '" + group + "'", lo, hi, lo);
    for (const GptTensor& t : gpt_[mg].tensors) {
      const uint64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel());
      if (a >= b) continue;
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      fn(in + "tensor '" + t.name + "' [" + shape + "]", a, b, a - t.offset);
    }
  }

 private:
  std::string dir_;
  std::vector<GptGroup> gpt_;  // empty: not a GPT checkpoint
};

// What a load says of a weight that is NaN or inf, and of one the working type cannot hold.
constexpr const char* kNonFiniteFix =
    "a model with it computes NaN (a run that diverged, or weights imported before imports checked them): resume "
    "or fine-tune from an earlier checkpoint, or import the model again";
std::string range_fix(DType working) {
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", largest_finite(working));
  return std::string("use bf16 or f32, whose range holds it (a run's bf16 section instead of fp16, strata eval "
                     "--precision), or clamp such values to +-") +
         limit + " (strata.out_of_range = \"clamp\" for a run or a C API runtime)";
}

// The values a load read, elements [lo, lo + count) of model group mg into outs (null:
// not read): every state finite, and the master weights within the range of `working`,
// which they are rounded to (clamped there with OutOfRange::Clamp).
void check_values(const TensorNames& names, size_t mg, const std::string& group, uint64_t lo, uint64_t count,
                  float* const outs[kStates], DType working, OutOfRange mode) {
  names.spans(mg, group, lo, lo + count, [&](const std::string& what, uint64_t a, uint64_t b, uint64_t index) {
    for (int k = 0; k < kStates; ++k)
      if (outs[k])
        check_finite(outs[k] + (a - lo), b - a, k == 0 ? what : "the " + std::string(kStateNames[k]) + " of " + what,
                     kNonFiniteFix, index);
    if (working != DType::F32) check_range(outs[0] + (a - lo), b - a, working, mode, what, range_fix(working), index);
  });
}

// A resume needs every group trained or frozen as it was saved: a frozen group's checkpoint
// has no optimizer state to resume a trained one with, and a trained group's moments would
// be dropped. A weights-only load takes the parameters alone, whichever kind they were.
void check_frozen(ZeroEngine& engine, const CheckpointInfo& info, const std::vector<ModelGroup>& here,
                  const std::vector<ModelGroup>& saved) {
  for (size_t g = 0; g < here.size(); ++g) {
    bool frozen_here = false, frozen_saved = false;
    for (size_t k : here[g].parts) frozen_here = frozen_here || engine.group_frozen(static_cast<int>(k));
    for (size_t k : saved[g].parts) frozen_saved = frozen_saved || info.groups[k].frozen;
    if (frozen_here != frozen_saved)
      throw ConfigError("checkpoint '" + info.dir + "' saved group '" + saved[g].name + "' " +
                        (frozen_saved ? "frozen (no gradient, no optimizer state)" : "trained (with its optimizer state)") +
                        ", and it is " + (frozen_here ? "frozen" : "trained") +
                        " here: resume with every group registered as it was saved (STRATA_GROUP_FROZEN, frozen=True "
                        "in Python), or start a new run from its weights alone (strata train --init-from)");
  }
}

void check_groups(ZeroEngine& engine, const CheckpointInfo& info, bool weights_only, size_t first_groups) {
  const std::string fix =
      "; resume with the model configuration (strata.model) the checkpoint was saved with, or start a new run with "
      "another strata.checkpoint_dir";
  std::vector<ModelGroup> here = model_groups(engine);
  const std::vector<ModelGroup> saved = model_groups(info);
  if (here.size() > first_groups) here.resize(first_groups);
  if (here.size() != saved.size())
    throw ConfigError("checkpoint is of another model shape: the model here has " + std::to_string(here.size()) +
                      " parameter groups, the checkpoint '" + info.dir + "' has " + std::to_string(saved.size()) + fix);
  for (size_t g = 0; g < here.size(); ++g)
    if (here[g].numel != saved[g].numel)
      throw ConfigError("checkpoint is of another model shape: group '" + saved[g].name + "' has " +
                        std::to_string(here[g].numel) + " elements here, " + std::to_string(saved[g].numel) +
                        " in the checkpoint '" + info.dir + "'" + fix);
  if (!weights_only) check_frozen(engine, info, here, saved);
}


// Collective: checks `dir` against the engine, then gives each rank its slice of every
// group: the masters and, unless weights_only, the moments (weights_only: zeros, and the
// optimizer's step count 0). Every rank gets the same error.
CheckpointInfo load_shards(ZeroEngine& engine, coll::Communicator& host, const std::string& dir, bool weights_only,
                           size_t first_groups = SIZE_MAX) {
  const int rank = host.rank();
  STRATA_CHECK(host.size() == engine.comm().size() && rank == engine.comm().rank(),
               "loading a checkpoint: the host communicator must span the engine's ranks in the same order");
  CheckpointInfo info;
  std::exception_ptr ep;
  try {
    info = read_checkpoint_info(dir);
    check_groups(engine, info, weights_only, first_groups);
  } catch (...) {
    ep = std::current_exception();
  }
  if (auto f = agree(host, ep)) f->raise(rank);

  // Each engine group (a whole group, or a part of one) reads its elements of the model's
  // group from whichever saved groups hold them: the same cut, or another. Their values
  // are checked before the engine holds them (check_values).
  std::vector<ModelGroup> here = model_groups(engine);
  const std::vector<ModelGroup> saved = model_groups(info);
  if (here.size() > first_groups) here.resize(first_groups);
  const TensorNames names(info);
  const OutOfRange out_of_range = engine.resolved().options.out_of_range;
  for (size_t mg = 0; mg < here.size(); ++mg)
    for (size_t i = 0; i < here[mg].parts.size(); ++i) {
      const int g = static_cast<int>(here[mg].parts[i]);
      const uint64_t n = engine.shard_numel(g), numel = engine.group_numel(g);
      std::vector<float> m(n, 0.0f), a(n, 0.0f), v(n, 0.0f);
      try {
        float* outs[kStates] = {m.data(), weights_only ? nullptr : a.data(), weights_only ? nullptr : v.data()};
        const uint64_t lo = std::min(numel, static_cast<uint64_t>(rank) * n), hi = std::min(numel, lo + n);  // padding: 0
        if (hi > lo) {
          read_model_range(info, saved[mg], here[mg].offsets[i] + lo, hi - lo, outs);  // these bytes only
          check_values(names, mg, saved[mg].name, here[mg].offsets[i] + lo, hi - lo, outs, engine.dtype(), out_of_range);
        }
      } catch (...) {
        ep = std::current_exception();
      }
      if (auto f = agree(host, ep)) f->raise(rank);
      engine.write_optimizer_shard(g, m.data(), a.data(), v.data(), weights_only ? 0 : info.optimizer_steps);
    }
  return info;
}


}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError("checkpoint '" + dir + "' is not a directory: give a step-<N> directory written by Strata");
  const fs::path mpath = fs::path(dir) / "manifest.json";
  if (!fs::exists(mpath, ec))
    throw CorruptionError("checkpoint '" + dir +
                          "' has no manifest.json: it is incomplete (a save that did not finish, or files removed); "
                          "resume from another checkpoint");
  CheckpointInfo info = parse_manifest(fs::path(dir), mpath, read_text(mpath));
  for (const auto& f : info.files) {
    const fs::path p = fs::path(dir) / f.name;
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT)
        throw CorruptionError("checkpoint file '" + p.string() + "' is missing: the checkpoint is incomplete; resume from another one");
      throw IoError("stat of checkpoint file", p.string(), 0, 0, errno, kCheckpointDiskFull);
    }
    if (static_cast<uint64_t>(st.st_size) != f.bytes)
      throw CorruptionError("checkpoint file '" + p.string() + "' is " + std::to_string(st.st_size) +
                            " bytes, the manifest says " + std::to_string(f.bytes) +
                            (static_cast<uint64_t>(st.st_size) < f.bytes ? " (truncated)" : " (damaged)") +
                            "; resume from another checkpoint");
  }
  return info;
}

CheckpointInfo load_checkpoint(ZeroEngine& engine, coll::Communicator& host, const std::string& dir) {
  CheckpointInfo info = load_shards(engine, host, dir, false);
  engine.set_iterations(info.step);
  const std::string now = precision_name(engine.dtype());
  if (info.precision != now && host.rank() == 0)
    log::warn("checkpoint '" + dir + "' trained in " + info.precision + "; resuming in " + now +
              ": its fp32 master weights and moments carry over exactly, the " + now +
              " working parameters are rebuilt from them");
  if (engine.loss_scaler().enabled() && info.loss_scaler) engine.loss_scaler().restore(*info.loss_scaler);
  return info;
}

CheckpointInfo load_checkpoint_weights(ZeroEngine& engine, coll::Communicator& host, const std::string& dir,
                                       size_t first_groups) {
  return load_shards(engine, host, dir, true, first_groups);
}

std::vector<float> read_checkpoint_group(const CheckpointInfo& info, int g, DType working) {
  const std::vector<ModelGroup> groups = model_groups(info);
  if (g < 0 || static_cast<size_t>(g) >= groups.size())
    throw Error("read_checkpoint_group: group " + std::to_string(g) + " of " + std::to_string(groups.size()));
  const ModelGroup& m = groups[static_cast<size_t>(g)];
  std::vector<float> out(m.numel);
  float* outs[kStates] = {out.data(), nullptr, nullptr};
  read_model_range(info, m, 0, out.size(), outs);
  check_values(TensorNames(info), static_cast<size_t>(g), m.name, 0, out.size(), outs, working, OutOfRange::Refuse);
  return out;
}

std::vector<CheckpointGroup> checkpoint_model_groups(const CheckpointInfo& info) {
  std::vector<CheckpointGroup> out;
  for (const ModelGroup& m : model_groups(info)) out.push_back({m.name, m.numel, 0, 0});
  return out;
}

}  // namespace strata
