// Parsing and validation of the run configuration (config.hpp, docs/configuration.md).
//
// Every section checks its keys against a fixed list before reading any value, so a
// typo is reported as an unknown key with the nearest valid one rather than silently
// falling back to a default. Values are read with typed readers that name the dotted
// key, the value given and what is accepted. Checks that involve several keys run
// after every section has been read, each naming the fix.
#include "strata/runtime/config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include "strata/core/config_keys.hpp"
#include "strata/core/error.hpp"

namespace strata {

using nlohmann::json;

const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None: return "none";
    case OffloadDevice::Cpu: return "cpu";
    case OffloadDevice::Nvme: return "nvme";
  }
  return "?";
}

Tier home_tier(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None: return Tier::Device;
    case OffloadDevice::Cpu: return Tier::Pinned;
    case OffloadDevice::Nvme: return Tier::Nvme;
  }
  return Tier::Device;
}

namespace {

[[noreturn]] void bad_value(const std::string& key, const json& v, const std::string& accepted) {
  std::string msg = key + " = " + v.dump() + " is invalid: expected " + accepted;
  // HuggingFace's DeepSpeed integration writes "auto" and fills it in before DeepSpeed
  // reads the file; a config copied from there reaches us with the placeholder intact.
  if (v.is_string() && v.get_ref<const std::string&>() == "auto")
    msg += " (\"auto\" is a placeholder the HuggingFace Trainer fills in; give the value itself)";
  throw ConfigError(msg);
}

bool as_bool(const std::string& key, const json& v) {
  if (!v.is_boolean()) bad_value(key, v, "true or false");
  return v.get<bool>();
}

std::string as_string(const std::string& key, const json& v) {
  if (!v.is_string()) bad_value(key, v, "a string");
  return v.get<std::string>();
}

std::string range_text(uint64_t lo, uint64_t hi) {
  if (hi == UINT64_MAX) return "a whole number >= " + std::to_string(lo);
  if (hi == uint64_t(INT_MAX)) return "a whole number >= " + std::to_string(lo) + " (at most " + std::to_string(hi) + ")";
  return "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
}

// Whole numbers. DeepSpeed's configs write element counts as 5e7, which JSON parsers
// read as floating point, so a float with no fractional part is a whole number here.
// Booleans and strings are refused: `true` or "8" as a count is a mistake, not a choice.
uint64_t as_whole(const std::string& key, const json& v, uint64_t lo, uint64_t hi) {
  uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) bad_value(key, v, range_text(lo, hi));
    x = static_cast<uint64_t>(s);
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^64 itself does not fit; converting it would be undefined.
    if (!(d >= 0.0 && d < 18446744073709551616.0) || d != std::floor(d)) bad_value(key, v, range_text(lo, hi));
    x = static_cast<uint64_t>(d);
  } else {
    bad_value(key, v, range_text(lo, hi));
  }
  if (x < lo || x > hi) bad_value(key, v, range_text(lo, hi));
  return x;
}

double as_number(const std::string& key, const json& v, const char* accepted) {
  if (!v.is_number()) bad_value(key, v, accepted);
  return v.get<double>();
}

// Floats with a range check; `ok` sees the value already narrowed to float, so 1e300
// (infinite as a float) fails like any other out-of-range value.
using FloatCheck = bool (*)(float);
bool positive(float x) { return std::isfinite(x) && x > 0.0f; }
bool non_negative(float x) { return std::isfinite(x) && x >= 0.0f; }
bool unit_half_open(float x) { return x >= 0.0f && x < 1.0f; }
bool unit_closed(float x) { return x >= 0.0f && x <= 1.0f; }

float as_float(const std::string& key, const json& v, FloatCheck ok, const char* accepted) {
  float x = static_cast<float>(as_number(key, v, accepted));
  if (!ok(x)) bad_value(key, v, accepted);
  return x;
}

