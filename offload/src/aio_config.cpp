#include "strata/offload/aio_config.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace {

constexpr uint64_t kMinBlock = 4096;
constexpr uint64_t kMaxBlock = 1ull << 30;  // a request must stay under the kernel's 2 GiB cap
constexpr uint64_t kMaxDepth = 4096;
constexpr uint64_t kMaxRings = 64;

[[noreturn]] void bad_value(const std::string& key, const nlohmann::json& v, const std::string& accepted) {
  throw ConfigError("aio." + key + " = " + v.dump() + " is invalid: expected " + accepted);
}

uint64_t get_uint(const std::string& key, const nlohmann::json& v, uint64_t lo, uint64_t hi,
                  const std::string& accepted) {
  // Booleans and floats are refused: 1.5 or true as a queue depth is a typo, not a choice.
  if (!v.is_number_integer()) bad_value(key, v, accepted);
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x < lo || x > hi) bad_value(key, v, accepted);
    return x;
  }
  int64_t x = v.get<int64_t>();
  if (x < 0 || static_cast<uint64_t>(x) < lo || static_cast<uint64_t>(x) > hi) bad_value(key, v, accepted);
  return static_cast<uint64_t>(x);
}

bool get_bool(const std::string& key, const nlohmann::json& v) {
  if (!v.is_boolean()) bad_value(key, v, "true or false");
  return v.get<bool>();
}

}  // namespace

AioConfig parse_aio_config(const nlohmann::json& j) {
  static const std::vector<std::string> kKeys = {"block_size",     "queue_depth",   "intra_op_parallelism",
                                                 "thread_count",   "single_submit", "overlap_events",
                                                 "use_sqpoll",     "engine"};
  if (!j.is_object()) throw ConfigError("aio must be a JSON object, got " + j.dump());
  AioConfig c;
  const std::string block_range = "a power of two from " + std::to_string(kMinBlock) + " to " +
                                  std::to_string(kMaxBlock) + " (bytes)";
  const std::string depth_range = "an integer from 1 to " + std::to_string(kMaxDepth);
  const std::string rings_range = "an integer from 1 to " + std::to_string(kMaxRings);
  bool have_rings = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "block_size") {
      uint64_t b = get_uint(key, v, kMinBlock, kMaxBlock, block_range);
      if ((b & (b - 1)) != 0) bad_value(key, v, block_range);
      c.block_size = b;
    } else if (key == "queue_depth") {
      c.queue_depth = static_cast<unsigned>(get_uint(key, v, 1, kMaxDepth, depth_range));
    } else if (key == "intra_op_parallelism" || key == "thread_count") {
      unsigned n = static_cast<unsigned>(get_uint(key, v, 1, kMaxRings, rings_range));
      if (have_rings && n != c.intra_op_parallelism)
        throw ConfigError("aio.thread_count and aio.intra_op_parallelism are the same setting (the older and "
                          "newer name) and disagree (" + std::to_string(c.intra_op_parallelism) + " vs " +
                          std::to_string(n) + "): keep only intra_op_parallelism");
      c.intra_op_parallelism = n;
      have_rings = true;
    } else if (key == "single_submit") {
      c.single_submit = get_bool(key, v);
    } else if (key == "overlap_events") {
      c.overlap_events = get_bool(key, v);
    } else if (key == "use_sqpoll") {
      c.use_sqpoll = get_bool(key, v);
    } else if (key == "engine") {
      const std::string accepted = "one of \"auto\", \"io_uring\", \"threadpool\"";
      if (!v.is_string()) bad_value(key, v, accepted);
      const auto s = v.get<std::string>();
      if (s == "auto")
        c.engine = IoEngineKind::Auto;
      else if (s == "io_uring")
        c.engine = IoEngineKind::Uring;
      else if (s == "threadpool")
        c.engine = IoEngineKind::ThreadPool;
      else
        bad_value(key, v, accepted);
    } else {
      throw_unknown_key("aio", key, kKeys);
    }
  }
  return c;
}

}  // namespace strata
