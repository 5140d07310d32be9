// The object behind a strata_runtime handle (include/strata/strata.h): one ZeroEngine
// with its device and communicators, plus the bookkeeping that turns misuse of the C API
// into a status and a message before it reaches the engine (whose own checks on misuse
// are exceptions or, for broken invariants, aborts).
//
// Private to runtime/src (c_api.cpp): nothing outside the C API's implementation sees it.
// Thread-safety: not thread-safe by itself. c_api.cpp holds `mu` around every call.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/collectives/communicator.hpp"
#include "strata/core/device.hpp"
#include "strata/core/error.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/engine/zero_engine.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/strata.h"

namespace strata::capi {

// An error found by the C API's own checks, with the status it maps to.
class ApiError : public Error {
 public:
  ApiError(strata_status status, const std::string& message) : Error(message), status_(status) {}
  strata_status status() const { return status_; }

 private:
  strata_status status_;
};

class Runtime {
 public:
  // Parses and validates the configuration, makes the device and the communicators.
  explicit Runtime(Config config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  // Frees the engine, device and communicators (strata_runtime_destroy, under mu).
  void shutdown();
  Runtime& operator=(const Runtime&) = delete;

  std::mutex mu;        // held by c_api.cpp around every call on this runtime
  bool closed = false;  // set by strata_runtime_destroy under mu

  strata_runtime_info info() const;
  int32_t register_group(const strata_group_desc& d);
  int32_t find_group(const std::string& name) const;
  void group_shape(int32_t g, int32_t* ndim, int64_t* shape, uint64_t* numel) const;

  void start();  // no-op once started
  void set_schedule(const int32_t* order, size_t n);
  void begin_micro_step();
  strata_buffer acquire(int32_t g);
  void release(int32_t g);
  strata_buffer grad_buffer(int32_t g);
  void grad_ready(int32_t g);
  void grad_submit(int32_t g, const void* data, strata_dtype dtype, uint64_t numel);
  bool step();
  void read_params(int32_t g, void* dst, strata_dtype dtype, uint64_t numel);
  double loss_scale() const;
  double learning_rate() const;  // of the next (or the open) step
  void set_learning_rate(double lr);
  // Where save_checkpoint(root, ...) saves if called now: known before anything is written.
  std::string next_checkpoint_dir(const std::string& root) const;
  std::string save_checkpoint(const std::string& root, const std::string& extra_json);
  // The checkpoint strata_load_checkpoint(dir) loads (dir, or the latest under it), its
  // manifest read and checked: the extra JSON is known before anything is loaded.
  CheckpointInfo checkpoint_to_load(const std::string& dir) const;
  void load_checkpoint(const CheckpointInfo& target);
  // Collective: STRATA_ERR_BUFFER_TOO_SMALL on every rank when any rank's out[cap] cannot
  // hold `text` and its NUL (out null asks for nothing), so that a call can refuse before
  // it acts and its ranks stay together. `undone` says what did not happen.
  void check_room(const std::string& text, const char* out, size_t cap, const std::string& what,
                  const std::string& undone);
  strata_stats stats() const;

 private:
  struct Group {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t numel = 0;
    GroupSpec spec;
    std::vector<float> data;  // STRATA_INIT_DATA: the initial values (widened) until start()
    bool has_data = false;
    int holders = 0;          // outstanding acquires
    const void* held = nullptr;  // the parameters handed out while holders > 0
    uint64_t held_hash = 0;      // strata.checksums: their xxh3 at the first of those acquires
    bool grad_out = false;    // a gradient buffer is handed out, not yet ready
    bool grad_in = false;     // a gradient was handed in for the open micro-batch
  };

  Group& group(int32_t g, const char* call);
  // A caller's buffer of numel elements of dtype for group gr: the runtime's dtype, or F32
  // too where widen_ok (read_params widens the working values).
  void check_buffer(const Group& gr, strata_dtype dtype, uint64_t numel, bool widen_ok, const char* call) const;
  void check_same_groups_on_every_rank();
  // gr's initial values fit the runtime's dtype (16 bits), or are clamped to it.
  void check_initial_range(const strata_group_desc& d, Group& gr) const;
  void load_initial_data();
  void check_micro_step_complete(const char* call) const;
  // STRATA_ERR_INVALID_ARGUMENT naming the call when gr is frozen (it takes no gradient).
  void check_trained(const Group& gr, const char* call) const;
  void check_between_steps(const char* call) const;
  strata_buffer buffer(const Group& gr, void* data) const;
  // xxh3 of the parameters gr.held (strata.checksums: a write into them is found at release).
  uint64_t held_params_hash(const Group& gr) const;

  Config config_;
  std::optional<double> lr_set_;  // strata_set_learning_rate's, which replaces the schedule
  DType precision_ = DType::F32;     // config_.precision(): every group's and buffer's type
  strata_dtype dtype_ = STRATA_F32;  // the same, as the C API names it
  std::unique_ptr<coll::Communicator> host_comm_;
  std::unique_ptr<coll::Communicator> device_comm_;  // nccl or staged; null: host_comm_ serves both (rank.hpp)
  std::unique_ptr<coll::Communicator> hpz_comm_;     // zero_hpz_partition_size's group (rank.hpp); null without
  int device_ordinal_ = 0;                           // cuda: the GPU this rank uses
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> copy_stream_;  // grad_submit's copies, on either backend
  std::vector<Group> groups_;
  std::unique_ptr<ZeroEngine> engine_;
  double start_time_ = 0;  // device clock when the engine started
  int micro_open_ = 0;     // micro-batches begun since the last step
  bool in_micro_ = false;  // a micro-batch is open
};

}  // namespace strata::capi