// One JSON object of the config. The constructor rejects unknown keys, so the readers
// below only ever see names from `keys`.
class Section {
 public:
  Section(const json& j, std::string path, std::vector<std::string> keys) : j_(j), path_(std::move(path)) {
    if (!j.is_object()) bad_value(path_.empty() ? "the config's top level" : path_, j, "a JSON object");
    for (const auto& [k, v] : j.items()) {
      bool known = false;
      for (const auto& valid : keys) known = known || k == valid;
      if (!known) throw_unknown_key(path_, k, keys);
    }
  }

  std::string key(std::string_view k) const { return path_.empty() ? std::string(k) : path_ + "." + std::string(k); }
  const json* find(const char* k) const {
    auto it = j_.find(k);
    return it == j_.end() ? nullptr : &*it;
  }
  bool has(const char* k) const { return find(k) != nullptr; }

  // A nested section; absent reads as an empty object, so its defaults apply.
  Section sub(const char* k, std::vector<std::string> keys) const {
    static const json kEmpty = json::object();
    const json* v = find(k);
    return Section(v ? *v : kEmpty, key(k), std::move(keys));
  }

  void read(const char* k, bool& out) const {
    if (const json* v = find(k)) out = as_bool(key(k), *v);
  }
  void read(const char* k, std::string& out) const {
    if (const json* v = find(k)) out = as_string(key(k), *v);
  }
  void read(const char* k, int& out, int lo, int hi = INT_MAX) const {
    if (const json* v = find(k)) out = static_cast<int>(as_whole(key(k), *v, uint64_t(lo), uint64_t(hi)));
  }
  void read(const char* k, uint64_t& out, uint64_t lo, uint64_t hi = UINT64_MAX) const {
    if (const json* v = find(k)) out = as_whole(key(k), *v, lo, hi);
  }
  void read(const char* k, float& out, FloatCheck ok, const char* accepted) const {
    if (const json* v = find(k)) out = as_float(key(k), *v, ok, accepted);
  }
  void read_bytes(const char* k, uint64_t& out) const {
    if (const json* v = find(k)) out = parse_bytes(*v, key(k));
  }

 private:
  const json& j_;
  std::string path_;
};

// ---- sections ---------------------------------------------------------------------

OptimizerConfig parse_optimizer(const Section& top) {
  OptimizerConfig c;
  Section s = top.sub("optimizer", {"type", "params"});
  bool adamw_type = true;
  if (const json* t = s.find("type")) {
    std::string name = as_string(s.key("type"), *t);
    std::string lower;
    for (char ch : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == "adam")
      adamw_type = false;
    else if (lower != "adamw")
      bad_value(s.key("type"), *t, "\"Adam\" or \"AdamW\" (case-insensitive; the CPU optimizer implements only these)");
  }
  Section p = s.sub("params", {"lr", "betas", "eps", "weight_decay", "adam_w_mode"});
  p.read("lr", c.lr, positive, "a number > 0");
  if (const json* b = p.find("betas")) {
    const char* accepted = "a list of two numbers [beta1, beta2], each in [0, 1)";
    if (!b->is_array() || b->size() != 2) bad_value(p.key("betas"), *b, accepted);
    c.beta1 = as_float(p.key("betas"), (*b)[0], unit_half_open, accepted);
    c.beta2 = as_float(p.key("betas"), (*b)[1], unit_half_open, accepted);
  }
  p.read("eps", c.eps, positive, "a number > 0");
  p.read("weight_decay", c.weight_decay, non_negative, "a number >= 0");
  // DeepSpeed's "Adam" decouples weight decay (AdamW) unless adam_w_mode is false;
  // following it keeps a DeepSpeed config training the same way here.
  bool adam_w_mode = true;
  p.read("adam_w_mode", adam_w_mode);
  if (adamw_type && !adam_w_mode)
    throw ConfigError(p.key("adam_w_mode") + " = false contradicts optimizer.type \"AdamW\": for Adam with L2 "
                      "weight decay set optimizer.type to \"Adam\"");
  c.kind = (adamw_type || adam_w_mode) ? OptimizerKind::AdamW : OptimizerKind::Adam;
  return c;
}

