#include "c_api_runtime.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>

#include <xxhash.h>

#include "strata/core/convert.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/core/value_checks.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/runtime/engine/loss_scaler.hpp"
#include "strata/runtime/config/lr_schedule.hpp"
#include "strata/runtime/train/rank.hpp"

namespace strata::capi {

namespace {

const char* dtype_name(strata_dtype d) {
  switch (d) {
    case STRATA_F32: return "F32";
    case STRATA_F16: return "F16";
    case STRATA_BF16: return "BF16";
    case STRATA_DTYPE_FORCE_INT32_MIN:
    case STRATA_DTYPE_FORCE_INT32: break;
  }
  return "an unknown dtype";
}

bool known_dtype(strata_dtype d) { return d == STRATA_F32 || d == STRATA_F16 || d == STRATA_BF16; }

// The engine's type for a strata_dtype (known_dtype), and back.
DType to_dtype(strata_dtype d) { return d == STRATA_BF16 ? DType::BF16 : d == STRATA_F16 ? DType::F16 : DType::F32; }
strata_dtype to_strata(DType t) { return t == DType::BF16 ? STRATA_BF16 : t == DType::F16 ? STRATA_F16 : STRATA_F32; }

// Where a runtime's precision came from, for messages that tell the caller how to change it.
const char* precision_source(strata_dtype d) {
  switch (d) {
    case STRATA_BF16: return "the configuration's bf16.enabled";
    case STRATA_F16: return "the configuration's fp16.enabled";
    default: return "the configuration enables neither bf16 nor fp16";
  }
}

// A group's name is kept as JSON text in checkpoints and shown in messages: it must be
// UTF-8 with no control characters (a C string has no NUL inside by construction; the
// bindings refuse names that do, rather than pass them cut short).
void check_group_name(const std::string& name) {
  const char* why = "";
  const uint64_t bad = first_non_text(reinterpret_cast<const unsigned char*>(name.data()), name.size(), &why);
  if (bad != name.size())
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "the group's name '" + name.substr(0, bad) + "...' is not UTF-8 text: its byte " +
                                                    std::to_string(bad + 1) + " " + why +
                                                    "; checkpoints keep names as text: give a UTF-8 name");
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c != 0x7f) continue;
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", c);
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "the group's name '" + name.substr(0, i) + "...' has a control character (" +
                                                    code + ") at byte " + std::to_string(i + 1) +
                                                    "; names appear in messages and checkpoints: give printable text");
  }
}

// A 52-bit hash of a name: exact as a double, so ranks can compare names by all_reduce.
double name_hash(const std::string& s) {
  return static_cast<double>(std::hash<std::string>{}(s) & ((1ull << 52) - 1));
}

}  // namespace

Runtime::Runtime(Config config)
    : config_(std::move(config)), precision_(config_.precision()), dtype_(to_strata(precision_)) {
  if (config_.strata.backend == Backend::Sim)
    throw ApiError(STRATA_ERR_CONFIG,
                   "strata.backend is 'sim', whose tensors have sizes but no bytes, so there is nothing to hand "
                   "out; use \"cpu\" or \"cuda\" with the C API");
  RankContext rank = open_rank(config_);  // MPI or self, the device, its communicator (rank.hpp)
  if (rank.shard)
    throw ApiError(STRATA_ERR_CONFIG,
                   "zero_optimization.mics_shard_size shards within groups of ranks in strata train only so far; "
                   "the C API shards over every rank: remove mics_shard_size (or set it to -1)");
  host_comm_ = std::move(rank.host_comm);
  device_ = std::move(rank.device);
  device_comm_ = std::move(rank.dev_comm);
  hpz_comm_ = std::move(rank.hpz);
  device_ordinal_ = rank.device_ordinal;
  copy_stream_ = device_->create_stream("capi.copy");
}

Runtime::~Runtime() { shutdown(); }

void Runtime::shutdown() {
  // The engine uses the device and communicators: it goes first.
  engine_.reset();
  copy_stream_.reset();
  hpz_comm_.reset();
  device_comm_.reset();
  device_.reset();
  host_comm_.reset();
}

