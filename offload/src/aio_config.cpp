// The `aio` section's table: one row per key (config_keys.hpp).
#include "strata/offload/aio_config.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace {

constexpr uint64_t kMaxRings = 64;

// thread_count is DeepSpeed's older name for intra_op_parallelism; both store into the
// same field, so two different values would leave the later row's silently.
void check_aio(const nlohmann::json& j, void* /*AioConfig*/) {
  auto rings = j.find("intra_op_parallelism"), older = j.find("thread_count");
  if (rings == j.end() || older == j.end() || rings->get<double>() == older->get<double>()) return;
  throw ConfigError("aio.thread_count and aio.intra_op_parallelism are the same setting (the older and newer "
                    "name) and disagree (" + older->dump() + " vs " + rings->dump() + "): keep only intra_op_parallelism");
}

ConfigSection make_aio_section() {
  return {
      .path = "aio",
      .keys = {
          {.name = "block_size", .type = KeyType::Whole, .min = 4096,
           .max = 1ull << 30,  // a request must stay under the kernel's 2 GiB cap
           .power_of_two = true,
           .help = "Bytes per I/O request; larger transfers are split.",
           .field = STRATA_CONFIG_FIELD(AioConfig, block_size)},
          {.name = "queue_depth", .type = KeyType::Whole, .min = 1, .max = 4096,
           .help = "Requests in flight per ring.",
           .field = STRATA_CONFIG_FIELD(AioConfig, queue_depth)},
          {.name = "intra_op_parallelism", .type = KeyType::Whole, .min = 1, .max = kMaxRings,
           .help = "Rings (and reaper threads).",
           .field = STRATA_CONFIG_FIELD(AioConfig, intra_op_parallelism)},
          {.name = "thread_count", .type = KeyType::Whole, .min = 1, .max = kMaxRings, .fallback = "—",
           .help = "DeepSpeed's older name for `intra_op_parallelism`; giving both with different values is an error.",
           .field = STRATA_CONFIG_FIELD(AioConfig, intra_op_parallelism)},
          {.name = "single_submit", .type = KeyType::Boolean,
           .help = "Submit each request alone instead of in batches.",
           .field = STRATA_CONFIG_FIELD(AioConfig, single_submit)},
          {.name = "overlap_events", .type = KeyType::Boolean,
           .help = "Keep submitting while completions are reaped.",
           .field = STRATA_CONFIG_FIELD(AioConfig, overlap_events)},
          {.name = "use_sqpoll", .type = KeyType::Boolean,
           .help = "Kernel-side submission polling, where permitted.",
           .field = STRATA_CONFIG_FIELD(AioConfig, use_sqpoll)},
          {.name = "engine", .type = KeyType::Text,
           .choices = {{"auto", int(IoEngineKind::Auto)}, {"io_uring", int(IoEngineKind::Uring)},
                       {"threadpool", int(IoEngineKind::ThreadPool)}},
           .help = "I/O engine; `auto` uses io_uring and falls back to the thread pool.",
           .field = STRATA_CONFIG_FIELD(AioConfig, engine)},
      },
      .check = check_aio,
  };
}

}  // namespace

const ConfigSection& aio_config_section() {
  static const ConfigSection s = make_aio_section();
  return s;
}

AioConfig parse_aio_config(const nlohmann::json& j) {
  AioConfig c;
  std::vector<std::string> warnings;  // no aio key warns
  parse_section(aio_config_section(), j, &c, warnings);
  return c;
}

}  // namespace strata