// optimizer.params.lr as written, in double (parse_optimizer has checked it; the float
// in OptimizerConfig would put float rounding into every scheduled lr).
double optimizer_lr_as_written(const json& top) {
  auto o = top.find("optimizer");
  if (o == top.end() || !o->is_object()) return 1e-3;
  auto p = o->find("params");
  if (p == o->end() || !p->is_object()) return 1e-3;
  auto lr = p->find("lr");
  return lr == p->end() ? 1e-3 : lr->get<double>();
}

// A learning rate or ratio of the scheduler: a finite number in [lo, hi] (hi may be
// infinite), kept in double as DeepSpeed computes with Python floats.
double read_scheduler_number(const Section& s, const char* k, double fallback, double lo, double hi,
                             bool lo_open, const char* accepted) {
  const json* v = s.find(k);
  if (!v) return fallback;
  const double x = as_number(s.key(k), *v, accepted);
  if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) bad_value(s.key(k), *v, accepted);
  return x;
}

// DeepSpeed's `scheduler` section: {"type": ..., "params": {...}}. DeepSpeed passes
// params to the scheduler class as keyword arguments, so each type takes only its own
// keys; a key of another type gets a message saying which type it belongs to.
SchedulerConfig parse_scheduler(const Section& top, double optimizer_lr) {
  SchedulerConfig c;
  c.optimizer_lr = optimizer_lr;
  if (!top.has("scheduler")) return c;
  Section s = top.sub("scheduler", {"type", "params"});
  const char* types = "\"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\" (case-sensitive, as in DeepSpeed; "
                      "DeepSpeed's OneCycle and LRRangeTest and torch.optim.lr_scheduler classes are not supported)";
  const json* t = s.find("type");
  if (!t)
    throw ConfigError("scheduler.type is missing: give one of " + std::string(types) +
                      ", or remove the scheduler section for a constant learning rate (optimizer.params.lr)");
  const std::string name = as_string(s.key("type"), *t);
  if (name == "WarmupLR")
    c.type = LrScheduleType::WarmupLR;
  else if (name == "WarmupDecayLR")
    c.type = LrScheduleType::WarmupDecayLR;
  else if (name == "WarmupCosineLR")
    c.type = LrScheduleType::WarmupCosineLR;
  else
    bad_value(s.key("type"), *t, types);

  const bool cosine = c.type == LrScheduleType::WarmupCosineLR;
  const bool decays = c.type != LrScheduleType::WarmupLR;
  std::vector<std::string> keys = {"warmup_num_steps", "warmup_type"};
  if (decays) keys.push_back("total_num_steps");
  if (cosine) {
    keys.insert(keys.end(), {"warmup_min_ratio", "cos_min_ratio"});
  } else {
    keys.insert(keys.end(), {"warmup_min_lr", "warmup_max_lr"});
  }
  // Keys that belong to another of the three types: say whose they are, and the fix.
  if (const json* p = s.find("params"); p && p->is_object()) {
    for (const auto& [k, v] : p->items()) {
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
      const std::string key = "scheduler.params." + k;
      if (k == "total_num_steps")
        throw ConfigError(key + " does not apply to WarmupLR, which holds warmup_max_lr after the warm-up: remove "
                          "it, or set scheduler.type to \"WarmupDecayLR\" or \"WarmupCosineLR\" to decay the "
                          "learning rate until total_num_steps");
      if (k == "warmup_min_lr" || k == "warmup_max_lr")
        throw ConfigError(key + " does not apply to WarmupCosineLR, whose peak is optimizer.params.lr and whose "
                          "start and end are warmup_min_ratio and cos_min_ratio of it: remove " + key +
                          " and set optimizer.params.lr (and the ratios), or use \"WarmupDecayLR\" for "
                          "warmup_min_lr/warmup_max_lr with a linear decay");
      if (k == "warmup_min_ratio" || k == "cos_min_ratio")
        throw ConfigError(key + " only applies to WarmupCosineLR (scheduler.type is \"" + name + "\"): remove it, "
                          "or set scheduler.type to \"WarmupCosineLR\"");
    }
  }
  Section p = s.sub("params", keys);

  if (const json* v = p.find("warmup_num_steps"))
    c.warmup_num_steps = static_cast<int64_t>(as_whole(p.key("warmup_num_steps"), *v, 1, INT_MAX));
  if (const json* v = p.find("warmup_type")) {
    const std::string w = as_string(p.key("warmup_type"), *v);
    if (w == "log")
      c.warmup_type = WarmupType::Log;
    else if (w == "linear")
      c.warmup_type = WarmupType::Linear;
    else
      bad_value(p.key("warmup_type"), *v, "\"log\" or \"linear\" (DeepSpeed falls back to \"log\" with a warning)");
  }
  if (decays) {
    const json* v = p.find("total_num_steps");
    if (!v)
      throw ConfigError("scheduler.params.total_num_steps is required for " + name +
                        ": set it to the optimizer step the decay ends at (usually the run's length, strata.steps)");
    c.total_num_steps = static_cast<int64_t>(as_whole(p.key("total_num_steps"), *v, 1, INT_MAX));
  }
  if (cosine) {
    c.warmup_min_ratio = read_scheduler_number(p, "warmup_min_ratio", 0.0, 0.0, 1.0, false, "a number from 0 to 1");
    c.cos_min_ratio = read_scheduler_number(p, "cos_min_ratio", 1e-4, 0.0, 1.0, false, "a number from 0 to 1");
  } else {
    c.warmup_min_lr = read_scheduler_number(p, "warmup_min_lr", 0.0, 0.0, HUGE_VAL, false, "a number >= 0");
    // DeepSpeed: WarmupLR's warmup_max_lr defaults to the optimizer's lr, WarmupDecayLR's to 0.001.
    const double max_default = c.type == LrScheduleType::WarmupLR ? optimizer_lr : 1e-3;
    c.warmup_max_lr = read_scheduler_number(p, "warmup_max_lr", max_default, 0.0, HUGE_VAL, true, "a number > 0");
  }

  // Checks across keys, once every value has been read.
  if (decays && c.total_num_steps < c.warmup_num_steps)
    throw ConfigError("scheduler.params.total_num_steps = " + std::to_string(c.total_num_steps) +
                      " is less than scheduler.params.warmup_num_steps = " + std::to_string(c.warmup_num_steps) +
                      (p.has("warmup_num_steps") ? "" : " (the default)") +
                      ": the decay follows the warm-up; raise total_num_steps or lower warmup_num_steps");
  if (!cosine && c.warmup_min_lr > c.warmup_max_lr) {
    std::string max_from = p.has("warmup_max_lr")          ? ""
                           : c.type == LrScheduleType::WarmupLR ? " (not given: optimizer.params.lr)"
                                                                : " (not given: the default)";
    throw ConfigError("scheduler.params.warmup_min_lr = " + p.find("warmup_min_lr")->dump() +
                      " is above scheduler.params.warmup_max_lr = " + json(c.warmup_max_lr).dump() + max_from +
                      ": the warm-up rises from warmup_min_lr to warmup_max_lr; lower warmup_min_lr or raise "
                      "warmup_max_lr");
  }
  return c;
}