strata_runtime_info Runtime::info() const {
  strata_runtime_info i{};
  i.struct_size = sizeof(strata_runtime_info);
  i.rank = host_comm_->rank();
  i.world_size = host_comm_->size();
  i.device_type = device_->backend() == Backend::Cuda ? STRATA_DEVICE_CUDA : STRATA_DEVICE_CPU;
  i.device_id = device_->backend() == Backend::Cuda ? device_ordinal_ : 0;
  i.num_groups = static_cast<int32_t>(groups_.size());
  i.started = engine_ ? 1 : 0;
  i.gradient_accumulation_steps = config_.gradient_accumulation_steps;
  i.zero_stage = config_.zero.stage;
  i.dtype = dtype_;
  return i;
}

Runtime::Group& Runtime::group(int32_t g, const char* call) {
  if (g < 0 || static_cast<size_t>(g) >= groups_.size())
    throw ApiError(STRATA_ERR_UNKNOWN_GROUP, std::string(call) + ": there is no parameter group " + std::to_string(g) +
                                                 " (this runtime has " + std::to_string(groups_.size()) +
                                                 "; ids are those strata_register_group returned)");
  return groups_[static_cast<size_t>(g)];
}

// A 16-bit runtime's working copy is its initial values rounded: one beyond the range
// would be inf. Refused here, where every rank refuses alike (the engine clamps under
// strata.out_of_range = "clamp").
void Runtime::check_initial_range(const strata_group_desc& d, Group& gr) const {
  const std::string& name = gr.name;
  if (d.init == STRATA_INIT_CONSTANT) {
    try {
      check_range(&gr.spec.constants.back().value, 1, precision_, config_.strata.out_of_range,
                  "group '" + name + "': init_value",
                  "give a value the runtime's dtype holds, or set strata.out_of_range to \"clamp\" in the "
                  "configuration to clamp it");
    } catch (const ConfigError& e) {
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT, e.what());
    }
  }
  if (d.init == STRATA_INIT_NORMAL && config_.strata.out_of_range == OutOfRange::Refuse &&
      d.init_std * kLargestNormalDraw > largest_finite(precision_)) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "init_std %g gives initial values up to %g in magnitude (%g standard deviations), beyond %s's "
                  "largest finite value %g",
                  d.init_std, d.init_std * kLargestNormalDraw, kLargestNormalDraw, precision_name(precision_),
                  largest_finite(precision_));
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': " + text +
                                                    ": give a smaller init_std, or set strata.out_of_range to "
                                                    "\"clamp\" in the configuration to clamp them");
  }
}

