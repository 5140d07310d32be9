// The run configuration as tables: one row per key, one table per section, each with
// its checks across keys (core/config_keys.hpp says what a row holds). The parser,
// `strata train --list-keys` and docs/configuration.md's key lists all come from here;
// a key is added, changed or dropped in this file only.
//
// What each key does, in short: a Used key's value goes into the Config and is read by
// the engine, the trainer or the C API. A DeepSpeed key that has no meaning in Strata is
// NoEffect: type-checked, then one warning says why it changes nothing. A switch whose
// value Strata cannot change is Fixed (the other value warns) or, when the other value
// asks for something Strata does not do yet, Refused.
#include "strata/runtime/config/config.hpp"

#include "config_scheduler.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

namespace strata {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxInt = INT_MAX;  // whole numbers stored in an int

Config& config_of(void* target) { return *static_cast<Config*>(target); }

// ---- top level ------------------------------------------------------------------------

// A directory for swap files must exist and be writable now, not when the first block
// is evicted mid-run.
void check_nvme_dirs(const std::string& section, const OffloadConfig& o) {
  if (o.device != OffloadDevice::Nvme) return;
  const std::string key = section + ".nvme_path";
  if (o.nvme_path.empty())
    throw ConfigError(section + ".device is \"nvme\" but " + key +
                      " is not set: add \"nvme_path\": \"/local_nvme\" (a directory on the NVMe drive, or a list "
                      "of directories to stripe across) to " + section);
  for (const auto& p : o.nvme_path) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      int err = errno;
      throw ConfigError(key + " '" + p + "' cannot be used: " + std::strerror(err) +
                        ": create the directory or point nvme_path at an existing one on the NVMe drive");
    }
    if (!S_ISDIR(st.st_mode))
      throw ConfigError(key + " '" + p + "' is not a directory: point nvme_path at a directory on the NVMe drive");
    if (::access(p.c_str(), W_OK) != 0) {
      int err = errno;
      throw ConfigError(key + " '" + p + "' is not writable (" + std::strerror(err) +
                        "): give this user write permission, remount it read-write, or choose another directory");
    }
  }
}

void check_top(const json& j, void* target) {
  const Config& c = config_of(target);
  // A quantized block size sizes a collective that is off: refused, as a key that would
  // act on nothing.
  const json* strata = j.contains("strata") && j.at("strata").is_object() ? &j.at("strata") : nullptr;
  for (auto [key, on, feature] : {std::tuple{"quantized_weights_block", c.zero.zero_quantized_weights,
                                             "zero_quantized_weights"},
                                  std::tuple{"quantized_gradients_block", c.zero.zero_quantized_gradients,
                                             "zero_quantized_gradients"}})
    if (strata != nullptr && strata->contains(key) && !on)
      throw ConfigError(std::string("strata.") + key + " sizes the blocks of zero_optimization." + feature +
                        ", which is off: set zero_optimization." + feature + " to true, or remove strata." + key);
  check_nvme_dirs("zero_optimization.offload_param", c.zero.offload_param);
  check_nvme_dirs("zero_optimization.offload_optimizer", c.zero.offload_optimizer);
  if (c.activation_checkpointing.cpu_checkpointing && !c.activation_checkpointing.enabled)
    throw ConfigError("activation_checkpointing.cpu_checkpointing moves the checkpoints that activation checkpointing "
                      "keeps, and activation_checkpointing.enabled is false: set enabled to true, or drop "
                      "cpu_checkpointing");
  if (c.bf16 && c.fp16.enabled)
    throw ConfigError("bf16.enabled and fp16.enabled are both true: choose one 16-bit type (bf16 needs no loss "
                      "scaling; fp16 has more mantissa and a narrower range), or neither for fp32");
}

const ConfigSection kBf16 = {
    .path = "bf16",
    .keys = {{.name = "enabled", .type = KeyType::Boolean,
              .help = "Train in bf16: 16-bit working parameters and gradients in every tier, gather and "
                      "reduce-scatter, 16-bit matmuls with fp32 accumulation; fp32 master weights and Adam moments "
                      "(docs/mixed-precision.md).",
              .field = STRATA_CONFIG_FIELD(Config, bf16)}},
    .inline_in_parent = true,
};

void* fp16_of(void* t) { return &config_of(t).fp16; }

// DeepSpeed's dynamic loss scaler: the scale must start at or above its floor.
void check_fp16(const json&, void* target) {
  const Fp16Config& f = *static_cast<Fp16Config*>(target);
  if (!f.enabled || f.loss_scale > 0) return;
  if (f.min_loss_scale > std::ldexp(1.0, f.initial_scale_power))
    throw ConfigError("fp16.min_loss_scale = " + std::to_string(f.min_loss_scale) +
                      " is above the first dynamic loss scale 2^fp16.initial_scale_power = 2^" +
                      std::to_string(f.initial_scale_power) +
                      ": lower min_loss_scale or raise initial_scale_power");
}

const ConfigSection kFp16 = {
    .path = "fp16",
    .keys = {{.name = "enabled", .type = KeyType::Boolean,
              .help = "Train in fp16 with loss scaling: as bf16, with IEEE half working parameters and gradients.",
              .field = STRATA_CONFIG_FIELD(Fp16Config, enabled)},
             {.name = "auto_cast", .type = KeyType::Any, .help = "DeepSpeed: cast the model's inputs to fp16.",
              .use = KeyUse::NoEffect, .why = "the model's inputs are token ids; its compute precision is fp16.enabled"},
             {.name = "loss_scale", .type = KeyType::Double, .lo = 0, .note = "0 for dynamic scaling",
              .help = "A static loss scale, or 0 for dynamic loss scaling.",
              .field = STRATA_CONFIG_FIELD(Fp16Config, loss_scale)},
             {.name = "initial_scale_power", .type = KeyType::Whole, .min = 0, .max = 63,
              .help = "The first dynamic loss scale is 2 to this power.",
              .field = STRATA_CONFIG_FIELD(Fp16Config, initial_scale_power)},
             {.name = "loss_scale_window", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
              .help = "Dynamic scaling doubles the scale after this many steps without overflow.",
              .field = STRATA_CONFIG_FIELD(Fp16Config, loss_scale_window)},
             {.name = "hysteresis", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
              .help = "Overflowing steps (each skipped) before the dynamic scale is halved.",
              .field = STRATA_CONFIG_FIELD(Fp16Config, hysteresis)},
             {.name = "consecutive_hysteresis", .type = KeyType::Boolean,
              .help = "Refill the hysteresis after every step without overflow (else only when the scale grows).",
              .field = STRATA_CONFIG_FIELD(Fp16Config, consecutive_hysteresis)},
             {.name = "min_loss_scale", .type = KeyType::Double, .lo = 0, .lo_open = true,
              .help = "The dynamic scale is never halved below this.",
              .field = STRATA_CONFIG_FIELD(Fp16Config, min_loss_scale)}},
    .check = check_fp16,
    .inline_in_parent = true,
};

