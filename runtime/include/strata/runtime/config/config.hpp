// The run configuration: a JSON file whose keys follow DeepSpeed's names where the
// concept is the same, plus a `strata` section for what DeepSpeed lacks. Every key is
// one row of a table (runtime/src/config/config_table.cpp):
// unknown keys are an error naming the key and the nearest valid one, DeepSpeed keys
// with no meaning here are accepted with one warning each, and the listing of
// `strata train --list-keys` and docs/configuration.md come from the same rows.
// Command-line flags override the file (apply_override).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/config_keys.hpp"
#include "strata/core/device.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/value_checks.hpp"
#include "strata/memory/tier.hpp"
#include "strata/model/cuda_kernel_plan.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/offload/aio_config.hpp"
#include "strata/runtime/config/lr_schedule.hpp"

namespace strata {

enum class OptimizerKind { Adam, AdamW };
enum class OffloadDevice { None, Cpu, Nvme };  // DeepSpeed's "none", "cpu", "nvme"
const char* to_string(OffloadDevice d);
Tier home_tier(OffloadDevice d);  // None -> Device, Cpu -> Pinned, Nvme -> Nvme

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  float lr = 1e-3f;  // the lr of every step without a `scheduler`; with one, see SchedulerConfig
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// The host tier is always pinned memory, so DeepSpeed's pin_memory has no field
// (config_table.cpp).
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::None;
  std::vector<std::string> nvme_path;  // directories; DeepSpeed's string or a list
  float ratio = 1.0f;  // offload_optimizer: the fraction of the states CPU Adam steps (the rest on the GPU)
};

struct ZeroConfig {
  int stage = 3;                                // 1, 2 or 3
  OffloadConfig offload_param;                  // stage 3 only
  OffloadConfig offload_optimizer;
  uint64_t stage3_prefetch_bucket_size = 50'000'000;   // elements, as in DeepSpeed
  uint64_t stage3_max_live_parameters = 1'000'000'000; // elements
  uint64_t stage3_max_reuse_distance = 1'000'000'000;  // elements
  uint64_t stage3_param_persistence_threshold = 100'000;  // elements
  uint64_t sub_group_size = 1'000'000'000;      // elements per optimizer sub-group
  // MiCS: model states sharded within groups of this many consecutive ranks and
  // replicated across the groups; -1 (DeepSpeed's default) shards over every rank.
  // Read as a number so that DeepSpeed's -1 parses; check_zero keeps it -1 or whole >= 1.
  double mics_shard_size = -1;
  int mics_groups_of() const { return mics_shard_size < 0 ? 0 : static_cast<int>(mics_shard_size); }
  // ZeRO++ hpZ (DeepSpeed's key): stage 3 keeps a secondary partition of the parameters
  // over this many consecutive ranks, which the gathers after a group's first one read
  // (EngineOptions::hpz_partition_size). 1: off.
  uint64_t zero_hpz_partition_size = 1;
  // ZeRO++ qwZ (DeepSpeed's key): stage 3's gathers over every rank move the parameters as
  // int8 in blocks of strata.quantized_weights_block elements, each with an fp32 scale,
  // and dequantize on arrival (EngineOptions::quantized_weights_block). The master weights
  // are not touched.
  bool zero_quantized_weights = false;
  // ZeRO++ qgZ (DeepSpeed's key), stages 2 and 3: each micro-step's reduce-scatter moves
  // the gradient as int8 in blocks of strata.quantized_gradients_block elements, summed in
  // fp32 on arrival; hierarchical over nodes (an all-to-all within the node, then one
  // across) (EngineOptions::quantized_gradients_block).
  bool zero_quantized_gradients = false;
  // No reduce_bucket_size or overlap_comm: each parameter group is reduced as one
  // collective as soon as its gradient is complete, always overlapped with compute.
};

// partition_activations is refused when true.
struct ActivationCheckpointingConfig {
  bool enabled = false;              // strata extension: recompute each block in backward
  bool cpu_checkpointing = false;    // the checkpoints off the device between forward and backward
};

using ModelShape = GptShape;  // model/gpt_layout.hpp

struct DataConfig {
  std::string path;                  // a text file (byte-level) or an llm.c token file
  std::string format = "auto";       // "auto", "text", "tokens"
};

// strata.lora as written (the shape's LoraSpec, strata.model.lora, is resolved from it).
struct LoraSection {
  bool enabled = false;              // the section is present
  int rank = 8;                      // peft's r
  double alpha = 8;                  // peft's lora_alpha; scale alpha / rank
  std::string init;                  // a peft adapter directory to start from ("" = peft's default init)
};

// Which communicator carries collectives on device buffers (strata.device_communicator).
enum class DeviceCommunicator {
  Auto,    // cuda: nccl, or staged when this host has more ranks than GPUs; cpu: the host communicator
  Nccl,    // cuda only: NCCL, one rank per GPU
  Staged,  // through pinned host memory and MPI (coll::make_staged_communicator); ranks may share a GPU
};