int32_t Runtime::register_group(const strata_group_desc& given) {
  // A caller built against API 1.0 or 1.1 passes the desc without `kind` (1.2): only
  // struct_size bytes are read, the rest stays zero (STRATA_GROUP_TRAINED).
  constexpr size_t kDescBefore12 = offsetof(strata_group_desc, kind);
  if (given.struct_size < kDescBefore12)
    throw ApiError(STRATA_ERR_VERSION, "strata_group_desc.struct_size is " + std::to_string(given.struct_size) +
                                           ", expected " + std::to_string(sizeof(strata_group_desc)) +
                                           "; set it to sizeof(strata_group_desc)");
  strata_group_desc d{};
  std::memcpy(&d, &given, std::min<size_t>(given.struct_size, sizeof d));
  const std::string name = d.name ? d.name : "";
  if (engine_)
    throw ApiError(STRATA_ERR_STATE, "cannot register group '" + name +
                                         "': the engine has started (strata_start or the first call that needs "
                                         "it); register every group before that");
  if (name.empty()) throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "the group's name is null or empty; give each group a name");
  check_group_name(name);
  for (const Group& gr : groups_)
    if (gr.name == name)
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "a group named '" + name + "' is registered already; names must be unique");
  if (d.ndim < 1 || d.ndim > STRATA_MAX_DIMS || d.shape == nullptr)
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': ndim is " + std::to_string(d.ndim) +
                                                    (d.shape ? "" : " and shape is null") + "; give 1 to " +
                                                    std::to_string(STRATA_MAX_DIMS) + " dimensions in shape");
  uint64_t numel = 1;
  for (int32_t i = 0; i < d.ndim; ++i) {
    if (d.shape[i] < 1)
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': dimension " + std::to_string(i) + " is " +
                                                      std::to_string(d.shape[i]) + "; every dimension must be at least 1");
    if (numel > (1ull << 40) / static_cast<uint64_t>(d.shape[i]))
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "' has more than 2^40 elements; split it");
    numel *= static_cast<uint64_t>(d.shape[i]);
  }
  if (!known_dtype(d.dtype))
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': dtype " + std::to_string(static_cast<int>(d.dtype)) +
                                                    " is not a strata_dtype");
  if (d.dtype != dtype_)
    throw ApiError(STRATA_ERR_DTYPE, "group '" + name + "': dtype " + dtype_name(d.dtype) + " does not match the runtime's " +
                                         dtype_name(dtype_) + " (" + precision_source(dtype_) +
                                         "); every group has the runtime's dtype: register it as STRATA_" +
                                         dtype_name(dtype_) + " (initial data in " + dtype_name(dtype_) +
                                         " too), or change the configuration's bf16/fp16 section");
  if (d.kind != STRATA_GROUP_TRAINED && d.kind != STRATA_GROUP_FROZEN)
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': kind " + std::to_string(static_cast<int>(d.kind)) +
                                                    " is not a strata_group_kind (STRATA_GROUP_TRAINED or "
                                                    "STRATA_GROUP_FROZEN)");
  Group gr;
  gr.name = name;
  gr.shape.assign(d.shape, d.shape + d.ndim);
  gr.numel = numel;
  gr.spec.name = name;
  gr.spec.numel = numel;
  gr.spec.frozen = d.kind == STRATA_GROUP_FROZEN;
  switch (d.init) {
    case STRATA_INIT_NORMAL:
      if (!(d.init_std >= 0.0f) || !std::isfinite(d.init_std))
        throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': init_std must be finite and >= 0");
      gr.spec.init = InitKind::Normal;
      gr.spec.init_std = d.init_std;
      break;
    case STRATA_INIT_ZEROS: gr.spec.init = InitKind::Zeros; break;
    case STRATA_INIT_ONES: gr.spec.init = InitKind::Ones; break;
    case STRATA_INIT_CONSTANT:
      if (!std::isfinite(d.init_value))
        throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': init_value must be finite");
      gr.spec.init = InitKind::Zeros;
      gr.spec.constants.push_back({0, numel, d.init_value});
      break;
    case STRATA_INIT_DATA:
      if (d.data == nullptr)
        throw ApiError(STRATA_ERR_INVALID_ARGUMENT,
                       "group '" + name + "': init is STRATA_INIT_DATA but data is null; pass the initial values");
      // The master weights are fp32: 16-bit data widens exactly, so the working copy
      // rounded from them at start() is the data again.
      gr.data.resize(numel);
      convert_to_f32(gr.data.data(), d.data, precision_, numel);
      try {
        check_finite(gr.data.data(), numel, "group '" + name + "': data",
                     "a model with a NaN or inf weight computes NaN: pass finite initial values");
      } catch (const ConfigError& e) {
        throw ApiError(STRATA_ERR_INVALID_ARGUMENT, e.what());
      }
      gr.has_data = true;
      gr.spec.init = InitKind::Zeros;  // replaced by the data at start()
      break;
    case STRATA_INIT_FORCE_INT32:
    default:
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': init " + std::to_string(static_cast<int>(d.init)) +
                                                      " is not a strata_init_kind");
  }
  check_initial_range(d, gr);
  if (d.init != STRATA_INIT_DATA && d.data != nullptr)
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT,
                   "group '" + name + "': data is given but init is not STRATA_INIT_DATA; set init to STRATA_INIT_DATA "
                   "to use it, or pass null");
  groups_.push_back(std::move(gr));
  return static_cast<int32_t>(groups_.size() - 1);
}

int32_t Runtime::find_group(const std::string& name) const {
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].name == name) return static_cast<int32_t>(g);
  throw ApiError(STRATA_ERR_UNKNOWN_GROUP, "there is no parameter group named '" + name + "'");
}

void Runtime::group_shape(int32_t g, int32_t* ndim, int64_t* shape, uint64_t* numel) const {
  Group& gr = const_cast<Runtime*>(this)->group(g, "strata_group_shape");
  if (ndim) *ndim = static_cast<int32_t>(gr.shape.size());
  if (shape) std::copy(gr.shape.begin(), gr.shape.end(), shape);
  if (numel) *numel = gr.numel;
}