// ---- optimizer ------------------------------------------------------------------------

// DeepSpeed's "Adam" decouples weight decay (AdamW) unless adam_w_mode is false;
// following it keeps a DeepSpeed config training the same way here. The type's row has
// stored Adam or AdamW as written; adam_w_mode decides.
void check_optimizer(const json& j, void* target) {
  OptimizerConfig& o = config_of(target).optimizer;
  bool adam_w_mode = true;
  if (auto p = j.find("params"); p != j.end())
    if (auto m = p->find("adam_w_mode"); m != p->end()) adam_w_mode = m->get<bool>();
  if (o.kind == OptimizerKind::AdamW && !adam_w_mode)
    throw ConfigError("optimizer.params.adam_w_mode = false contradicts optimizer.type \"AdamW\": for Adam with L2 "
                      "weight decay set optimizer.type to \"Adam\"");
  o.kind = adam_w_mode ? OptimizerKind::AdamW : OptimizerKind::Adam;
}

const ConfigSection kOptimizerParams = {
    .path = "optimizer.params",
    .keys = {
        {.name = "lr", .type = KeyType::Float, .lo = 0, .lo_open = true,
         .help = "Learning rate of every step when there is no `scheduler` section. With one, the scheduler sets "
                 "the lr of every step, from the first: `params.lr` is then WarmupLR's default `warmup_max_lr`, "
                 "WarmupCosineLR's peak, and unused by WarmupDecayLR.",
         // The scheduler computes in double, from lr as written: float rounding would
         // otherwise enter every scheduled lr.
         .field = {[](void* t, const ConfigValue& v) {
                     v.to(config_of(t).optimizer.lr);
                     v.to(config_of(t).scheduler.optimizer_lr);
                   },
                   [](const void* t) { return json(static_cast<const Config*>(t)->optimizer.lr); }}},
        {.name = "betas", .type = KeyType::NumberPair, .lo = 0, .hi = 1, .hi_open = true,
         .help = "Adam's moment decay rates `[beta1, beta2]`.",
         .field = {[](void* t, const ConfigValue& v) {
                     config_of(t).optimizer.beta1 = static_cast<float>(v.pair[0]);
                     config_of(t).optimizer.beta2 = static_cast<float>(v.pair[1]);
                   },
                   [](const void* t) {
                     const OptimizerConfig& o = static_cast<const Config*>(t)->optimizer;
                     return json::array({o.beta1, o.beta2});
                   }}},
        {.name = "eps", .type = KeyType::Float, .lo = 0, .lo_open = true, .help = "Added to the denominator.",
         .field = STRATA_CONFIG_FIELD(Config, optimizer.eps)},
        {.name = "weight_decay", .type = KeyType::Float, .lo = 0, .help = "Weight decay.",
         .field = STRATA_CONFIG_FIELD(Config, optimizer.weight_decay)},
        {.name = "adam_w_mode", .type = KeyType::Boolean, .fallback = "`true`",
         .help = "As in DeepSpeed: with `\"type\": \"Adam\"`, weight decay is decoupled (AdamW) unless this is "
                 "`false`, which gives Adam with L2 decay added to the gradient. With `\"AdamW\"`, `false` is an "
                 "error."},  // read by check_optimizer
    },
    .inline_in_parent = true,
};

const ConfigSection kOptimizer = {
    .path = "optimizer",
    .keys = {
        {.name = "type", .type = KeyType::Text,
         .choices = {{"Adam", int(OptimizerKind::Adam)}, {"AdamW", int(OptimizerKind::AdamW)}},
         .ignore_case = true, .note = "case-insensitive; the CPU optimizer implements only these",
         .help = "The optimizer. Other DeepSpeed optimizers (Lamb, OneBitAdam, ...) are refused. DeepSpeed's rule "
                 "holds: `\"Adam\"` alone means AdamW (see `params.adam_w_mode`).",
         .field = STRATA_CONFIG_FIELD(Config, optimizer.kind)},
        {.name = "params", .type = KeyType::Section, .section = &kOptimizerParams},
    },
    .check = check_optimizer,
};

// ---- zero_optimization ----------------------------------------------------------------

constexpr const char* kSizedFromBudgets =
    "Strata sizes its staging buffers from the tier budgets (strata.device_budget, strata.pinned_budget)";

// offload_param and offload_optimizer share device, nvme_path, pin_memory and
// buffer_count; `own` are the keys of one of them. The target is the OffloadConfig.
std::vector<ConfigKey> offload_keys(std::vector<ConfigKey> own) {
  std::vector<ConfigKey> keys = {
      {.name = "device", .type = KeyType::Text,
       .choices = {{"none", int(OffloadDevice::None)}, {"cpu", int(OffloadDevice::Cpu)},
                   {"nvme", int(OffloadDevice::Nvme)}},
       .help = "Home tier: device memory, pinned host memory, or NVMe. Lower case, as in DeepSpeed.",
       .field = STRATA_CONFIG_FIELD(OffloadConfig, device)},
      {.name = "nvme_path", .type = KeyType::Paths, .nullable = true,
       .help = "Directory for swap files; a list stripes across several drives. Required when `device` is "
               "`\"nvme\"`; then every directory must exist, be a directory and be writable by this user (checked "
               "with `access(W_OK)` at load time). Not checked for other devices. `null` means unset (DeepSpeed's "
               "default). Listing a directory twice is an error.",
       .field = STRATA_CONFIG_FIELD(OffloadConfig, nvme_path)},
      {.name = "pin_memory", .type = KeyType::Boolean, .help = "Stage through pinned host memory.",
       .use = KeyUse::Fixed, .only = true,
       .why = "Strata's host tier is always pinned memory (it falls back to plain memory only where pinning is "
              "refused)"},
      {.name = "buffer_count", .type = KeyType::Whole, .min = 1, .help = "DeepSpeed: staging buffers.",
       .use = KeyUse::NoEffect, .why = kSizedFromBudgets},
  };
  keys.insert(keys.end(), own.begin(), own.end());
  return keys;
}