struct StrataSection {
  Backend backend = Backend::Cpu;
  DeviceCommunicator device_communicator = DeviceCommunicator::Auto;
  uint64_t device_budget = 1ull << 30;   // bytes
  uint64_t pinned_budget = 1ull << 30;   // bytes
  uint64_t nvme_budget = 0;              // bytes; 0: sized from the plan
  bool checksums = false;                // xxHash per NVMe extent
  OutOfRange out_of_range = OutOfRange::Refuse;  // masters beyond the 16-bit working type's range
  bool speculative_optimizer = false;    // step sub-groups during backward, validate at step()
  int tile_factor = 1;                   // each block linear in this many tiles (gpt_parts); 1: untiled
  int quantized_weights_block = 256;     // zero_quantized_weights: elements per int8 block (one fp32 scale each)
  int quantized_gradients_block = 256;   // zero_quantized_gradients: the same, for gradients
  uint64_t tile_size = 0;                // elements: larger block linears tiled to at most this (gpt_parts); 0: off
  uint64_t seed = 1234;
  std::string trace;                     // Chrome trace output path ("" = off)
  ModelShape model;                      // its `lora` from strata.lora
  LoraSection lora;
  DataConfig data;
  int steps = 100;
  int checkpoint_every = 0;              // steps; 0 = off
  std::string checkpoint_dir;
  // Seconds a collective may wait for the other ranks before every rank that can says
  // which collective and which ranks, and exits (coll::set_collective_timeout); 0: off.
  double collective_timeout = 1800;
  // Ranks a node for the node layout (coll::resolve_topology); 0: the launcher's hosts.
  int ranks_per_node = 0;
  // The cuda GPT's kernels (GptOptions::cuda_kernels); anything but Reference is refused
  // on the cpu and sim backends (check_strata).
  CudaKernels cuda_kernels = CudaKernels::Reference;
};

// DeepSpeed's `fp16` section: fp16 training with loss scaling (runtime/loss_scaler.hpp).
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;          // static scale; 0: dynamic
  int initial_scale_power = 16;   // dynamic: the first scale is 2^this
  int loss_scale_window = 1000;   // dynamic: clean steps before the scale doubles
  int hysteresis = 2;             // dynamic: overflows before the scale halves
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

struct Config {
  int train_micro_batch_size_per_gpu = 1;
  int gradient_accumulation_steps = 1;
  std::optional<int> train_batch_size;   // checked against micro * accum * world
  float gradient_clipping = 0.0f;        // global norm; 0 = off
  bool bf16 = false;                     // bf16.enabled
  Fp16Config fp16;
  // The working precision the two sections ask for: BF16, F16 or F32.
  DType precision() const { return bf16 ? DType::BF16 : fp16.enabled ? DType::F16 : DType::F32; }
  int steps_per_print = 1;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;             // DeepSpeed's `scheduler`; Constant when absent
  ZeroConfig zero;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  StrataSection strata;

  nlohmann::json raw;                    // the file as given, for checkpoints' manifests
  // One line per key given that has no effect here ("<key> has no effect: <why>"), in
  // the tables' order; parse_config also logs each once per process.
  std::vector<std::string> warnings;
};

// Parses and validates. Throws ConfigError naming the key, the problem and the fix.
Config parse_config(const nlohmann::json& j);

// The strata.model section that parse_config reads back as `s` (Llama's keys only for
// Llama): what checkpoints, imports and reports write of a model's shape.
nlohmann::json model_json(const ModelShape& s);
// A missing or malformed file is a ConfigError. The overrides ("a.b=value", as
// apply_override) apply before anything is checked, so they can mend the file.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The file's JSON (duplicate keys refused), not yet checked. The file must be a regular
// file of at most kMaxConfigBytes, nested at most kMaxJsonDepth deep (core/safe_io.hpp).
nlohmann::json load_config_json(const std::string& path);
inline constexpr uint64_t kMaxConfigBytes = 16ull << 20;
// The same for a config's text; `path` names it in messages.
nlohmann::json parse_config_text(const std::string& text, const std::string& path);

// Applies "a.b.c=value" (value parsed as JSON, else taken as a string) to the JSON
// before parsing; used for command-line overrides. Unknown keys fail as in the file.
void apply_override(nlohmann::json& j, const std::string& assignment);

// Checks that depend on the world size (batch sizes); throws ConfigError.
void validate_for_world(const Config& c, int world_size);

// Sizes ("512MiB", "2GB", 4096) are read by parse_bytes (core/config_keys.hpp).

// The table of the top level (config_table.cpp); every section's table hangs from it.
// Its target is a Config.
const ConfigSection& config_table();

// The key tables as text. config_keys_text: every key with what it accepts, its default
// and its meaning (`strata train --list-keys`). config_keys_markdown: one section's
// table ("" for the top level, "zero_optimization", ...), as docs/configuration.md
// holds it between <!-- keys: SECTION --> and <!-- end keys -->; config_doc_sections
// lists the sections that have one.
std::string config_keys_text();
std::string config_keys_markdown(std::string_view section);
std::vector<std::string> config_doc_sections();

}  // namespace strata