// Every rank must register the same groups (names, sizes, initialisers) in the same
// order, or the engine's collectives would pair up different buffers and hang or mix
// data. Two all_reduces (max of x and of -x) tell every rank whether all agree.
void Runtime::check_same_groups_on_every_rank() {
  if (host_comm_->size() == 1) return;
  auto agree = [&](std::vector<double> local) {
    std::vector<double> hi = local, lo(local.size());
    for (size_t i = 0; i < local.size(); ++i) lo[i] = -local[i];
    host_comm_->all_reduce(coll::MutView(hi), coll::ReduceOp::Max).wait();
    host_comm_->all_reduce(coll::MutView(lo), coll::ReduceOp::Max).wait();
    for (size_t i = 0; i < local.size(); ++i)
      if (hi[i] != -lo[i]) return static_cast<long>(i);
    return -1l;
  };
  if (agree({static_cast<double>(dtype_)}) >= 0)
    throw ApiError(STRATA_ERR_COLLECTIVE, std::string("the ranks' configurations train in different precisions (this "
                                                      "rank ") + dtype_name(dtype_) + ", from " +
                                              precision_source(dtype_) +
                                              "); give every rank the same bf16 and fp16 sections");
  if (agree({static_cast<double>(groups_.size())}) >= 0)
    throw ApiError(STRATA_ERR_COLLECTIVE, "the ranks registered different numbers of parameter groups (this rank " +
                                              std::to_string(groups_.size()) +
                                              "); register the same groups in the same order on every rank");
  std::vector<double> desc;
  for (const Group& gr : groups_) {
    desc.push_back(static_cast<double>(gr.numel));
    desc.push_back(name_hash(gr.name));
    desc.push_back(gr.has_data ? 1.0 : 0.0);
    desc.push_back(gr.spec.frozen ? 1.0 : 0.0);
  }
  if (long i = agree(desc); i >= 0) {
    const Group& gr = groups_[static_cast<size_t>(i / 4)];
    const char* what[4] = {"size", "name", "kind of initialiser (data on some ranks only)",
                           "kind (STRATA_GROUP_FROZEN on some ranks only)"};
    throw ApiError(STRATA_ERR_COLLECTIVE, "parameter group " + std::to_string(i / 4) + " ('" + gr.name + "', " +
                                              std::to_string(gr.numel) + " elements on this rank) differs between "
                                              "ranks in its " + what[i % 4] +
                                              "; register the same groups in the same order on every rank");
  }
}

void Runtime::load_initial_data() {
  const uint64_t rank = static_cast<uint64_t>(host_comm_->rank());
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& gr = groups_[g];
    if (!gr.has_data) continue;
    const uint64_t shard = engine_->shard_numel(static_cast<int>(g));
    std::vector<float> master(shard, 0.0f), zeros(shard, 0.0f);
    const uint64_t begin = rank * shard;
    if (begin < gr.numel) std::copy(gr.data.begin() + begin, gr.data.begin() + std::min(gr.numel, begin + shard), master.begin());
    engine_->write_optimizer_shard(static_cast<int>(g), master.data(), zeros.data(), zeros.data(), 0);
    std::vector<float>().swap(gr.data);
  }
}

void Runtime::start() {
  if (engine_) return;
  if (groups_.empty())
    throw ApiError(STRATA_ERR_STATE, "no parameter groups are registered; call strata_register_group first");
  check_same_groups_on_every_rank();
  std::vector<GroupSpec> specs;
  for (const Group& gr : groups_) specs.push_back(gr.spec);
  coll::Communicator& dev_comm = device_comm_ ? *device_comm_ : *host_comm_;
  EngineOptions eo = EngineOptions::from_config(config_);
  eo.first_gradient_held = false;  // the caller's groups, not strata.model's: no gradient is held for it
  auto engine = std::make_unique<ZeroEngine>(*device_, dev_comm, *host_comm_, eo, std::move(specs), EngineAblation{},
                                             nullptr, hpz_comm_.get());
  engine_ = std::move(engine);
  try {
    load_initial_data();
  } catch (...) {
    engine_.reset();
    throw;
  }
  start_time_ = device_->now();
}