// nvme_path: DeepSpeed's single directory, or a list to stripe across several drives.
std::vector<std::string> read_paths(const Section& s, const char* k) {
  const json* v = s.find(k);
  if (!v || v->is_null()) return {};  // null is DeepSpeed's default (None)
  const char* accepted = "a directory path or a non-empty list of directory paths";
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array() && !v->empty()) {
    for (const auto& e : *v) {
      if (!e.is_string()) bad_value(s.key(k), *v, accepted);
      out.push_back(e.get<std::string>());
    }
  } else {
    bad_value(s.key(k), *v, accepted);
  }
  std::set<std::string> seen;
  for (const auto& p : out) {
    if (p.empty()) bad_value(s.key(k), *v, accepted);
    if (!seen.insert(p).second)
      throw ConfigError(s.key(k) + " lists '" + p + "' twice: list each directory once");
  }
  return out;
}

OffloadDevice read_device(const Section& s) {
  const json* v = s.find("device");
  if (!v) return OffloadDevice::None;
  std::string d = as_string(s.key("device"), *v);
  if (d == "none") return OffloadDevice::None;
  if (d == "cpu") return OffloadDevice::Cpu;
  if (d == "nvme") return OffloadDevice::Nvme;
  bad_value(s.key("device"), *v, "one of \"none\", \"cpu\", \"nvme\"");
}