const ConfigSection kOffloadParam = {
    .path = "zero_optimization.offload_param",
    .keys = offload_keys({
        {.name = "buffer_size", .type = KeyType::Whole, .min = 1, .help = "DeepSpeed: elements per staging buffer.",
         .use = KeyUse::NoEffect, .why = kSizedFromBudgets},
        {.name = "max_in_cpu", .type = KeyType::Whole, .min = 0,
         .help = "DeepSpeed: parameter elements kept in host memory with NVMe offload.", .use = KeyUse::NoEffect,
         .why = "Strata keeps in pinned memory what strata.pinned_budget holds, as the plan lays it out"},
    }),
};

const ConfigSection kOffloadOptimizer = {
    .path = "zero_optimization.offload_optimizer",
    .keys = offload_keys({
        {.name = "fast_init", .type = KeyType::Boolean,
         .help = "DeepSpeed: a faster optimizer initialisation with NVMe offload.", .use = KeyUse::NoEffect,
         .why = "Strata fills each rank's optimizer shard in place, from the seed, in one pass"},
        {.name = "ratio", .type = KeyType::Float, .lo = 0, .hi = 1,
         .help = "DeepSpeed's partial offload (ZeRO-Offload++ Twin-Flow): the fraction of the optimizer states, "
                 "counted from the model's first parameter group, that live on `device` and step with CPU Adam; the "
                 "groups after it keep their states on the GPU and step there at the same time. Below 1 it needs "
                 "the cuda backend and `device` \"cpu\" or \"nvme\".",
         .field = STRATA_CONFIG_FIELD(OffloadConfig, ratio)},
    }),
};

void* offload_param_of(void* t) { return &config_of(t).zero.offload_param; }
void* offload_optimizer_of(void* t) { return &config_of(t).zero.offload_optimizer; }

// The stage3_* keys and offload_param only mean something when parameters are
// partitioned (stage 3).
void check_zero(const json& j, void* target);