void Runtime::set_schedule(const int32_t* order, size_t n) {
  if (n > 0 && order == nullptr) throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "order is null but n is " + std::to_string(n));
  if (n == 0) throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "the schedule is empty; give the order of one micro-step's acquires");
  for (size_t i = 0; i < n; ++i) group(order[i], "strata_set_schedule");
  start();
  engine_->set_schedule(std::vector<int>(order, order + n));
}

void Runtime::check_micro_step_complete(const char* call) const {
  for (const Group& gr : groups_) {
    if (gr.spec.frozen) continue;  // no gradient to hand in
    if (gr.grad_out)
      throw ApiError(STRATA_ERR_STATE, std::string(call) + ": group '" + gr.name +
                                           "' has a gradient buffer out; call strata_grad_ready for it first");
    if (!gr.grad_in)
      throw ApiError(STRATA_ERR_STATE, std::string(call) + ": group '" + gr.name + "' has no gradient for micro-batch " +
                                           std::to_string(micro_open_ - 1) +
                                           "; hand in a gradient for every group in every micro-batch (zeros for "
                                           "parameters that were not used)");
  }
}

void Runtime::check_between_steps(const char* call) const {
  if (in_micro_ || micro_open_ > 0)
    throw ApiError(STRATA_ERR_STATE, std::string(call) + ": a step is in progress (" + std::to_string(micro_open_) +
                                         " micro-batch(es) begun); call it before strata_begin_micro_step or after "
                                         "strata_step");
}

void Runtime::begin_micro_step() {
  start();
  if (in_micro_) check_micro_step_complete("strata_begin_micro_step");
  if (micro_open_ >= config_.gradient_accumulation_steps)
    throw ApiError(STRATA_ERR_STATE, "strata_begin_micro_step: " + std::to_string(micro_open_) +
                                         " micro-batches (gradient_accumulation_steps) ran already; call strata_step");
  // The `scheduler` section's lr for this step (optimizer.params.lr without one), set
  // before the backward pass: the speculative optimizer steps during it.
  if (micro_open_ == 0) engine_->set_learning_rate(learning_rate());
  engine_->begin_micro_step();
  ++micro_open_;
  in_micro_ = true;
  for (Group& gr : groups_) gr.grad_in = false;
}

strata_buffer Runtime::buffer(const Group& gr, void* data) const {
  strata_buffer b{};
  b.data = data;
  b.numel = gr.numel;
  b.dtype = dtype_;  // the engine's buffers are its working type: no copy, no conversion
  b.device_type = device_->backend() == Backend::Cuda ? STRATA_DEVICE_CUDA : STRATA_DEVICE_CPU;
  b.device_id = device_->backend() == Backend::Cuda ? device_ordinal_ : 0;
  b.ndim = static_cast<int32_t>(gr.shape.size());
  std::copy(gr.shape.begin(), gr.shape.end(), b.shape);
  b.ready_event = nullptr;  // acquire_params and gradient_buffer return with the data ready
  return b;
}

strata_buffer Runtime::acquire(int32_t g) {
  Group& gr = group(g, "strata_acquire");
  if (!in_micro_)
    throw ApiError(STRATA_ERR_STATE, "strata_acquire of group '" + gr.name +
                                         "' outside a micro-batch; call strata_begin_micro_step first (to read "
                                         "parameters outside training use strata_read_params)");
  const void* p = engine_->acquire_params(g);
  if (gr.holders++ == 0) {
    gr.held = p;
    if (config_.strata.checksums) gr.held_hash = held_params_hash(gr);
  }
  return buffer(gr, const_cast<void*>(p));
}

uint64_t Runtime::held_params_hash(const Group& gr) const {
  const size_t bytes = gr.numel * dtype_size(precision_);
  if (device_->host_addressable()) return XXH3_64bits(gr.held, bytes);
  std::vector<std::byte> host(bytes);
  copy_stream_->copy_async(host.data(), gr.held, bytes);
  copy_stream_->record().wait();
  return XXH3_64bits(host.data(), bytes);
}

