// The C API's boundary (include/strata/strata.h): handles, locking, and the conversion of
// every exception into a status and a thread-local message. Nothing thrown inside Strata
// crosses into the caller's C code.
//
// Handles are ids into a table, never pointers: an id is issued once and never reused,
// so a destroyed or made-up handle is found missing instead of dereferenced. A call
// looks its runtime up (taking a shared reference), then holds the runtime's lock for
// the call. strata_runtime_destroy removes the id from the table, then takes the lock
// and frees the engine; calls that found the runtime before that see it closed.
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "c_api_runtime.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/core/output_guard.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/runtime/formats/checkpoint.hpp"
#include "strata/strata.h"

using strata::capi::ApiError;
using strata::capi::Runtime;

namespace {

thread_local std::string t_last_error;

struct HandleTable {
  std::mutex mu;
  std::unordered_map<uint64_t, std::shared_ptr<Runtime>> live;
  uint64_t next_id = 1;  // 0 is never issued
};

// Never destroyed: runtimes still alive at exit are freed by the OS, and a call made
// from another static destructor still finds a table.
HandleTable& table() {
  static HandleTable* t = new HandleTable;
  return *t;
}

strata_status fail(strata_status s, const char* call, const char* what) {
  const std::string w = what;
  // Messages start with the call's name, once.
  t_last_error = w.rfind(call, 0) == 0 ? w : std::string(call) + ": " + w;
  return s;
}

// Runs f, turning every exception into a status and the thread's last error.
template <class F>
strata_status guard(const char* call, F&& f) {
  t_last_error.clear();
  try {
    f();
    return STRATA_OK;
  } catch (const ApiError& e) {
    return fail(e.status(), call, e.what());
  } catch (const strata::ConfigError& e) {
    return fail(STRATA_ERR_CONFIG, call, e.what());
  } catch (const strata::OutOfBudget& e) {
    return fail(STRATA_ERR_OUT_OF_MEMORY, call, e.what());
  } catch (const strata::IoError& e) {
    return fail(STRATA_ERR_IO, call, e.what());
  } catch (const strata::CorruptionError& e) {
    return fail(STRATA_ERR_CORRUPT, call, e.what());
  } catch (const strata::Unavailable& e) {
    return fail(STRATA_ERR_UNAVAILABLE, call, e.what());
  } catch (const strata::coll::CollectiveUsageError& e) {
    return fail(STRATA_ERR_COLLECTIVE, call, e.what());
  } catch (const strata::coll::CollectiveError& e) {
    return fail(STRATA_ERR_COLLECTIVE, call, e.what());
  } catch (const strata::Error& e) {
    // The engine's own refusals of calls out of order (the C API checks most first).
    return fail(STRATA_ERR_STATE, call, e.what());
  } catch (const nlohmann::json::exception& e) {
    return fail(STRATA_ERR_INVALID_ARGUMENT, call, e.what());
  } catch (const std::bad_alloc&) {
    return fail(STRATA_ERR_OUT_OF_MEMORY, call, "host memory allocation failed (std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(STRATA_ERR_INTERNAL, call, (std::string("unexpected error, a bug in Strata: ") + e.what()).c_str());
  } catch (...) {
    return fail(STRATA_ERR_INTERNAL, call, "unexpected non-standard exception, a bug in Strata");
  }
}

std::shared_ptr<Runtime> lookup(strata_runtime rt) {
  HandleTable& t = table();
  std::lock_guard lk(t.mu);
  auto it = t.live.find(rt.id);
  if (it == t.live.end())
    throw ApiError(STRATA_ERR_INVALID_HANDLE,
                   rt.id == 0 ? "the runtime handle is 0 (never created, or creation failed)"
                              : "runtime " + std::to_string(rt.id) + " was destroyed (or never created by this process)");
  return it->second;
}

// Runs f(runtime) under the runtime's lock.
template <class F>
strata_status with_runtime(strata_runtime rt, const char* call, F&& f) {
  return guard(call, [&] {
    std::shared_ptr<Runtime> r = lookup(rt);
    std::lock_guard lk(r->mu);
    if (r->closed)
      throw ApiError(STRATA_ERR_INVALID_HANDLE, "runtime " + std::to_string(rt.id) + " was destroyed during this call");
    f(*r);
  });
}

void need(const void* p, const char* what) {
  if (p == nullptr) throw ApiError(STRATA_ERR_INVALID_ARGUMENT, std::string(what) + " is null");
}

void check_version(uint32_t v) {
  const uint32_t major = v >> 16, minor = v & 0xffff;
  if (major != STRATA_API_VERSION_MAJOR || minor > STRATA_API_VERSION_MINOR)
    throw ApiError(STRATA_ERR_VERSION, "the caller was built against API " + std::to_string(major) + "." +
                                           std::to_string(minor) + " but this libstrata implements " +
                                           std::to_string(STRATA_API_VERSION_MAJOR) + "." +
                                           std::to_string(STRATA_API_VERSION_MINOR) +
                                           "; rebuild against this library's strata.h (pass STRATA_API_VERSION)");
}

strata_runtime publish(std::unique_ptr<Runtime> r) {
  HandleTable& t = table();
  std::lock_guard lk(t.mu);
  const uint64_t id = t.next_id++;
  t.live.emplace(id, std::shared_ptr<Runtime>(std::move(r)));
  return strata_runtime{id};
}

// Copies s with its NUL into out[cap]; nothing is written when it does not fit.
void copy_out(const std::string& s, char* out, size_t cap, const char* what) {
  if (out == nullptr) return;
  if (s.size() + 1 > cap)
    throw ApiError(STRATA_ERR_BUFFER_TOO_SMALL, std::string(what) + " needs " + std::to_string(s.size() + 1) +
                                                    " bytes, the buffer has " + std::to_string(cap));
  std::memcpy(out, s.c_str(), s.size() + 1);
}

}  // namespace

extern "C" {

uint32_t strata_api_version(void) { return STRATA_API_VERSION; }

const char* strata_version_string(void) {
  static const std::string v = "strata 0.1.0 (api " + std::to_string(STRATA_API_VERSION_MAJOR) + "." +
                               std::to_string(STRATA_API_VERSION_MINOR) + ")";
  return v.c_str();
}

const char* strata_status_name(strata_status s) {
  switch (s) {
    case STRATA_OK: return "STRATA_OK";
    case STRATA_ERR_INVALID_ARGUMENT: return "STRATA_ERR_INVALID_ARGUMENT";
    case STRATA_ERR_INVALID_HANDLE: return "STRATA_ERR_INVALID_HANDLE";
    case STRATA_ERR_UNKNOWN_GROUP: return "STRATA_ERR_UNKNOWN_GROUP";
    case STRATA_ERR_DTYPE: return "STRATA_ERR_DTYPE";
    case STRATA_ERR_STATE: return "STRATA_ERR_STATE";
    case STRATA_ERR_CONFIG: return "STRATA_ERR_CONFIG";
    case STRATA_ERR_OUT_OF_MEMORY: return "STRATA_ERR_OUT_OF_MEMORY";
    case STRATA_ERR_IO: return "STRATA_ERR_IO";
    case STRATA_ERR_CORRUPT: return "STRATA_ERR_CORRUPT";
    case STRATA_ERR_UNAVAILABLE: return "STRATA_ERR_UNAVAILABLE";
    case STRATA_ERR_COLLECTIVE: return "STRATA_ERR_COLLECTIVE";
    case STRATA_ERR_VERSION: return "STRATA_ERR_VERSION";
    case STRATA_ERR_BUFFER_TOO_SMALL: return "STRATA_ERR_BUFFER_TOO_SMALL";
    case STRATA_ERR_NOT_FOUND: return "STRATA_ERR_NOT_FOUND";
    case STRATA_ERR_INTERNAL: return "STRATA_ERR_INTERNAL";
    case STRATA_STATUS_FORCE_INT32_MIN:
    case STRATA_STATUS_FORCE_INT32: break;
  }
  return "STRATA_ERR_(unknown status)";
}

const char* strata_last_error(void) { return t_last_error.c_str(); }

strata_status strata_runtime_create(uint32_t api_version, const char* config_json, strata_runtime* out) {
  return guard("strata_runtime_create", [&] {
    need(out, "out");
    *out = strata_runtime{0};
    check_version(api_version);
    need(config_json, "config_json");
    if (strata::json_nesting_depth(config_json, strata::kMaxJsonDepth) > strata::kMaxJsonDepth)
      throw ApiError(STRATA_ERR_CONFIG, "the configuration nests objects and arrays more than " +
                                            std::to_string(strata::kMaxJsonDepth) + " deep: check it");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(config_json);
    } catch (const nlohmann::json::exception& e) {
      throw ApiError(STRATA_ERR_CONFIG, std::string("the configuration is not valid JSON: ") + e.what());
    }
    strata::Config c = strata::parse_config(j);
    c.raw = j;
    *out = publish(std::make_unique<Runtime>(std::move(c)));
  });
}

strata_status strata_runtime_create_from_file(uint32_t api_version, const char* path, strata_runtime* out) {
  return guard("strata_runtime_create_from_file", [&] {
    need(out, "out");
    *out = strata_runtime{0};
    check_version(api_version);
    need(path, "path");
    strata::Config c = strata::load_config(path);
    // The trace is the runtime's one output: never the config file it came from.
    strata::check_outputs_replace_no_input({{path, "the config file"}}, {{c.strata.trace, "strata.trace"}});
    *out = publish(std::make_unique<Runtime>(std::move(c)));
  });
}

strata_status strata_runtime_destroy(strata_runtime rt) {
  return guard("strata_runtime_destroy", [&] {
    std::shared_ptr<Runtime> r;
    {
      HandleTable& t = table();
      std::lock_guard lk(t.mu);
      auto it = t.live.find(rt.id);
      if (it == t.live.end())
        throw ApiError(STRATA_ERR_INVALID_HANDLE, rt.id == 0 ? "the runtime handle is 0"
                                                             : "runtime " + std::to_string(rt.id) +
                                                                   " was destroyed already (or never created)");
      r = std::move(it->second);
      t.live.erase(it);
    }
    std::lock_guard lk(r->mu);
    r->closed = true;
    // Calls that looked the runtime up before it left the table still hold references;
    // the engine and its memory go now, the empty shell with the last reference.
    r->shutdown();
  });
}

strata_status strata_runtime_get_info(strata_runtime rt, strata_runtime_info* out) {
  return with_runtime(rt, "strata_runtime_get_info", [&](Runtime& r) {
    need(out, "out");
    if (out->struct_size < sizeof(uint32_t))
      throw ApiError(STRATA_ERR_VERSION, "strata_runtime_info.struct_size is not set; set it to sizeof(strata_runtime_info)");
    const strata_runtime_info i = r.info();
    const uint32_t n = std::min<uint32_t>(out->struct_size, sizeof(i));
    std::memcpy(reinterpret_cast<char*>(out) + sizeof(uint32_t), reinterpret_cast<const char*>(&i) + sizeof(uint32_t),
                n - sizeof(uint32_t));
  });
}

strata_status strata_register_group(strata_runtime rt, const strata_group_desc* desc, int32_t* group_out) {
  return with_runtime(rt, "strata_register_group", [&](Runtime& r) {
    need(desc, "desc");
    need(group_out, "group_out");
    *group_out = r.register_group(*desc);
  });
}

strata_status strata_find_group(strata_runtime rt, const char* name, int32_t* group_out) {
  return with_runtime(rt, "strata_find_group", [&](Runtime& r) {
    need(name, "name");
    need(group_out, "group_out");
    *group_out = r.find_group(name);
  });
}

strata_status strata_group_shape(strata_runtime rt, int32_t group, int32_t* ndim, int64_t* shape, uint64_t* numel) {
  return with_runtime(rt, "strata_group_shape", [&](Runtime& r) { r.group_shape(group, ndim, shape, numel); });
}

strata_status strata_start(strata_runtime rt) {
  return with_runtime(rt, "strata_start", [&](Runtime& r) { r.start(); });
}

strata_status strata_set_schedule(strata_runtime rt, const int32_t* order, size_t n) {
  return with_runtime(rt, "strata_set_schedule", [&](Runtime& r) { r.set_schedule(order, n); });
}

strata_status strata_begin_micro_step(strata_runtime rt) {
  return with_runtime(rt, "strata_begin_micro_step", [&](Runtime& r) { r.begin_micro_step(); });
}

strata_status strata_acquire(strata_runtime rt, int32_t group, strata_buffer* out) {
  return with_runtime(rt, "strata_acquire", [&](Runtime& r) {
    need(out, "out");
    *out = r.acquire(group);
  });
}

strata_status strata_release(strata_runtime rt, int32_t group) {
  return with_runtime(rt, "strata_release", [&](Runtime& r) { r.release(group); });
}

strata_status strata_grad_buffer(strata_runtime rt, int32_t group, strata_buffer* out) {
  return with_runtime(rt, "strata_grad_buffer", [&](Runtime& r) {
    need(out, "out");
    *out = r.grad_buffer(group);
  });
}

strata_status strata_grad_ready(strata_runtime rt, int32_t group) {
  return with_runtime(rt, "strata_grad_ready", [&](Runtime& r) { r.grad_ready(group); });
}

strata_status strata_grad_submit(strata_runtime rt, int32_t group, const void* data, strata_dtype dtype,
                                 uint64_t numel) {
  return with_runtime(rt, "strata_grad_submit", [&](Runtime& r) { r.grad_submit(group, data, dtype, numel); });
}

strata_status strata_step(strata_runtime rt, int32_t* stepped) {
  return with_runtime(rt, "strata_step", [&](Runtime& r) {
    const bool s = r.step();
    if (stepped) *stepped = s ? 1 : 0;
  });
}

strata_status strata_read_params(strata_runtime rt, int32_t group, void* dst, strata_dtype dtype, uint64_t numel) {
  return with_runtime(rt, "strata_read_params", [&](Runtime& r) { r.read_params(group, dst, dtype, numel); });
}

strata_status strata_loss_scale(strata_runtime rt, double* out) {
  return with_runtime(rt, "strata_loss_scale", [&](Runtime& r) {
    need(out, "out");
    *out = r.loss_scale();
  });
}

strata_status strata_learning_rate(strata_runtime rt, double* out) {
  return with_runtime(rt, "strata_learning_rate", [&](Runtime& r) {
    need(out, "out");
    *out = r.learning_rate();
  });
}

strata_status strata_set_learning_rate(strata_runtime rt, double lr) {
  return with_runtime(rt, "strata_set_learning_rate", [&](Runtime& r) { r.set_learning_rate(lr); });
}

strata_status strata_save_checkpoint(strata_runtime rt, const char* root, const char* extra_json, char* dir_out,
                                     size_t dir_cap) {
  return with_runtime(rt, "strata_save_checkpoint", [&](Runtime& r) {
    need(root, "root");
    // A too-small buffer is refused before saving, so that the status says what happened.
    r.check_room(r.next_checkpoint_dir(root), dir_out, dir_cap, "the checkpoint's directory", "nothing was saved");
    const std::string dir = r.save_checkpoint(root, extra_json ? extra_json : "");
    copy_out(dir, dir_out, dir_cap, "the checkpoint's directory");
  });
}

strata_status strata_load_checkpoint(strata_runtime rt, const char* dir, char* extra_out, size_t extra_cap) {
  return with_runtime(rt, "strata_load_checkpoint", [&](Runtime& r) {
    need(dir, "dir");
    // Its extra JSON is read with the manifest, before loading: a buffer too small for
    // it is refused while the parameters are still the caller's.
    const strata::CheckpointInfo target = r.checkpoint_to_load(dir);
    const std::string extra = target.extra.dump();
    r.check_room(extra, extra_out, extra_cap, "the checkpoint's extra JSON", "nothing was loaded");
    r.load_checkpoint(target);
    copy_out(extra, extra_out, extra_cap, "the checkpoint's extra JSON");
  });
}

strata_status strata_latest_checkpoint(const char* root, char* dir_out, size_t dir_cap) {
  return guard("strata_latest_checkpoint", [&] {
    need(root, "root");
    std::optional<std::string> latest = strata::latest_checkpoint(root);
    if (!latest)
      throw ApiError(STRATA_ERR_NOT_FOUND, std::string("no complete checkpoint under '") + root + "'");
    copy_out(*latest, dir_out, dir_cap, "the checkpoint's directory");
  });
}

strata_status strata_get_stats(strata_runtime rt, strata_stats* out) {
  return with_runtime(rt, "strata_get_stats", [&](Runtime& r) {
    need(out, "out");
    if (out->struct_size < sizeof(uint32_t))
      throw ApiError(STRATA_ERR_VERSION, "strata_stats.struct_size is not set; set it to sizeof(strata_stats)");
    const strata_stats s = r.stats();
    const uint32_t n = std::min<uint32_t>(out->struct_size, sizeof(s));
    std::memcpy(reinterpret_cast<char*>(out) + sizeof(uint32_t), reinterpret_cast<const char*>(&s) + sizeof(uint32_t),
                n - sizeof(uint32_t));
  });
}

}  // extern "C"