// offload_param and offload_optimizer share device, nvme_path and pin_memory. The
// buffer sizing keys are DeepSpeed's; Strata sizes its buffers from the tier budgets,
// so they are type-checked and otherwise ignored.
OffloadConfig parse_offload_param(const Section& zero) {
  Section s = zero.sub("offload_param",
                       {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"});
  OffloadConfig c;
  c.device = read_device(s);
  c.nvme_path = read_paths(s, "nvme_path");
  s.read("pin_memory", c.pin_memory);
  uint64_t ignored = 0;
  s.read("buffer_count", ignored, 1);
  s.read("buffer_size", ignored, 1);
  s.read("max_in_cpu", ignored, 0);
  return c;
}

OffloadConfig parse_offload_optimizer(const Section& zero) {
  Section s = zero.sub("offload_optimizer",
                       {"device", "nvme_path", "pin_memory", "buffer_count", "fast_init", "ratio"});
  OffloadConfig c;
  c.device = read_device(s);
  c.nvme_path = read_paths(s, "nvme_path");
  s.read("pin_memory", c.pin_memory);
  uint64_t ignored_count = 0;
  s.read("buffer_count", ignored_count, 1);
  bool ignored_flag = false;
  s.read("fast_init", ignored_flag);
  float ignored_ratio = 1.0f;
  s.read("ratio", ignored_ratio, unit_closed, "a number from 0 to 1");
  return c;
}

const std::vector<std::string> kStage3Keys = {"stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                                              "stage3_max_reuse_distance", "stage3_param_persistence_threshold"};

ZeroConfig parse_zero(const Section& top) {
  std::vector<std::string> keys = {"stage",          "offload_param",        "offload_optimizer",
                                   "sub_group_size", "reduce_bucket_size",   "allgather_bucket_size",
                                   "overlap_comm",   "contiguous_gradients", "reduce_scatter",
                                   "allgather_partitions"};
  keys.insert(keys.end(), kStage3Keys.begin(), kStage3Keys.end());
  Section s = top.sub("zero_optimization", keys);
  ZeroConfig c;
  if (const json* v = s.find("stage")) {
    const char* accepted = "1, 2 or 3 (stage 0, plain data parallelism, is not supported)";
    if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > 3)
      bad_value(s.key("stage"), *v, accepted);
    c.stage = v->get<int>();
  }
  c.offload_param = parse_offload_param(s);
  c.offload_optimizer = parse_offload_optimizer(s);
  s.read("stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size, 0);
  s.read("stage3_max_live_parameters", c.stage3_max_live_parameters, 1);
  s.read("stage3_max_reuse_distance", c.stage3_max_reuse_distance, 0);
  s.read("stage3_param_persistence_threshold", c.stage3_param_persistence_threshold, 0);
  s.read("sub_group_size", c.sub_group_size, 1);
  s.read("reduce_bucket_size", c.reduce_bucket_size, 1);
  s.read("overlap_comm", c.overlap_comm);
  // Accepted for DeepSpeed configs; Strata's buckets and gradient layout are fixed.
  uint64_t ignored_count = 0;
  s.read("allgather_bucket_size", ignored_count, 1);
  bool ignored_flag = false;
  s.read("contiguous_gradients", ignored_flag);
  s.read("reduce_scatter", ignored_flag);
  s.read("allgather_partitions", ignored_flag);

  if (c.stage != 3) {
    const std::string stage = std::to_string(c.stage);
    for (const auto& k : kStage3Keys)
      if (s.has(k.c_str()))
        throw ConfigError(s.key(k) + " only applies to ZeRO stage 3 (zero_optimization.stage is " + stage +
                          "): remove it or set zero_optimization.stage to 3");
    if (s.has("offload_param"))
      throw ConfigError(s.key("offload_param") + " only applies to ZeRO stage 3 (zero_optimization.stage is " +
                        stage + "; parameters are not partitioned below stage 3): remove it or set "
                        "zero_optimization.stage to 3");
  }
  return c;
}

ActivationCheckpointingConfig parse_activation_checkpointing(const Section& top) {
  Section s = top.sub("activation_checkpointing",
                      {"enabled", "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                       "number_checkpoints", "synchronize_checkpoint_boundary", "profile"});
  ActivationCheckpointingConfig c;
  s.read("enabled", c.enabled);
  s.read("partition_activations", c.partition_activations);
  s.read("cpu_checkpointing", c.cpu_checkpointing);
  // DeepSpeed's tuning and profiling switches: accepted, no effect here.
  bool ignored_flag = false;
  s.read("contiguous_memory_optimization", ignored_flag);
  s.read("synchronize_checkpoint_boundary", ignored_flag);
  s.read("profile", ignored_flag);
  if (const json* v = s.find("number_checkpoints"); v && !v->is_null())
    as_whole(s.key("number_checkpoints"), *v, 1, INT_MAX);
  return c;
}

StrataSection parse_strata(const Section& top) {
  Section s = top.sub("strata", {"backend", "device_budget", "pinned_budget", "nvme_budget", "checksums", "seed",
                                 "trace", "steps", "checkpoint_every", "checkpoint_dir", "model", "data"});
  StrataSection c;
  if (const json* v = s.find("backend")) {
    std::string name = as_string(s.key("backend"), *v);
    try {
      c.backend = parse_backend(name);
    } catch (const ConfigError& e) {
      throw ConfigError(s.key("backend") + " = " + v->dump() + " is invalid: " + e.what());
    }
  }
  for (auto [k, out] : {std::pair{"device_budget", &c.device_budget}, std::pair{"pinned_budget", &c.pinned_budget},
                        std::pair{"nvme_budget", &c.nvme_budget}}) {
    if (!s.has(k)) continue;
    s.read_bytes(k, *out);
    if (*out == 0) {
      std::string fix = std::string(k) == "nvme_budget"
                            ? "give a size such as \"200GiB\", or remove the key to size the NVMe tier from the plan"
                            : "give a size such as \"8GiB\", or remove the key for the default (1 GiB)";
      throw ConfigError(s.key(k) + " = " + s.find(k)->dump() + " is a budget of 0 bytes: " + fix);
    }
  }
  s.read("checksums", c.checksums);
  s.read("seed", c.seed, 0);
  s.read("trace", c.trace);
  s.read("steps", c.steps, 1);
  s.read("checkpoint_every", c.checkpoint_every, 0);
  s.read("checkpoint_dir", c.checkpoint_dir);
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty())
    throw ConfigError(s.key("checkpoint_every") + " = " + std::to_string(c.checkpoint_every) +
                      " needs a directory to write to: set strata.checkpoint_dir");

  Section m = s.sub("model", {"layers", "d_model", "heads", "seq_len", "vocab"});
  m.read("layers", c.model.layers, 1);
  m.read("d_model", c.model.d_model, 1);
  m.read("heads", c.model.heads, 1);
  m.read("seq_len", c.model.seq_len, 1);
  // Token files hold uint16 ids, so ids must stay below 65536.
  m.read("vocab", c.model.vocab, 1, 65536);
  if (c.model.d_model % c.model.heads != 0)
    throw ConfigError("strata.model.d_model = " + std::to_string(c.model.d_model) +
                      " is not divisible by strata.model.heads = " + std::to_string(c.model.heads) +
                      ": each head needs d_model / heads channels; change one so heads divides d_model");

  Section d = s.sub("data", {"path", "format"});
  d.read("path", c.data.path);
  if (const json* v = d.find("format")) {
    c.data.format = as_string(d.key("format"), *v);
    if (c.data.format != "auto" && c.data.format != "text" && c.data.format != "tokens")
      bad_value(d.key("format"), *v, "one of \"auto\", \"text\", \"tokens\"");
  }
  return c;
}

// A directory for swap files must exist and be writable now, not when the first
// block is evicted mid-run.
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

// Bytes from a decimal number with an optional fraction and exponent and an optional
// unit; nullopt when `s` is not of that form.
std::optional<uint64_t> bytes_from_string(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > start;
  };
  bool whole = digits();
  bool frac = false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    frac = digits();
  }
  if (!whole && !frac) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return std::nullopt;
  }
  double number = 0;
  if (std::from_chars(s.data(), s.data() + i, number).ec != std::errc()) return std::nullopt;
  while (i < s.size() && s[i] == ' ') ++i;
  std::string unit;
  for (; i < s.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1.0},      {"b", 1.0},           {"kb", 1e3},          {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12},   {"kib", 1024.0},      {"mib", 1048576.0},   {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    double bytes = std::round(number * scale);
    if (!(bytes < 18446744073709551616.0)) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

// The byte offset (0-based) of a parse error as 1-based line and column.
std::pair<size_t, size_t> line_col(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i)
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  return {line, offset - line_start + 1};
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    throw ConfigError("cannot open config file '" + path + "': " + std::strerror(err));
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw ConfigError("cannot read config file '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace

uint64_t parse_bytes(const json& v, const std::string& key) {
  const char* accepted =
      "a byte count: a whole number, or a string such as \"512MiB\", \"2GB\", \"1.5GiB\" (units B, KB, MB, GB, TB "
      "in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024)";
  if (v.is_number()) return as_whole(key, v, 0, UINT64_MAX);
  if (!v.is_string()) bad_value(key, v, accepted);
  auto bytes = bytes_from_string(v.get_ref<const std::string&>());
  if (!bytes) bad_value(key, v, accepted);
  return *bytes;
}

Config parse_config(const json& j) {
  Section top(j, "",
              {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
               "gradient_clipping", "steps_per_print", "bf16", "fp16", "optimizer", "scheduler", "zero_optimization",
               "aio", "activation_checkpointing", "strata"});
  Config c;
  c.raw = j;
  top.read("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, 1);
  top.read("gradient_accumulation_steps", c.gradient_accumulation_steps, 1);
  if (top.has("train_batch_size")) {
    int tbs = 0;
    top.read("train_batch_size", tbs, 1);
    c.train_batch_size = tbs;
  }
  top.read("gradient_clipping", c.gradient_clipping, non_negative, "a number >= 0 (0 turns clipping off)");
  top.read("steps_per_print", c.steps_per_print, 1);

  top.sub("bf16", {"enabled"}).read("enabled", c.bf16);
  // fp16's loss-scaling keys are accepted so that a DeepSpeed config with fp16 turned
  // off parses; turning it on is refused below.
  Section fp16 = top.sub("fp16", {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                                  "hysteresis", "consecutive_hysteresis", "min_loss_scale"});
  bool fp16_enabled = false;
  fp16.read("enabled", fp16_enabled);
  if (fp16_enabled)
    throw ConfigError("fp16.enabled = true is not supported: Strata has no loss scaling; it trains fp32 working "
                      "parameters (a bf16 working copy is planned): set fp16.enabled to false");

  c.optimizer = parse_optimizer(top);
  c.scheduler = parse_scheduler(top, optimizer_lr_as_written(j));
  c.zero = parse_zero(top);
  if (const json* a = top.find("aio")) c.aio = parse_aio_config(*a);
  c.activation_checkpointing = parse_activation_checkpointing(top);
  c.strata = parse_strata(top);

  check_nvme_dirs("zero_optimization.offload_param", c.zero.offload_param);
  check_nvme_dirs("zero_optimization.offload_optimizer", c.zero.offload_optimizer);
  return c;
}

json load_config_json(const std::string& path) {
  std::string text = read_file(path);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw ConfigError("config file '" + path + "' is empty: it must hold a JSON object, e.g. "
                      "{\"train_micro_batch_size_per_gpu\": 1}");

  // Duplicate keys: JSON leaves the winner to the parser (nlohmann keeps the last,
  // others the first), and DeepSpeed rejects them, so a repeated key is an error.
  struct Frame {
    std::string name;
    bool object;
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  auto dotted = [&](const std::string& leaf) {
    std::string p;
    for (size_t i = 1; i < frames.size(); ++i) p += frames[i].name + (frames[i].object ? "." : "");
    return p + leaf;
  };
  json::parser_callback_t on_event = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        std::string name = frames.empty() ? "" : frames.back().object ? frames.back().last_key : "[]";
        frames.push_back({name, ev == json::parse_event_t::object_start, {}, {}});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!frames.back().keys.insert(k).second)
          throw ConfigError("config file '" + path + "': key '" + dotted(k) + "' appears twice: keep only one");
        frames.back().last_key = k;
        break;
      }
      default:
        break;
    }
    return true;
  };

  json j;
  try {
    j = json::parse(text, on_event);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the position of the character the parser stopped at.
    auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string detail = e.what();
    size_t colon = detail.find(": ", detail.find("parse error"));
    if (colon != std::string::npos) detail = detail.substr(colon + 2);
    throw ConfigError("config file '" + path + "' is not valid JSON at line " + std::to_string(line) +
                      ", column " + std::to_string(col) + ": " + detail);
  }
  return j;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  json j = load_config_json(path);
  for (const auto& o : overrides) apply_override(j, o);
  try {
    return parse_config(j);
  } catch (const ConfigError& e) {
    throw ConfigError("config file '" + path + "'" + (overrides.empty() ? "" : " with the overrides") + ": " +
                      e.what());
  }
}

void apply_override(json& j, const std::string& assignment) {
  const std::string example = "write key=value, e.g. zero_optimization.stage=2";
  size_t eq = assignment.find('=');
  if (eq == std::string::npos)
    throw ConfigError("override '" + assignment + "' has no '=': " + example);
  std::string path = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);

  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts)
    if (p.empty()) throw ConfigError("override '" + assignment + "' has an empty key name: " + example);

  if (j.is_null()) j = json::object();
  if (!j.is_object()) throw ConfigError("cannot apply override '" + assignment + "': the config is not a JSON object");
  json* cur = &j;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (i ? "." : "") + parts[i];
    json& next = (*cur)[parts[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object())
      throw ConfigError("cannot apply override '" + assignment + "': '" + walked + "' is " + next.dump() +
                        ", not a section");
    cur = &next;
  }
  // A value that parses as JSON is taken as such (2, true, [..], "quoted"); anything
  // else is a plain string (nvme, 2GiB, /local_nvme).
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  (*cur)[parts.back()] = std::move(value);
}

void validate_for_world(const Config& c, int world_size) {
  STRATA_CHECK(world_size >= 1, "world size " + std::to_string(world_size));
  if (!c.train_batch_size) return;
  const int64_t micro = c.train_micro_batch_size_per_gpu, accum = c.gradient_accumulation_steps;
  const int64_t product = micro * accum * world_size;
  const int64_t tbs = *c.train_batch_size;
  if (tbs == product) return;
  std::string msg = "train_batch_size = " + std::to_string(tbs) +
                    " does not match train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size = " +
                    std::to_string(micro) + " * " + std::to_string(accum) + " * " + std::to_string(world_size) +
                    " = " + std::to_string(product) + ": ";
  if (tbs % (micro * world_size) == 0)
    msg += "set gradient_accumulation_steps to " + std::to_string(tbs / (micro * world_size)) +
           ", or remove train_batch_size";
  else
    msg += "make train_batch_size a multiple of train_micro_batch_size_per_gpu * world size (" +
           std::to_string(micro * world_size) + "), or remove it";
  throw ConfigError(msg);
}

}  // namespace strata