void Runtime::release(int32_t g) {
  Group& gr = group(g, "strata_release");
  if (!engine_ || gr.holders <= 0)
    throw ApiError(STRATA_ERR_STATE, "strata_release: group '" + gr.name +
                                         "' is not acquired (released twice, or never acquired); each "
                                         "strata_acquire takes exactly one strata_release");
  // Acquired parameters are the engine's own buffer, handed out without a copy, so a write
  // into it cannot be refused where it happens. What that write does differs by group
  // (gone at its release, or seen by later acquires until a step), so with the checks on
  // it is found here, for every kind of group alike, and named.
  bool written = false;
  if (config_.strata.checksums) {
    const uint64_t now = held_params_hash(gr);
    written = now != gr.held_hash;
    gr.held_hash = now;  // a hold still open reports only later writes
  }
  engine_->release_params(g);
  if (--gr.holders == 0) gr.held = nullptr;
  if (written)
    throw ApiError(STRATA_ERR_STATE,
                   "strata_release: the parameters of group '" + gr.name +
                       "' were written while acquired (their checksum changed between strata_acquire and this "
                       "release; strata.checksums is on). Acquired parameters are read-only: a write is never "
                       "taken into the optimizer's master weights, but later acquires and strata_read_params may "
                       "see it until a step updates them, so this micro-batch computed with values the "
                       "optimizer does not have. Copy the buffer before changing it. The group is released.");
}

void Runtime::check_trained(const Group& gr, const char* call) const {
  if (gr.spec.frozen)
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT,
                   std::string(call) + ": group '" + gr.name +
                       "' is frozen (registered with STRATA_GROUP_FROZEN) and takes no gradient; hand in gradients "
                       "only for trained groups, or register it as STRATA_GROUP_TRAINED to train it");
}

strata_buffer Runtime::grad_buffer(int32_t g) {
  Group& gr = group(g, "strata_grad_buffer");
  check_trained(gr, "strata_grad_buffer");
  if (!in_micro_)
    throw ApiError(STRATA_ERR_STATE, "gradient for group '" + gr.name +
                                         "' outside a micro-batch; call strata_begin_micro_step first");
  if (gr.grad_out)
    throw ApiError(STRATA_ERR_STATE, "group '" + gr.name +
                                         "' already has a gradient buffer out; call strata_grad_ready for it first");
  if (gr.grad_in)
    throw ApiError(STRATA_ERR_STATE, "group '" + gr.name +
                                         "' already had its gradient for this micro-batch; sum the contributions "
                                         "and hand in one gradient per group per micro-batch");
  void* p = engine_->gradient_buffer(g);
  gr.grad_out = true;
  return buffer(gr, p);
}

void Runtime::grad_ready(int32_t g) {
  Group& gr = group(g, "strata_grad_ready");
  check_trained(gr, "strata_grad_ready");
  if (!gr.grad_out)
    throw ApiError(STRATA_ERR_STATE, "strata_grad_ready: group '" + gr.name +
                                         "' has no gradient buffer out; call strata_grad_buffer first (or use "
                                         "strata_grad_submit)");
  gr.grad_out = false;
  gr.grad_in = true;
  engine_->grads_ready(g);
}

void Runtime::check_buffer(const Group& gr, strata_dtype dtype, uint64_t numel, bool widen_ok,
                           const char* call) const {
  if (!known_dtype(dtype))
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, std::string(call) + ": dtype " + std::to_string(static_cast<int>(dtype)) +
                                                    " is not a strata_dtype");
  if (dtype != dtype_ && !(widen_ok && dtype == STRATA_F32)) {
    const std::string own = dtype_name(dtype_);
    std::string fix;
    if (widen_ok) {
      fix = "pass " + own + (dtype_ == STRATA_F32 ? "" : " or F32 (widened)");
    } else {
      // Gradients are never converted here: rounding them is the caller's to see (and,
      // in fp16, to do on the scaled loss's gradients, or small ones flush to zero).
      fix = "hand in " + own + " values: convert them before the call (Strata does not convert gradients)";
      if (dtype_ == STRATA_F16) fix += ", computed from the loss times strata_loss_scale()";
    }
    throw ApiError(STRATA_ERR_DTYPE, std::string(call) + ": group '" + gr.name + "' is " + own + " (" +
                                         precision_source(dtype_) + ") but the buffer is " + dtype_name(dtype) + "; " +
                                         fix);
  }
  if (numel != gr.numel)
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT, std::string(call) + ": group '" + gr.name + "' has " +
                                                    std::to_string(gr.numel) + " elements, the buffer " +
                                                    std::to_string(numel));
}