const ConfigSection kZero = {
    .path = "zero_optimization",
    .keys = {
        {.name = "stage", .type = KeyType::Whole, .min = 1, .max = 3,
         .accepted = "1, 2 or 3 (stage 0, plain data parallelism, is not supported)",
         .help = "ZeRO stage: 1 partitions optimizer state, 2 also gradients, 3 also parameters. DeepSpeed's "
                 "default is 0; Strata has no stage 0. Stage 3 on one rank with `offload_param` none gathers nothing: "
                 "the model reads each parameter shard (the whole group) where it is.",
         .field = STRATA_CONFIG_FIELD(Config, zero.stage)},
        {.name = "offload_param", .type = KeyType::Section, .fallback = "device `\"none\"`",
         .help = "Home tier of the parameter shards (table below). Stage 3 only: given with stage 1 or 2 it is an "
                 "error.",
         .section = &kOffloadParam, .enter = offload_param_of},
        {.name = "offload_optimizer", .type = KeyType::Section, .fallback = "device `\"none\"`",
         .help = "Home tier of the fp32 master weights, Adam moments and gradient shards (table below). Any stage.",
         .section = &kOffloadOptimizer, .enter = offload_optimizer_of},
        {.name = "stage3_prefetch_bucket_size", .type = KeyType::Whole, .min = 1,
         .help = "Parameter elements per gather and of look-ahead: a block larger than this is gathered in parts of "
                 "at most this many elements (its tensors coalesced in layout order; a larger tensor alone), each "
                 "gathered, released and reduce-scattered on its own; the prefetch looks this many elements ahead. "
                 "At least 1: one tensor (or tile) per gather.",
         .field = STRATA_CONFIG_FIELD(Config, zero.stage3_prefetch_bucket_size)},
        {.name = "stage3_max_live_parameters", .type = KeyType::Whole, .min = 1,
         .help = "Most parameter elements gathered on the device at once (it bounds the prefetch). Stage 3 gathers "
                 "each group (a block, or a part of one: stage3_prefetch_bucket_size, strata.tile_factor) whole, "
                 "so a value below the largest is refused at start-up, naming the smallest that works.",
         .field = STRATA_CONFIG_FIELD(Config, zero.stage3_max_live_parameters)},
        {.name = "stage3_max_reuse_distance", .type = KeyType::Whole, .min = 0,
         .help = "A gathered block (or part) is kept, not released, when its next use is nearer than this many "
                 "elements.",
         .field = STRATA_CONFIG_FIELD(Config, zero.stage3_max_reuse_distance)},
        {.name = "stage3_param_persistence_threshold", .type = KeyType::Whole, .min = 0,
         .help = "Parameters smaller than this many elements stay resident on every rank.",
         .field = STRATA_CONFIG_FIELD(Config, zero.stage3_param_persistence_threshold)},
        {.name = "sub_group_size", .type = KeyType::Whole, .min = 1,
         .help = "Optimizer step granularity, in elements: states are read, updated and written back per "
                 "sub-group.",
         .field = STRATA_CONFIG_FIELD(Config, zero.sub_group_size)},
        {.name = "mics_shard_size", .type = KeyType::Double, .lo = -1,
         .accepted = "-1 (off), or a whole number >= 1 that divides the world size",
         .help = "MiCS (DeepSpeed's key): parameters, gradients and optimizer states sharded within groups of this "
                 "many consecutive ranks and replicated across the groups. Gradients are reduce-scattered within "
                 "the group (all-reduced, stage 1), then all-reduced across the groups, as each group's gradient "
                 "is ready. Put a group within a node (a divisor of its ranks) or over whole nodes (a multiple): "
                 "`strata.ranks_per_node` or the launcher says where nodes end. The cpu backend (mpi) only.",
         .field = STRATA_CONFIG_FIELD(Config, zero.mics_shard_size)},
        {.name = "zero_hpz_partition_size", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
         .help = "ZeRO++ hpZ (DeepSpeed's key), stage 3: each rank also keeps its slice of every gathered group "
                 "partitioned over this many consecutive ranks (a node's, or a divisor of them). A group's first "
                 "gather after its parameters change goes over every rank; the later ones (backward's, the next "
                 "micro-steps') over those ranks alone. 1: off. Costs padded parameters / N of each rank's "
                 "offload_param tier. The cpu backend (mpi) only.",
         .field = STRATA_CONFIG_FIELD(Config, zero.zero_hpz_partition_size)},
        {.name = "zero_quantized_weights", .type = KeyType::Boolean,
         .help = "ZeRO++ qwZ (DeepSpeed's key), stage 3: the gathers of parameters over every rank move them as "
                 "int8, in blocks of `strata.quantized_weights_block` elements with one fp32 scale each (symmetric: "
                 "the block's largest magnitude maps to 127), dequantized to the working type on arrival. The "
                 "master weights stay exact; each rank measures the relative error of what it sends "
                 "(`quantized_weights_error` in `--metrics`). hpZ's gathers within the node are not quantized. The "
                 "cpu backend (mpi) only.",
         .field = STRATA_CONFIG_FIELD(Config, zero.zero_quantized_weights)},
        {.name = "zero_quantized_gradients", .type = KeyType::Boolean,
         .help = "ZeRO++ qgZ (DeepSpeed's key), stages 2 and 3: each micro-step's gradient reduce-scatter moves the "
                 "gradient as int8, in blocks of `strata.quantized_gradients_block` elements with one fp32 scale "
                 "each, and sums what arrives in fp32. Hierarchical where the world spans nodes: an all-to-all "
                 "within the node, whose partial sums are quantized again for one all-to-all across the nodes "
                 "(`strata.ranks_per_node` or the launcher says where nodes end). Each rank measures the relative "
                 "error of what it sends (`quantized_gradients_error` in `--metrics`); the optimizer's states stay "
                 "fp32. The cpu backend (mpi) only.",
         .field = STRATA_CONFIG_FIELD(Config, zero.zero_quantized_gradients)},
        {.name = "reduce_bucket_size", .type = KeyType::Whole, .min = 1,
         .help = "DeepSpeed: gradient elements per reduce bucket.", .use = KeyUse::NoEffect,
         .why = "Strata reduces each parameter group (a whole transformer block) as one collective as soon as its "
                "gradient is complete, so there is no bucket to size"},
        {.name = "overlap_comm", .type = KeyType::Boolean, .help = "Overlap collectives with compute.",
         .use = KeyUse::Fixed, .only = true, .why = "Strata always overlaps communication with compute"},
        {.name = "allgather_bucket_size", .type = KeyType::Whole, .min = 1,
         .help = "DeepSpeed: elements per all-gather bucket.", .use = KeyUse::NoEffect,
         .why = "Strata gathers each parameter group with one all-gather, sized by the group"},
        {.name = "contiguous_gradients", .type = KeyType::Boolean,
         .help = "DeepSpeed: copy gradients into one contiguous buffer as they are produced.",
         .use = KeyUse::NoEffect, .why = "each parameter group's gradient is one contiguous buffer already"},
        {.name = "reduce_scatter", .type = KeyType::Boolean,
         .help = "DeepSpeed: average gradients with reduce-scatter instead of all-reduce.", .use = KeyUse::NoEffect,
         .why = "the stage decides: stage 1 all-reduces the gradients at the step, stages 2 and 3 reduce-scatter "
                "each group's gradient"},
        {.name = "allgather_partitions", .type = KeyType::Boolean,
         .help = "DeepSpeed: all-gather instead of broadcasts to collect the updated parameters.",
         .use = KeyUse::NoEffect, .why = "Strata always collects parameters with one all-gather per group"},
    },
    .check = check_zero,
};

void check_zero(const json& j, void* target) {
  const ZeroConfig& z = config_of(target).zero;
  if (z.offload_optimizer.ratio < 1.0f && z.offload_optimizer.device == OffloadDevice::None)
    throw ConfigError("zero_optimization.offload_optimizer.ratio below 1 splits the optimizer between the GPU and "
                      "offload_optimizer.device, which is \"none\" (all of it on the GPU already): set the device "
                      "to \"cpu\" or \"nvme\", or remove ratio");
  if (z.mics_shard_size != -1 && !(z.mics_shard_size >= 1 && z.mics_shard_size == std::floor(z.mics_shard_size) &&
                                    z.mics_shard_size <= kMaxInt))
    throw ConfigError("zero_optimization.mics_shard_size is " + json(z.mics_shard_size).dump() +
                      ": give -1 to shard over every rank, or a whole number of ranks >= 1 that divides the world "
                      "size");
  if (z.zero_hpz_partition_size > 1 && z.mics_shard_size != -1)
    throw ConfigError("zero_optimization.zero_hpz_partition_size and mics_shard_size are two ways to keep "
                      "collectives inside a node, and Strata runs one at a time: remove one of them");
  const int stage = z.stage;
  if (stage != 3 && z.zero_quantized_weights)
    throw ConfigError("zero_optimization.zero_quantized_weights quantizes stage 3's parameter gathers "
                      "(zero_optimization.stage is " + std::to_string(stage) +
                      "): set zero_optimization.stage to 3, or remove zero_quantized_weights");
  if (stage == 1 && z.zero_quantized_gradients)
    throw ConfigError("zero_optimization.zero_quantized_gradients quantizes the gradient reduce-scatters of stages 2 "
                      "and 3, and stage 1 all-reduces its gradient once a step, unquantized (in fp32 when "
                      "accumulated): set zero_optimization.stage to 2 or 3, or remove zero_quantized_gradients");
  if (z.zero_quantized_gradients && z.mics_shard_size != -1)
    throw ConfigError("zero_optimization.zero_quantized_gradients quantizes a reduce-scatter over every rank, and "
                      "mics_shard_size reduces within groups then all-reduces across them (unquantized): remove one "
                      "of them");
  if (stage != 3 && z.zero_hpz_partition_size > 1)
    throw ConfigError("zero_optimization.zero_hpz_partition_size " + std::to_string(z.zero_hpz_partition_size) +
                      " partitions stage 3's parameters (zero_optimization.stage is " + std::to_string(stage) +
                      "): set zero_optimization.stage to 3, or remove zero_hpz_partition_size");
  if (stage == 3) return;
  for (const ConfigKey& k : kZero.keys)
    if (std::string_view(k.name).starts_with("stage3_") && j.contains(k.name))
      throw ConfigError(std::string("zero_optimization.") + k.name + " only applies to ZeRO stage 3 "
                        "(zero_optimization.stage is " + std::to_string(stage) +
                        "): remove it or set zero_optimization.stage to 3");
  if (j.contains("offload_param"))
    throw ConfigError("zero_optimization.offload_param only applies to ZeRO stage 3 (zero_optimization.stage is " +
                      std::to_string(stage) + "; parameters are not partitioned below stage 3): remove it or set "
                      "zero_optimization.stage to 3");
}

