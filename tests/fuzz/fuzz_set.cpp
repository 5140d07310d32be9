// The `--set key=value` syntax: up to 16 newline-separated assignments applied to a
// complete config (the shape of configs/fortunes.json), then parsed and checked, as
// `strata train -c FILE --set ...` does.
#include <cstdint>
#include <string>

#include "fuzz_common.hpp"
#include "strata/runtime/config/config.hpp"

namespace {
const char* kBase = R"({
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 340, "warmup_num_steps": 20}},
  "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 2,
                        "offload_param": {"device": "nvme", "nvme_path": "/tmp"},
                        "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
  "aio": {"block_size": 1048576, "queue_depth": 8},
  "strata": {"device_budget": "64MiB", "pinned_budget": "64MiB", "steps": 340,
             "model": {"layers": 4, "d_model": 256, "heads": 4, "seq_len": 128, "vocab": 256},
             "data": {"path": "/tmp/corpus.txt", "format": "text"}}
})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = strata::fuzz::bytes(data, size);
  strata::fuzz::only_strata_errors("fuzz_set", [&] {
    nlohmann::json j = strata::parse_config_text(kBase, "base.json");
    size_t at = 0;
    for (int n = 0; n < 16 && at <= in.size(); ++n) {
      const size_t nl = in.find('\n', at);
      strata::apply_override(j, std::string(in.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at)));
      if (nl == std::string_view::npos) break;
      at = nl + 1;
    }
    strata::validate_for_world(strata::parse_config(j), 1);
  });
  return 0;
}