void Runtime::grad_submit(int32_t g, const void* data, strata_dtype dtype, uint64_t numel) {
  Group& gr = group(g, "strata_grad_submit");
  check_trained(gr, "strata_grad_submit");
  check_buffer(gr, dtype, numel, false, "strata_grad_submit");
  if (data == nullptr) throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "strata_grad_submit: data is null");
  strata_buffer b = grad_buffer(g);
  copy_stream_->copy_async(b.data, data, numel * dtype_size(precision_));
  copy_stream_->record().wait();
  grad_ready(g);
}

bool Runtime::step() {
  if (!engine_ || !in_micro_)
    throw ApiError(STRATA_ERR_STATE, "strata_step without a micro-batch; call strata_begin_micro_step, acquire, hand "
                                     "in gradients, then step");
  for (const Group& gr : groups_)
    if (gr.holders > 0)
      throw ApiError(STRATA_ERR_STATE, "strata_step while group '" + gr.name + "' is acquired (" +
                                           std::to_string(gr.holders) + " time(s)); release it first");
  check_micro_step_complete("strata_step");
  if (micro_open_ != config_.gradient_accumulation_steps)
    throw ApiError(STRATA_ERR_STATE, "strata_step after " + std::to_string(micro_open_) +
                                         " micro-batch(es); gradient_accumulation_steps is " +
                                         std::to_string(config_.gradient_accumulation_steps) +
                                         ": begin the remaining ones first");
  const auto end_step = [&] {
    micro_open_ = 0;
    in_micro_ = false;
    for (Group& gr : groups_) gr.grad_in = false;
  };
  bool stepped = false;
  try {
    stepped = engine_->step();
  } catch (...) {
    // The engine ends the step before its last failures (the fp16 scaler at its minimum
    // scale, before any state changed; the optimizer's I/O, which may leave states partly
    // updated): follow it, so that the caller can load a checkpoint instead of finding
    // every call refused.
    if (engine_->micro_step() < 0) end_step();
    throw;
  }
  end_step();
  return stepped;
}

void Runtime::read_params(int32_t g, void* dst, strata_dtype dtype, uint64_t numel) {
  Group& gr = group(g, "strata_read_params");
  check_buffer(gr, dtype, numel, true, "strata_read_params");
  if (dst == nullptr) throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "strata_read_params: dst is null");
  start();
  // Widened working values: narrowing them back to the working type is exact.
  std::vector<float> full = engine_->gather_full_params(g);
  convert_from_f32(dst, to_dtype(dtype), full.data(), numel);
}

double Runtime::learning_rate() const {
  if (lr_set_) return *lr_set_;
  return LrSchedule{config_.scheduler}.lr_at(engine_ ? engine_->optimizer_steps() : 0);
}

void Runtime::set_learning_rate(double lr) {
  if (config_.scheduler.type != LrScheduleType::Constant)
    throw ApiError(STRATA_ERR_STATE, std::string("strata_set_learning_rate: the configuration's scheduler section (") +
                                         to_string(config_.scheduler.type) +
                                         ") sets the learning rate; remove that section to set it from the caller "
                                         "(torch's schedulers, transformers' Trainer), or leave the lr to it");
  if (!std::isfinite(lr) || lr < 0)
    throw ApiError(STRATA_ERR_INVALID_ARGUMENT,
                   "strata_set_learning_rate: lr " + std::to_string(lr) + " is not a finite number >= 0");
  check_between_steps("strata_set_learning_rate");
  lr_set_ = lr;
}

double Runtime::loss_scale() const {
  if (engine_) return engine_->loss_scale();
  // Before the engine exists: the scale it will start with (in fp16 the configuration's
  // fp16 section is enabled, and the engine's scaler is made from it).
  return precision_ == DType::F16 ? LossScaler(config_.fp16).scale() : 1.0;
}

std::string Runtime::next_checkpoint_dir(const std::string& root) const {
  return checkpoint_dir_for(root, engine_ ? engine_->iterations() : 0);
}

