// The `aio` section of the config, with DeepSpeed's names. Its keys are one table
// (aio_config_section, in aio_config.cpp) read by the same parser as the rest of the
// configuration (core/config_keys.hpp), so values follow the same rules everywhere.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace strata {

struct ConfigSection;

enum class IoEngineKind { Auto, Uring, ThreadPool };

struct AioConfig {
  uint64_t block_size = 1 << 20;     // bytes per I/O request; larger transfers are split
  unsigned queue_depth = 32;         // requests in flight per ring
  unsigned intra_op_parallelism = 1; // rings (and reaper threads); `thread_count` is the older name
  bool single_submit = false;        // submit each request alone instead of in batches
  bool overlap_events = true;        // keep submitting while completions are reaped
  bool use_sqpoll = false;           // kernel-side submission polling, when permitted
  IoEngineKind engine = IoEngineKind::Auto;  // Auto: io_uring, else the thread pool with a warning
};

// The table of the `aio` section; its target is an AioConfig. The run configuration's
// table (runtime/src/config/config_table.cpp) nests it under "aio".
const ConfigSection& aio_config_section();

// Parses an `aio` JSON object. Unknown keys and bad values throw ConfigError naming the
// key, the nearest valid key, and the accepted range.
AioConfig parse_aio_config(const nlohmann::json& j);

}  // namespace strata