// ---- activation_checkpointing ---------------------------------------------------------

const ConfigSection kActivationCheckpointing = {
    .path = "activation_checkpointing",
    .keys = {
        {.name = "enabled", .type = KeyType::Boolean,
         .help = "Strata's switch: recompute each block's activations in backward. In DeepSpeed the model code "
                 "turns checkpointing on; here this key does, so a DeepSpeed section without it leaves "
                 "checkpointing off.",
         .field = STRATA_CONFIG_FIELD(Config, activation_checkpointing.enabled)},
        {.name = "partition_activations", .type = KeyType::Boolean,
         .help = "Partition the saved activations across ranks.", .use = KeyUse::Refused, .only = false,
         .why = "DeepSpeed splits checkpoints that model-parallel ranks hold alike; Strata's ranks are data-parallel, "
                "each rank's checkpoints are of its own batch, so there is no shared copy to split. "
                "cpu_checkpointing moves them off the device instead"},
        {.name = "cpu_checkpointing", .type = KeyType::Boolean,
         .help = "Move each block's checkpoint to pinned host memory once its forward is done (to NVMe when the "
                 "pinned budget has no room for them beside the states and an NVMe path is configured), and bring "
                 "it back one block ahead of its backward. The device then holds 3 checkpoints, not layers + 1. "
                 "Needs `enabled`.",
         .field = STRATA_CONFIG_FIELD(Config, activation_checkpointing.cpu_checkpointing)},
        {.name = "contiguous_memory_optimization", .type = KeyType::Boolean,
         .help = "DeepSpeed: copy partitioned activations into one buffer.", .use = KeyUse::NoEffect,
         .why = "it applies to partitioned activations, which Strata does not have yet"},
        {.name = "number_checkpoints", .type = KeyType::Whole, .min = 1, .max = kMaxInt, .nullable = true,
         .help = "DeepSpeed: checkpoints to size contiguous_memory_optimization's buffer for.",
         .use = KeyUse::NoEffect, .why = "it sizes contiguous_memory_optimization's buffer, which Strata does not use"},
        {.name = "synchronize_checkpoint_boundary", .type = KeyType::Boolean,
         .help = "DeepSpeed: synchronize the device at each checkpoint boundary (for debugging).",
         .use = KeyUse::NoEffect, .why = "Strata does not synchronize at checkpoint boundaries"},
        {.name = "profile", .type = KeyType::Boolean, .help = "DeepSpeed: time the checkpointed forward passes.",
         .use = KeyUse::NoEffect, .why = "Strata's timings come from strata.trace"},
    },
};

// ---- strata ---------------------------------------------------------------------------

void check_model(const json& j, void* target) {
  const ModelShape& m = config_of(target).strata.model;
  if (m.arch == Arch::Gpt2)
    for (const char* k : {"kv_heads", "ffn", "rope_theta", "norm_eps", "tied_head"})
      if (j.contains(k))
        throw ConfigError(std::string("strata.model.") + k + " applies to strata.model.arch \"llama\" only; GPT-2 " +
                          (std::string(k) == "tied_head" ? "always ties its head to wte" : "has no such setting") +
                          ": remove the key, or set strata.model.arch to \"llama\"");
  if (m.d_model % m.heads != 0)
    throw ConfigError("strata.model.d_model = " + std::to_string(m.d_model) +
                      " is not divisible by strata.model.heads = " + std::to_string(m.heads) +
                      ": each head needs d_model / heads channels; change one so heads divides d_model");
  // The limits across keys (the parameter count), as `strata plan` has them.
  try {
    validate(m);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("strata.") + e.what());
  }
}

const ConfigSection kModel = {
    .path = "strata.model",
    .keys = {
        {.name = "layers", .type = KeyType::Whole, .min = 1, .max = kMaxLayers, .help = "Transformer blocks.",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.layers)},
        {.name = "d_model", .type = KeyType::Whole, .min = 1, .max = kMaxDModel,
         .help = "Model width; must be divisible by `heads`.",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.d_model)},
        {.name = "heads", .type = KeyType::Whole, .min = 1, .max = kMaxDModel, .help = "Attention heads.",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.heads)},
        {.name = "seq_len", .type = KeyType::Whole, .min = 1, .max = kMaxSeqLen, .help = "Sequence length.",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.seq_len)},
        // Token files hold uint16 ids (llm.c gpt-2) or uint32 ids (llm.c llama-3).
        {.name = "vocab", .type = KeyType::Whole, .min = 1, .max = kMaxVocab,
         .help = "Vocabulary size; beyond 65536 the data must be llm.c's uint32 (llama-3) token files.",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.vocab)},
        {.name = "arch", .type = KeyType::Text, .choices = {{"gpt2", 0}, {"llama", 1}},
         .help = "The architecture: GPT-2 (learned positions, LayerNorm, GELU, tied head) or Llama (rotary "
                 "positions, RMSNorm, grouped-query attention, SwiGLU).",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.arch)},
        {.name = "kv_heads", .type = KeyType::Whole, .min = 0, .max = kMaxDModel, .note = "0: `heads`",
         .help = "Llama: key/value heads (grouped-query attention); must divide `heads`.",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.kv_heads)},
        {.name = "ffn", .type = KeyType::Whole, .min = 0, .max = 4 * static_cast<uint64_t>(kMaxDModel),
         .note = "0: 256-multiple of 8 d_model / 3", .help = "Llama: the SwiGLU MLP's width (intermediate_size).",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.ffn)},
        {.name = "rope_theta", .type = KeyType::Double, .lo = 1, .lo_open = true,
         .help = "Llama: the rotary embeddings' base (Hugging Face's rope_theta).",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.rope_theta)},
        {.name = "norm_eps", .type = KeyType::Double, .lo = 0, .hi = 1, .lo_open = true, .hi_open = true,
         .help = "Llama: RMSNorm's epsilon (rms_norm_eps).", .field = STRATA_CONFIG_FIELD(Config, strata.model.norm_eps)},
        {.name = "tied_head", .type = KeyType::Boolean,
         .help = "Llama: the output head is the token embedding (tie_word_embeddings).",
         .field = STRATA_CONFIG_FIELD(Config, strata.model.tied_head)},
    },
    .check = check_model,
    .inline_in_parent = true,
};