void Runtime::check_room(const std::string& text, const char* out, size_t cap, const std::string& what,
                         const std::string& undone) {
  const uint64_t needed = text.size() + 1;
  const bool short_here = out != nullptr && cap < needed;
  bool short_somewhere = short_here;
  if (host_comm_->size() > 1) {
    std::vector<double> flag{short_here ? 1.0 : 0.0};
    host_comm_->all_reduce(coll::MutView(flag), coll::ReduceOp::Max).wait();
    short_somewhere = flag[0] > 0;
  }
  if (short_here)
    throw ApiError(STRATA_ERR_BUFFER_TOO_SMALL, what + " needs " + std::to_string(needed) +
                                                    " bytes (its NUL included), the buffer has " + std::to_string(cap) +
                                                    "; " + undone + ": pass a buffer of at least " +
                                                    std::to_string(needed) + " bytes");
  if (short_somewhere)
    throw ApiError(STRATA_ERR_BUFFER_TOO_SMALL, "another rank's buffer for " + what + " is too small (this rank's holds " +
                                                    std::to_string(needed) + " bytes); " + undone +
                                                    ": pass a large enough buffer on every rank");
}

std::string Runtime::save_checkpoint(const std::string& root, const std::string& extra_json) {
  check_between_steps("strata_save_checkpoint");
  nlohmann::json extra = nlohmann::json::object();
  if (!extra_json.empty()) {
    if (json_nesting_depth(extra_json, kMaxJsonDepth) > kMaxJsonDepth)
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT, "strata_save_checkpoint: extra_json nests more than " +
                                                      std::to_string(kMaxJsonDepth) + " deep");
    try {
      extra = nlohmann::json::parse(extra_json);
    } catch (const nlohmann::json::exception& e) {
      throw ApiError(STRATA_ERR_INVALID_ARGUMENT,
                     std::string("strata_save_checkpoint: extra_json is not valid JSON: ") + e.what());
    }
  }
  start();
  std::vector<std::string> names;
  for (const Group& gr : groups_) names.push_back(gr.name);
  return strata::save_checkpoint(*engine_, *host_comm_, root, config_.raw, extra, names);
}

CheckpointInfo Runtime::checkpoint_to_load(const std::string& dir) const {
  check_between_steps("strata_load_checkpoint");
  std::string target = dir;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "manifest.json")) {
    std::optional<std::string> latest = strata::latest_checkpoint(dir);
    if (!latest)
      throw ApiError(STRATA_ERR_NOT_FOUND, "strata_load_checkpoint: '" + dir +
                                               "' is neither a checkpoint (no manifest.json) nor a directory holding "
                                               "one (step-<N>/); give the directory strata_save_checkpoint returned "
                                               "or its root");
    target = *latest;
  }
  return read_checkpoint_info(target);
}

void Runtime::load_checkpoint(const CheckpointInfo& target) {
  check_between_steps("strata_load_checkpoint");
  start();
  strata::load_checkpoint(*engine_, *host_comm_, target.dir);
}

strata_stats Runtime::stats() const {
  strata_stats s{};
  s.struct_size = sizeof(strata_stats);
  if (!engine_) return s;  // nothing has run
  const EngineStats e = engine_->stats();
  s.elapsed_s = device_->now() - start_time_;
  for (int t = 0; t < STRATA_TIER_COUNT; ++t) {
    s.tiers[t].budget = e.store.tiers[t].budget;
    s.tiers[t].used = e.store.tiers[t].used;
    s.tiers[t].peak = e.store.tiers[t].peak;
    for (int u = 0; u < STRATA_TIER_COUNT; ++u) {
      s.bytes_moved[t][u] = e.store.bytes_moved[t][u];
      s.bandwidth[t][u] = s.elapsed_s > 0 ? static_cast<double>(e.store.bytes_moved[t][u]) / s.elapsed_s : 0.0;
    }
  }
  s.exposed_wait_s = e.exposed_wait_s;
  s.optimizer_s = e.optimizer_s;
  s.optimizer_wait_s = e.optimizer_wait_s;
  s.moves = e.store.moves;
  s.evictions = e.store.evictions;
  s.gathers = e.gathers;
  s.prefetched = e.prefetched;
  s.trace_departures = e.trace_departures;
  s.optimizer_steps = engine_->optimizer_steps();
  s.last_grad_norm = e.last_grad_norm;
  s.skipped_steps = e.skipped_steps;
  s.loss_scale = e.loss_scale;
  return s;
}

}  // namespace strata::capi
