// A checkpoint's manifest.json: its body, checksum and the checks made when it is read
// (checkpoint.hpp: parse_checkpoint_manifest). Apart from checkpoint.cpp so that the fuzz
// target (tests/fuzz/fuzz_manifest.cpp) builds it alone.
#include <xxhash.h>

#include <climits>
#include <cmath>
#include <string>

#include "checkpoint_format.hpp"
#include "strata/core/error.hpp"
#include "strata/core/safe_io.hpp"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

namespace checkpoint_format {

namespace {
// A manifest's integer field, which must be a JSON integer (not 1.5, not 1e300) within
// [lo, hi]: read without a conversion whose result the language leaves undefined.
template <class T>
T manifest_int(const json& parent, const char* key, const std::string& where, T lo, T hi) {
  const json& v = parent.at(key);
  __int128 x = lo - static_cast<__int128>(1);  // out of range unless an integer
  if (v.is_number_unsigned())
    x = v.get<uint64_t>();
  else if (v.is_number_integer())
    x = v.get<int64_t>();
  const bool ok = x >= static_cast<__int128>(lo) && x <= static_cast<__int128>(hi);
  const T out = static_cast<T>(x);
  if (!ok)
    throw CorruptionError(where + " has '" + key + "' = " + v.dump() + ", not an integer from " + std::to_string(lo) +
                          " to " + std::to_string(hi) + ": it is damaged or was not written by this Strata");
  return out;
}

}  // namespace

json info_to_json(const CheckpointInfo& info) {
  json groups = json::array();
  for (const auto& g : info.groups) {
    json e = {{"name", g.name}, {"numel", g.numel}, {"padded", g.padded}, {"shard", g.shard}};
    if (g.frozen) e["frozen"] = true;
    groups.push_back(std::move(e));
  }
  json files = json::array();
  for (const auto& f : info.files) {
    json segs = json::array();
    for (uint64_t h : f.segments) segs.push_back(hex64(h));
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", segs}});
  }
  json j = {{"format", kFormat}, {"version", kVersion}, {"step", info.step},     {"world_size", info.world_size},
            {"groups", groups},  {"files", files},      {"config", info.config}, {"extra", info.extra},
            {"optimizer_steps", info.optimizer_steps}, {"precision", info.precision}};
  if (info.loss_scaler) {
    const LossScalerState& ls = *info.loss_scaler;
    j["loss_scaler"] = {{"scale", ls.scale},
                        {"iter", ls.iter},
                        {"last_overflow_iter", ls.last_overflow_iter},
                        {"hysteresis", ls.hysteresis}};
  }
  return j;
}

uint64_t manifest_hash(const json& body) {
  const std::string s = body.dump();
  return XXH3_64bits(s.data(), s.size());
}

uint64_t group_offset(const CheckpointInfo& info, size_t g) {
  uint64_t off = 0;
  for (size_t i = 0; i < g; ++i) off += kStates * 4 * info.groups[i].shard;
  return off;
}

CheckpointInfo parse_manifest(const fs::path& dir, const fs::path& mpath, const std::string& text) {
  const std::string where = "checkpoint manifest '" + mpath.string() + "'";
  json j = parse_untrusted_json(text);  // bounded nesting (core/safe_io.hpp)
  if (j.is_discarded() || !j.is_object())
    throw CorruptionError(where + " is not valid JSON: it is damaged; resume from another checkpoint");
  if (!j.contains("checksum") || !j["checksum"].is_string())
    throw CorruptionError(where + " has no checksum: it is damaged or was not written by Strata");
  const std::string stored = j["checksum"].get<std::string>();
  j.erase("checksum");
  const std::string computed = hex64(manifest_hash(j));
  if (stored != computed)
    throw CorruptionError(where + " is damaged: its checksum is " + stored + ", its contents hash to " + computed +
                          "; resume from another checkpoint");
  constexpr int64_t kMaxI64 = INT64_MAX;
  constexpr uint64_t kMaxU64 = UINT64_MAX;
  auto bad = [&](const std::string& what) { throw CorruptionError(where + " is inconsistent: " + what); };
  try {
    if (j.at("format").get<std::string>() != kFormat)
      throw CorruptionError(where + " is not a Strata checkpoint (format '" + j.at("format").get<std::string>() + "')");
    const int version = manifest_int<int>(j, "version", where, INT_MIN, INT_MAX);
    if (version != kVersion)
      throw ConfigError(where + " has format version " + std::to_string(version) + "; this Strata reads version " +
                        std::to_string(kVersion) + ": use the Strata that wrote it");
    CheckpointInfo info;
    info.dir = dir.string();
    info.step = manifest_int<int64_t>(j, "step", where, 0, kMaxI64);
    // Written since 16-bit training; older checkpoints trained in fp32 without skips.
    info.optimizer_steps =
        j.contains("optimizer_steps") ? manifest_int<int64_t>(j, "optimizer_steps", where, 0, kMaxI64) : info.step;
    info.precision = j.contains("precision") ? j.at("precision").get<std::string>() : "f32";
    if (info.precision != "f32" && info.precision != "bf16" && info.precision != "fp16")
      bad("precision '" + info.precision + "' (f32, bf16 or fp16)");
    if (j.contains("loss_scaler")) {
      const json& ls = j.at("loss_scaler");
      const double scale = ls.at("scale").get<double>();
      if (!std::isfinite(scale) || scale <= 0) bad("loss scale " + ls.at("scale").dump());
      info.loss_scaler = LossScalerState{scale, manifest_int<int64_t>(ls, "iter", where, -1, kMaxI64),
                                         manifest_int<int64_t>(ls, "last_overflow_iter", where, -1, kMaxI64),
                                         manifest_int<int>(ls, "hysteresis", where, 0, INT_MAX)};
    }
    info.world_size = manifest_int<int>(j, "world_size", where, 1, 1 << 20);
    info.config = j.at("config");
    info.extra = j.at("extra");
    for (const auto& g : j.at("groups"))
      info.groups.push_back({g.at("name").get<std::string>(), manifest_int<uint64_t>(g, "numel", where, 1, kMaxU64),
                             manifest_int<uint64_t>(g, "padded", where, 1, kMaxU64),
                             manifest_int<uint64_t>(g, "shard", where, 1, kMaxU64),
                             g.contains("frozen") && g.at("frozen").get<bool>()});
    for (const auto& f : j.at("files")) {
      CheckpointFile cf{f.at("name").get<std::string>(), manifest_int<uint64_t>(f, "bytes", where, 0, kMaxU64), {}};
      for (const auto& h : f.at("xxh3")) {
        const std::string& hex = h.get_ref<const std::string&>();
        if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
          throw CorruptionError(where + " has a malformed checksum '" + hex + "': it is damaged");
        cf.segments.push_back(std::stoull(hex, nullptr, 16));
      }
      info.files.push_back(std::move(cf));
    }
    // The numbers must fit together, or reading would go wrong later; no product or sum
    // may wrap around.
    if (info.groups.empty()) bad("no parameter groups");
    if (info.files.size() != static_cast<size_t>(info.world_size))
      bad(std::to_string(info.files.size()) + " rank files for world_size " + std::to_string(info.world_size));
    uint64_t bytes = 0;
    for (const auto& g : info.groups) {
      uint64_t padded = 0, group_bytes = 0;
      if (__builtin_mul_overflow(g.shard, static_cast<uint64_t>(info.world_size), &padded) || padded != g.padded ||
          g.numel > g.padded || __builtin_mul_overflow(g.shard, uint64_t{kStates * 4}, &group_bytes) ||
          __builtin_add_overflow(bytes, group_bytes, &bytes))
        bad("group '" + g.name + "' has numel " + std::to_string(g.numel) + ", padded " + std::to_string(g.padded) +
            ", shard " + std::to_string(g.shard));
    }
    for (size_t r = 0; r < info.files.size(); ++r) {
      const auto& f = info.files[r];
      if (f.name != rank_file(static_cast<int>(r))) bad("file " + std::to_string(r) + " is named '" + f.name + "'");
      if (f.bytes != bytes) bad("'" + f.name + "' is listed with " + std::to_string(f.bytes) + " bytes, the groups need " + std::to_string(bytes));
      if (f.segments.size() != kStates * info.groups.size()) bad("'" + f.name + "' has a wrong number of checksums");
    }
    return info;
  } catch (const json::exception& e) {
    throw CorruptionError(where + " lacks a field or has one of the wrong type (" + std::string(e.what()) +
                          "): it is damaged or was not written by this Strata");
  }
}

}  // namespace checkpoint_format

CheckpointInfo parse_checkpoint_manifest(const std::string& dir, const std::string& text) {
  return checkpoint_format::parse_manifest(fs::path(dir), fs::path(dir) / "manifest.json", text);
}

std::string seal_checkpoint_manifest(nlohmann::json body) {
  body.erase("checksum");
  body["checksum"] = checkpoint_format::hex64(checkpoint_format::manifest_hash(body));
  return body.dump(1) + "\n";
}

}  // namespace strata