// strata.lora.target: a non-empty list of the architecture's linears (lora_modules;
// Llama's also by their short names q, k, v, o, gate, up, down), each once. Resolved
// into strata.model.lora once the model's arch is known (check_strata).
uint32_t lora_targets(const json& j, Arch arch) {
  const std::vector<std::string>& mods = lora_modules(arch);
  std::string valid;
  for (const std::string& m : mods) valid += (valid.empty() ? "" : ", ") + ("\"" + m + "\"");
  const std::string fix = "; " + std::string(arch_name(arch)) + "'s are " + valid;
  if (!j.contains("target"))
    throw ConfigError("strata.lora.target is not set: list the linears to adapt, e.g. [\"" + mods[0] + "\", \"" +
                      mods[arch == Arch::Llama ? 2 : 1] + "\"]" + fix);
  const json& t = j.at("target");
  if (!t.is_array() || t.empty())
    throw ConfigError("strata.lora.target = " + t.dump() + " must be a non-empty list of linear names" + fix);
  uint32_t mask = 0;
  for (const json& e : t) {
    if (!e.is_string()) throw ConfigError("strata.lora.target holds " + e.dump() + ", not a linear's name" + fix);
    std::string n = e.get<std::string>();
    if (arch == Arch::Llama && n.find('_') == std::string::npos) n += "_proj";  // q -> q_proj
    const auto it = std::find(mods.begin(), mods.end(), n);
    if (it == mods.end())
      throw ConfigError("strata.lora.target \"" + e.get<std::string>() + "\" is not a linear of a " + arch_name(arch) +
                        " block" + fix + (arch == Arch::Gpt2 ? " (c_proj adapts both attn.c_proj and mlp.c_proj, as "
                                                               "peft matches it)" : ""));
    const uint32_t bit = 1u << (it - mods.begin());
    if (mask & bit) throw ConfigError("strata.lora.target names \"" + n + "\" twice: list each linear once");
    mask |= bit;
  }
  return mask;
}

void check_lora(const json&, void* target) { config_of(target).strata.lora.enabled = true; }

const ConfigSection kLora = {
    .path = "strata.lora",
    .keys = {
        {.name = "rank", .type = KeyType::Whole, .min = 1, .max = 65536,
         .help = "LoRA: the adapters' rank r (peft's r); A is [r, in], B [out, r].",
         .field = STRATA_CONFIG_FIELD(Config, strata.lora.rank)},
        {.name = "alpha", .type = KeyType::Double, .lo = 0, .lo_open = true,
         .help = "LoRA: peft's lora_alpha; the adapter's output is scaled by alpha / rank.",
         .field = STRATA_CONFIG_FIELD(Config, strata.lora.alpha)},
        {.name = "target", .type = KeyType::Any, .fallback = "required",
         .help = "LoRA: the block linears to adapt, by peft's names. Llama: q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj (or q, k, v, o, gate, up, down); GPT-2: c_attn, c_proj (attention's "
                 "and the MLP's), c_fc."},
        {.name = "init", .type = KeyType::Text, .fallback = "peft's default: A kaiming-uniform, B zero",
         .help = "LoRA: a peft adapter directory (adapter_config.json, adapter_model.safetensors) whose adapters "
                 "a new run starts from (`strata train --lora-init DIR`); its r, lora_alpha and target_modules "
                 "must be this section's.",
         .field = STRATA_CONFIG_FIELD(Config, strata.lora.init)},
    },
    .check = check_lora,
    .inline_in_parent = true,
};

const ConfigSection kData = {
    .path = "strata.data",
    .keys = {
        {.name = "path", .type = KeyType::Text, .help = "A text file (byte-level tokens) or an llm.c token file.",
         .field = STRATA_CONFIG_FIELD(Config, strata.data.path)},
        {.name = "format", .type = KeyType::Text, .choices = {{"auto", 0}, {"text", 1}, {"tokens", 2}},
         .help = "How to read `data.path`.", .field = STRATA_CONFIG_FIELD(Config, strata.data.format)},
    },
    .inline_in_parent = true,
};

void check_strata(const json& j, void* target) {
  const StrataSection& c = config_of(target).strata;
  for (auto [k, value] : {std::pair{"device_budget", c.device_budget}, std::pair{"pinned_budget", c.pinned_budget},
                          std::pair{"nvme_budget", c.nvme_budget}}) {
    if (!j.contains(k) || value != 0) continue;
    std::string fix = std::string(k) == "nvme_budget"
                          ? "give a size such as \"200GiB\", or remove the key to size the NVMe tier from the plan"
                          : "give a size such as \"8GiB\", or remove the key for the default (1 GiB)";
    throw ConfigError("strata." + std::string(k) + " = " + j.at(k).dump() + " is a budget of 0 bytes: " + fix);
  }
  if (c.device_communicator == DeviceCommunicator::Nccl && c.backend != Backend::Cuda)
    throw ConfigError(std::string("strata.device_communicator = \"nccl\" needs strata.backend = \"cuda\" (it is \"") +
                      to_string(c.backend) + "\"): use \"auto\", or \"staged\" on cpu");
  if (c.device_communicator == DeviceCommunicator::Staged && c.backend == Backend::Sim)
    throw ConfigError("strata.device_communicator = \"staged\" needs a backend with bytes (cpu or cuda), not "
                      "\"sim\", whose collectives are only timed: use \"auto\"");
  if (c.cuda_kernels != CudaKernels::Reference && c.backend != Backend::Cuda)
    throw ConfigError(std::string("strata.cuda_kernels = \"") + to_string(c.cuda_kernels) +
                      "\" selects kernels of the cuda backend, and strata.backend is \"" + to_string(c.backend) +
                      "\": set strata.backend to \"cuda\", or remove strata.cuda_kernels");
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty())
    throw ConfigError("strata.checkpoint_every = " + std::to_string(c.checkpoint_every) +
                      " needs a directory to write to: set strata.checkpoint_dir");
  // strata.lora: the model's adapters, once its arch is known. The base is frozen.
  if (c.lora.enabled) {
    LoraSpec& l = config_of(target).strata.model.lora;
    l.rank = c.lora.rank;
    l.alpha = c.lora.alpha;
    l.targets = lora_targets(j.at("lora"), c.model.arch);
    validate(c.model);
  }
}

const ConfigSection kStrata = {
    .path = "strata",
    .keys = {
        {.name = "backend", .type = KeyType::Text,
         .choices = {{"cpu", int(Backend::Cpu)}, {"cuda", int(Backend::Cuda)}, {"sim", int(Backend::Sim)}},
         .help = "Device backend: cpu (host memory and threads), cuda (one NVIDIA GPU per process) or sim "
                 "(simulated time from a cost model, no data).",
         .field = STRATA_CONFIG_FIELD(Config, strata.backend)},
        {.name = "device_communicator", .type = KeyType::Text,
         .choices = {{"auto", int(DeviceCommunicator::Auto)}, {"nccl", int(DeviceCommunicator::Nccl)},
                     {"staged", int(DeviceCommunicator::Staged)}},
         .help = "What carries collectives on device buffers. nccl (cuda only): NCCL, one rank per GPU. staged: "
                 "each collective copies the device data to pinned host memory, runs it over MPI and copies it "
                 "back, in 64 MiB chunks; ranks may share a GPU (`mpirun -np 4` on one GPU), and on cpu the "
                 "engine's device buffers take this path too. auto: on cuda nccl, or staged when a host has more "
                 "ranks than visible GPUs; on cpu the host communicator. The staged path's cuda side has not yet "
                 "run on a GPU.",
         .field = STRATA_CONFIG_FIELD(Config, strata.device_communicator)},
        {.name = "device_budget", .type = KeyType::Bytes, .help = "Bytes of device memory the engine may hold.",
         .field = STRATA_CONFIG_FIELD(Config, strata.device_budget)},
        {.name = "pinned_budget", .type = KeyType::Bytes, .help = "Bytes of pinned host memory.",
         .field = STRATA_CONFIG_FIELD(Config, strata.pinned_budget)},
        {.name = "nvme_budget", .type = KeyType::Bytes, .fallback = "unset: sized from the plan",
         .help = "Bytes of NVMe swap space.", .field = STRATA_CONFIG_FIELD(Config, strata.nvme_budget)},
        {.name = "checksums", .type = KeyType::Boolean, .help = "xxHash per NVMe extent, verified on read. Through the C API also the parameters each acquire "
                 "hands out, hashed again at their release: a write into them (they are read-only) is an error "
                 "naming the group (docs/embedding.md).",
         .field = STRATA_CONFIG_FIELD(Config, strata.checksums)},
        {.name = "out_of_range", .type = KeyType::Text,
         .choices = {{"refuse", int(OutOfRange::Refuse)}, {"clamp", int(OutOfRange::Clamp)}},
         .help = "A master weight beyond the 16-bit working type's range (fp16: 65504), where initial or loaded "
                 "weights are rounded to it: refuse names the tensor, its largest magnitude and the limit; clamp "
                 "makes it the largest finite value of its sign.",
         .field = STRATA_CONFIG_FIELD(Config, strata.out_of_range)},
        {.name = "speculative_optimizer", .type = KeyType::Boolean,
         .help = "Step each optimizer sub-group during the last micro-step's backward pass, as soon as its "
                 "gradient is reduced, and validate at the step (clipping, non-finite gradients): undone and "
                 "stepped again when it must be, so the result is bit-identical to the plain step. Keeps a "
                 "second set of master weights and moments in the optimizer's tier, where the budget allows.",
         .field = STRATA_CONFIG_FIELD(Config, strata.speculative_optimizer)},
        {.name = "tile_factor", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
         .help = "Memory-centric tiling (DeepSpeed's TiledLinear, out_splits): every linear weight of a block is "
                 "gathered and computed in this many tiles of whole output rows, forward and backward, each "
                 "gathered, used and released in turn, its gradient reduce-scattered as soon as it is written. Must "
                 "divide every linear's rows (an error lists the divisors). Both backends (the "
                 "cuda model's tiles ran on an H200 against the cpu model).",
         .field = STRATA_CONFIG_FIELD(Config, strata.tile_factor)},
        {.name = "quantized_weights_block", .type = KeyType::Whole, .min = 16, .max = 1 << 20,
         .help = "zero_optimization.zero_quantized_weights: elements per int8 block, each with one fp32 scale "
                 "(4 bytes): 256 moves 1.016 bytes per element instead of 2 (bf16) or 4 (fp32).",
         .field = STRATA_CONFIG_FIELD(Config, strata.quantized_weights_block)},
        {.name = "quantized_gradients_block", .type = KeyType::Whole, .min = 16, .max = 1 << 20,
         .help = "zero_optimization.zero_quantized_gradients: elements per int8 block of a gradient, each with one "
                 "fp32 scale (4 bytes): 256 moves 1.016 bytes per element instead of 2 (bf16) or 4 (fp32).",
         .field = STRATA_CONFIG_FIELD(Config, strata.quantized_gradients_block)},
        {.name = "tile_size", .type = KeyType::Whole, .min = 0,
         .help = "Memory-centric tiling by size, in elements: a block linear whose weight holds more than this is "
                 "cut into the fewest tiles of whole output rows (at least tile_factor, dividing its rows) of at most "
                 "this many elements, each gathered, computed and released in turn; smaller linears are tiled by "
                 "tile_factor only. 0: off. At least one row of the widest linear (an error says how much). Both backends "
                 "(the cuda model's tiles ran on an H200 against the cpu model).",
         .field = STRATA_CONFIG_FIELD(Config, strata.tile_size)},
        {.name = "seed", .type = KeyType::Whole, .min = 0, .help = "Random seed.",
         .field = STRATA_CONFIG_FIELD(Config, strata.seed)},
        {.name = "trace", .type = KeyType::Text, .help = "Chrome trace output path; empty turns tracing off.",
         .field = STRATA_CONFIG_FIELD(Config, strata.trace)},
        {.name = "steps", .type = KeyType::Whole, .min = 1, .max = kMaxInt, .help = "Optimizer steps to run.",
         .field = STRATA_CONFIG_FIELD(Config, strata.steps)},
        {.name = "checkpoint_every", .type = KeyType::Whole, .min = 0, .max = kMaxInt,
         .help = "Save a checkpoint every this many steps; 0 turns it off. Needs `checkpoint_dir`.",
         .field = STRATA_CONFIG_FIELD(Config, strata.checkpoint_every)},
        {.name = "checkpoint_dir", .type = KeyType::Text, .help = "Where checkpoints go.",
         .field = STRATA_CONFIG_FIELD(Config, strata.checkpoint_dir)},
        {.name = "collective_timeout", .type = KeyType::Double, .lo = 0, .note = "0 turns the watchdog off",
         .help = "Seconds a collective (mpi backend) may wait for the other ranks. Past it, every rank that can "
                 "prints which collective, on which communicator, how long, and which ranks have not arrived (or did "
                 "not answer: stopped, hung or gone), then exits with code 6; checkpoints saved before stay "
                 "complete. The default is DeepSpeed's process-group timeout, 30 minutes.",
         .field = STRATA_CONFIG_FIELD(Config, strata.collective_timeout)},
        {.name = "ranks_per_node", .type = KeyType::Whole, .min = 0, .max = kMaxInt,
         .note = "0 takes the launcher's hosts",
         .help = "Ranks a node, for the layouts that tell nodes apart (zero_optimization.mics_shard_size): "
                 "consecutive ranks make a node. Set it to run those layouts on one host as if on several "
                 "(the tests do); it must divide the world size.",
         .field = STRATA_CONFIG_FIELD(Config, strata.ranks_per_node)},
        {.name = "cuda_kernels", .type = KeyType::Text,
         .choices = {{"reference", int(CudaKernels::Reference)}, {"fused", int(CudaKernels::Fused)}},
         .help = "The cuda backend's model kernels: reference (cuBLAS matmuls, then bias, GELU, column-sum and "
                 "norm kernels; checked against the cpu model on an H100 and an H200) or fused (cuBLASLt matmuls "
                 "with bias, GELU, residual and bias gradients in their epilogues, row-parallel norm kernels; NOT yet "
                 "run on a GPU, docs/training.md). Refused on the cpu and sim backends.",
         .field = STRATA_CONFIG_FIELD(Config, strata.cuda_kernels)},
        {.name = "model", .type = KeyType::Section, .section = &kModel},
        {.name = "data", .type = KeyType::Section, .section = &kData},
        {.name = "lora", .type = KeyType::Section,
         .help = "LoRA adapters on a frozen base model (table below); absent: the whole model trains.",
         .section = &kLora},
    },
    .check = check_strata,
};

// ---- the top level --------------------------------------------------------------------

void* aio_of(void* t) { return &config_of(t).aio; }

ConfigSection make_top() {
  return {
      .path = "",
      .keys = {
          {.name = "train_batch_size", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
           .help = "Global batch. When given it must equal micro batch × accumulation steps × world size (checked "
                   "by `validate_for_world`, with the numbers and the fix). It is never used to derive the other "
                   "two.",
           .field = STRATA_CONFIG_FIELD(Config, train_batch_size)},
          {.name = "train_micro_batch_size_per_gpu", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
           .help = "Sequences per rank per forward/backward.",
           .field = STRATA_CONFIG_FIELD(Config, train_micro_batch_size_per_gpu)},
          {.name = "gradient_accumulation_steps", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
           .help = "Micro batches per optimizer step.",
           .field = STRATA_CONFIG_FIELD(Config, gradient_accumulation_steps)},
          {.name = "gradient_clipping", .type = KeyType::Float, .lo = 0, .note = "0 turns clipping off",
           .help = "Clip the global gradient norm to this value.",
           .field = STRATA_CONFIG_FIELD(Config, gradient_clipping)},
          {.name = "steps_per_print", .type = KeyType::Whole, .min = 1, .max = kMaxInt,
           .help = "Print loss and throughput every this many steps.",
           .field = STRATA_CONFIG_FIELD(Config, steps_per_print)},
          {.name = "bf16", .type = KeyType::Section, .section = &kBf16},
          {.name = "fp16", .type = KeyType::Section, .section = &kFp16, .enter = fp16_of},
          {.name = "optimizer", .type = KeyType::Section, .help = "Adam or AdamW and its parameters (table below).",
           .section = &kOptimizer},
          {.name = "scheduler", .type = KeyType::Section, .fallback = "none: constant lr",
           .help = "DeepSpeed's learning-rate schedules (table below).", .section = &scheduler_config_section()},
          {.name = "zero_optimization", .type = KeyType::Section,
           .help = "ZeRO stage, offload and prefetching (table below).", .section = &kZero},
          {.name = "aio", .type = KeyType::Section, .help = "The NVMe I/O engine (table below).",
           .section = &aio_config_section(), .enter = aio_of},
          {.name = "activation_checkpointing", .type = KeyType::Section,
           .help = "Recomputing activations in backward (table below).", .section = &kActivationCheckpointing},
          {.name = "strata", .type = KeyType::Section,
           .help = "What DeepSpeed lacks: backend, tier budgets, model, data, steps, checkpoints (table below).",
           .section = &kStrata},
      },
      .check = check_top,
  };
}

}  // namespace

const ConfigSection& config_table() {
  static const ConfigSection top = make_top();
  return top;
}

}  // namespace strata
