// strata._strata: the Python module over the C API (include/strata/strata.h). It calls
// nothing but strata_* functions, so it exercises the same ABI as any C caller.
//
// Acquired buffers go to Python without copies through DLPack (__dlpack__ and
// __dlpack_device__; kDLCPU for host memory, kDLCUDA for device memory), so
// torch.from_dlpack and numpy.from_dlpack see Strata's memory, in the runtime's dtype
// (float32, or bfloat16 / float16 in a bf16 / fp16 runtime: kDLBfloat or kDLFloat with 16
// bits, so torch gives torch.bfloat16 / torch.float16 tensors). Every buffer, and every
// DLPack capsule or tensor made from one, keeps the runtime alive: the C handle is
// destroyed when Runtime.close() was called (or the Runtime was collected) and the last
// view is gone. The view's contents are valid only until the group is released.
//
// Lifetimes are C++ shared_ptrs, not Python references, because DLPack deleters may run
// on threads that do not hold the GIL (torch frees tensors from its autograd threads).
// Blocking calls release the GIL, so Python threads may share a runtime (the C API
// serialises its calls).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dlpack.h"
#include "strata/strata.h"

namespace py = pybind11;

namespace {

struct StatusError : std::runtime_error {
  StatusError(strata_status s, const std::string& m) : std::runtime_error(m), status(s) {}
  strata_status status;
};

void check(strata_status s) {
  if (s != STRATA_OK) throw StatusError(s, std::string(strata_status_name(s)) + ": " + strata_last_error());
}

// Text the C API takes as a NUL-terminated string. A Python str may hold a NUL, where C
// would cut it short without a word ('a\0b' registered as 'a'), so such text is refused.
const char* c_text(const std::string& s, const char* what) {
  const size_t nul = s.find('\0');
  if (nul != std::string::npos)
    throw py::value_error(std::string(what) + " holds a NUL character (its byte " + std::to_string(nul + 1) + " of " +
                          std::to_string(s.size()) +
                          "); the C API reads text up to its first NUL, so Strata would see only the " +
                          std::to_string(nul) + " byte(s) before it: remove the NUL");
  return s.c_str();
}

// torch's names for the C API's element types.
const char* dtype_name(strata_dtype t) {
  switch (t) {
    case STRATA_BF16: return "bfloat16";
    case STRATA_F16: return "float16";
    default: return "float32";
  }
}

DLDataType dl_dtype(strata_dtype t) {
  switch (t) {
    case STRATA_BF16: return DLDataType{kDLBfloat, 16, 1};
    case STRATA_F16: return DLDataType{kDLFloat, 16, 1};
    default: return DLDataType{kDLFloat, 32, 1};
  }
}

// Owns the C handle: destroyed with the last reference (the Runtime or any view).
struct Handle {
  strata_runtime rt{0};
  ~Handle() {
    if (rt.id) strata_runtime_destroy(rt);
  }
};
using HandlePtr = std::shared_ptr<Handle>;

struct Managed {
  DLManagedTensor tensor{};
  HandlePtr keep;
  std::vector<int64_t> shape;
};

void managed_deleter(DLManagedTensor* self) { delete static_cast<Managed*>(self->manager_ctx); }

void capsule_destructor(PyObject* capsule) {
  // A consumer renames the capsule to "used_dltensor" and owns the tensor; otherwise
  // the capsule was never consumed and frees it here.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (t && t->deleter) t->deleter(t);
  }
}

// A buffer handed out by acquire or grad_buffer.
class Buffer {
 public:
  Buffer(HandlePtr h, strata_buffer b, int32_t group, bool writable) : h_(std::move(h)), b_(b), group_(group),
                                                                         writable_(writable) {}

  py::tuple dlpack_device() const { return py::make_tuple(static_cast<int>(b_.device_type), b_.device_id); }

  // stream: the consumer's stream (cuda). The data is ready when acquire returned (see
  // strata_buffer.ready_event), so there is nothing to order; a non-NULL ready_event
  // (not produced by this version) would be waited on here.
  py::capsule dlpack(py::object stream) const {
    if (b_.ready_event != nullptr)
      throw StatusError(STRATA_ERR_INTERNAL, "the buffer has a ready_event; this module cannot order it yet");
    auto* m = new Managed;
    m->keep = h_;
    m->shape.assign(b_.shape, b_.shape + b_.ndim);
    DLTensor& t = m->tensor.dl_tensor;
    t.data = b_.data;
    t.device = DLDevice{static_cast<DLDeviceType>(b_.device_type), b_.device_id};
    t.ndim = b_.ndim;
    t.dtype = dl_dtype(b_.dtype);
    t.shape = m->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    m->tensor.manager_ctx = m;
    m->tensor.deleter = managed_deleter;
    PyObject* cap = PyCapsule_New(&m->tensor, "dltensor", capsule_destructor);
    if (!cap) {
      delete m;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
  }

  uint64_t numel() const { return b_.numel; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(b_.shape, b_.shape + b_.ndim); }
  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(b_.data); }
  int32_t group() const { return group_; }
  std::string dtype() const { return dtype_name(b_.dtype); }
  bool writable() const { return writable_; }
  std::string device() const { return b_.device_type == STRATA_DEVICE_CUDA ? "cuda:" + std::to_string(b_.device_id) : "cpu"; }

 private:
  HandlePtr h_;
  strata_buffer b_;
  int32_t group_;
  bool writable_;
};

// An array borrowed from any object with __dlpack__ (torch tensor, numpy array) for the
// duration of one call.
class Borrowed {
 public:
  explicit Borrowed(py::handle obj) {
    if (!py::hasattr(obj, "__dlpack__"))
      throw StatusError(STRATA_ERR_INVALID_ARGUMENT,
                        "expected an array with __dlpack__ (a torch tensor or numpy array), got " +
                            std::string(py::str(py::type::of(obj))));
    capsule_ = obj.attr("__dlpack__")();
    t_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
    if (!t_) throw py::error_already_set();
    PyCapsule_SetName(capsule_.ptr(), "used_dltensor");
    const DLTensor& d = t_->dl_tensor;
    numel_ = 1;
    for (int i = 0; i < d.ndim; ++i) numel_ *= static_cast<uint64_t>(d.shape[i]);
    if (d.strides) {
      int64_t expect = 1;
      for (int i = d.ndim - 1; i >= 0; --i) {
        if (d.shape[i] != 1 && d.strides[i] != expect)
          throw StatusError(STRATA_ERR_INVALID_ARGUMENT, "the array is not contiguous; pass a contiguous copy "
                                                         "(tensor.contiguous() or numpy.ascontiguousarray)");
        expect *= d.shape[i];
      }
    }
    if (d.dtype.lanes != 1)
      throw StatusError(STRATA_ERR_DTYPE, "vector dtypes (lanes > 1) are not supported; pass the runtime's dtype");
    if (d.dtype.code == kDLFloat && d.dtype.bits == 32) dtype_ = STRATA_F32;
    else if (d.dtype.code == kDLFloat && d.dtype.bits == 16) dtype_ = STRATA_F16;
    else if (d.dtype.code == kDLBfloat && d.dtype.bits == 16) dtype_ = STRATA_BF16;
    else
      throw StatusError(STRATA_ERR_DTYPE, "dtype code " + std::to_string(d.dtype.code) + " with " +
                                              std::to_string(d.dtype.bits) +
                                              " bits is not float32, float16 or bfloat16; pass the runtime's dtype "
                                              "(Runtime.dtype)");
    device_type_ = d.device.device_type;
    data_ = static_cast<const char*>(d.data) + d.byte_offset;
  }
  ~Borrowed() {
    if (t_ && t_->deleter) t_->deleter(t_);
  }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;

  const void* data() const { return data_; }
  uint64_t numel() const { return numel_; }
  strata_dtype dtype() const { return dtype_; }
  int device_type() const { return device_type_; }

 private:
  py::object capsule_;
  DLManagedTensor* t_ = nullptr;
  const void* data_ = nullptr;
  uint64_t numel_ = 0;
  strata_dtype dtype_ = STRATA_F32;
  int device_type_ = kDLCPU;
};

class Runtime {
 public:
  static Runtime from_json(const std::string& json) {
    const char* json_text = c_text(json, "the configuration");
    auto h = std::make_shared<Handle>();
    {
      py::gil_scoped_release nogil;
      check(strata_runtime_create(STRATA_API_VERSION, json_text, &h->rt));
    }
    return Runtime(std::move(h));
  }
  static Runtime from_file(const std::string& path) {
    const char* path_text = c_text(path, "the configuration path");
    auto h = std::make_shared<Handle>();
    {
      py::gil_scoped_release nogil;
      check(strata_runtime_create_from_file(STRATA_API_VERSION, path_text, &h->rt));
    }
    return Runtime(std::move(h));
  }

  // Drops this object's reference; the runtime is destroyed once no view holds it.
  void close() { h_.reset(); }
  bool closed() const { return !h_; }

  int32_t register_group(const std::string& name, const std::vector<int64_t>& shape, const std::string& init,
                         float std, float value, py::object data, bool frozen) {
    strata_group_desc d{};
    d.struct_size = sizeof d;
    d.kind = frozen ? STRATA_GROUP_FROZEN : STRATA_GROUP_TRAINED;
    d.name = c_text(name, "the group name");
    d.ndim = static_cast<int32_t>(shape.size());
    d.shape = shape.data();
    d.dtype = runtime_dtype();  // data= passes its own, which the C API checks against it
    d.init_std = std;
    d.init_value = value;
    std::unique_ptr<Borrowed> b;
    if (!data.is_none()) {
      b = std::make_unique<Borrowed>(data);
      if (b->device_type() != kDLCPU)
        throw StatusError(STRATA_ERR_INVALID_ARGUMENT, "initial data must be in host memory; pass tensor.cpu()");
      uint64_t numel = 1;
      for (int64_t x : shape) numel *= static_cast<uint64_t>(x);
      if (b->numel() != numel)
        throw StatusError(STRATA_ERR_INVALID_ARGUMENT, "group '" + name + "': data has " + std::to_string(b->numel()) +
                                                           " elements, the shape " + std::to_string(numel));
      d.dtype = b->dtype();
      d.init = STRATA_INIT_DATA;
      d.data = b->data();
    } else if (init == "normal") {
      d.init = STRATA_INIT_NORMAL;
    } else if (init == "zeros") {
      d.init = STRATA_INIT_ZEROS;
    } else if (init == "ones") {
      d.init = STRATA_INIT_ONES;
    } else if (init == "constant") {
      d.init = STRATA_INIT_CONSTANT;
    } else {
      throw StatusError(STRATA_ERR_INVALID_ARGUMENT, "init '" + init +
                                                         "' is not one of normal, zeros, ones, constant (or pass data=)");
    }
    int32_t id = -1;
    check(strata_register_group(rt(), &d, &id));
    return id;
  }

  int32_t find_group(const std::string& name) {
    int32_t id = -1;
    check(strata_find_group(rt(), c_text(name, "the group name"), &id));
    return id;
  }
  std::vector<int64_t> group_shape(int32_t g) {
    int32_t ndim = 0;
    int64_t shape[STRATA_MAX_DIMS];
    check(strata_group_shape(rt(), g, &ndim, shape, nullptr));
    return std::vector<int64_t>(shape, shape + ndim);
  }
  void start() { call([&](strata_runtime r) { return strata_start(r); }); }
  void set_schedule(const std::vector<int32_t>& order) {
    call([&](strata_runtime r) { return strata_set_schedule(r, order.data(), order.size()); });
  }
  void begin_micro_step() { call([&](strata_runtime r) { return strata_begin_micro_step(r); }); }
  Buffer acquire(int32_t g) {
    strata_buffer b{};
    call([&](strata_runtime r) { return strata_acquire(r, g, &b); });
    return Buffer(h_, b, g, false);
  }
  void release(int32_t g) { call([&](strata_runtime r) { return strata_release(r, g); }); }
  Buffer grad_buffer(int32_t g) {
    strata_buffer b{};
    call([&](strata_runtime r) { return strata_grad_buffer(r, g, &b); });
    return Buffer(h_, b, g, true);
  }
  void grad_ready(int32_t g) { call([&](strata_runtime r) { return strata_grad_ready(r, g); }); }
  void submit_grad(int32_t g, py::object array) {
    Borrowed b(array);
    call([&](strata_runtime r) { return strata_grad_submit(r, g, b.data(), b.dtype(), b.numel()); });
  }
  bool step() {
    int32_t stepped = 0;
    call([&](strata_runtime r) { return strata_step(r, &stepped); });
    return stepped != 0;
  }
  // float32 in every precision (numpy has no bfloat16): 16-bit values widen exactly.
  py::array_t<float> read_params(int32_t g) {
    std::vector<int64_t> shape = group_shape(g);
    py::array_t<float> out(std::vector<py::ssize_t>(shape.begin(), shape.end()));
    float* p = out.mutable_data();
    const uint64_t n = static_cast<uint64_t>(out.size());
    call([&](strata_runtime r) { return strata_read_params(r, g, p, STRATA_F32, n); });
    return out;
  }
  double loss_scale() {
    double s = 0;
    check(strata_loss_scale(rt(), &s));
    return s;
  }
  double learning_rate() {
    double lr = 0;
    check(strata_learning_rate(rt(), &lr));
    return lr;
  }
  void set_learning_rate(double lr) { call([&](strata_runtime r) { return strata_set_learning_rate(r, lr); }); }
  std::string dtype() { return dtype_name(runtime_dtype()); }
  std::string save_checkpoint(const std::string& root, py::object extra_json) {
    std::string extra = extra_json.is_none() ? "" : extra_json.cast<std::string>();
    const char* root_text = c_text(root, "the checkpoint root");
    const char* extra_text = extra.empty() ? nullptr : c_text(extra, "extra_json");
    std::vector<char> dir(8192);
    call([&](strata_runtime r) { return strata_save_checkpoint(r, root_text, extra_text, dir.data(), dir.size()); });
    return dir.data();
  }
  std::string load_checkpoint(const std::string& dir) {
    const char* dir_text = c_text(dir, "the checkpoint directory");
    // A buffer too small for the extra JSON is refused before anything is loaded, so a
    // larger one can be offered until it fits (a manifest is at most 256 MiB).
    for (size_t cap = size_t{1} << 20;; cap *= 4) {
      std::vector<char> extra(cap);
      std::string msg;
      const strata_status s = try_call(
          [&](strata_runtime r) { return strata_load_checkpoint(r, dir_text, extra.data(), extra.size()); }, &msg);
      if (s == STRATA_OK) return extra.data();
      if (s != STRATA_ERR_BUFFER_TOO_SMALL || cap >= (size_t{256} << 20))
        throw StatusError(s, std::string(strata_status_name(s)) + ": " + msg);
    }
  }
  py::dict stats() {
    strata_stats s{};
    s.struct_size = sizeof s;
    check(strata_get_stats(rt(), &s));
    const char* tiers[STRATA_TIER_COUNT] = {"device", "pinned", "nvme"};
    py::dict d, per_tier, moved, bw;
    for (int t = 0; t < STRATA_TIER_COUNT; ++t) {
      py::dict x;
      x["budget"] = s.tiers[t].budget;
      x["used"] = s.tiers[t].used;
      x["peak"] = s.tiers[t].peak;
      per_tier[tiers[t]] = x;
      for (int u = 0; u < STRATA_TIER_COUNT; ++u) {
        if (t == u) continue;
        const std::string key = std::string(tiers[t]) + "->" + tiers[u];
        moved[key.c_str()] = s.bytes_moved[t][u];
        bw[key.c_str()] = s.bandwidth[t][u];
      }
    }
    d["tiers"] = per_tier;
    d["bytes_moved"] = moved;
    d["bandwidth"] = bw;
    d["elapsed_s"] = s.elapsed_s;
    d["exposed_wait_s"] = s.exposed_wait_s;
    d["optimizer_s"] = s.optimizer_s;
    d["optimizer_wait_s"] = s.optimizer_wait_s;
    d["moves"] = s.moves;
    d["evictions"] = s.evictions;
    d["gathers"] = s.gathers;
    d["prefetched"] = s.prefetched;
    d["trace_departures"] = s.trace_departures;
    d["optimizer_steps"] = s.optimizer_steps;
    d["last_grad_norm"] = s.last_grad_norm;
    d["skipped_steps"] = s.skipped_steps;
    d["loss_scale"] = s.loss_scale;
    return d;
  }
  py::dict info() {
    strata_runtime_info i{};
    i.struct_size = sizeof i;
    check(strata_runtime_get_info(rt(), &i));
    py::dict d;
    d["rank"] = i.rank;
    d["world_size"] = i.world_size;
    d["device"] = i.device_type == STRATA_DEVICE_CUDA ? "cuda:" + std::to_string(i.device_id) : std::string("cpu");
    d["num_groups"] = i.num_groups;
    d["started"] = i.started != 0;
    d["gradient_accumulation_steps"] = i.gradient_accumulation_steps;
    d["zero_stage"] = i.zero_stage;
    d["dtype"] = dtype_name(i.dtype);
    return d;
  }
  uint64_t handle_id() const { return h_ ? h_->rt.id : 0; }

 private:
  explicit Runtime(HandlePtr h) : h_(std::move(h)) {}
  strata_dtype runtime_dtype() {
    strata_runtime_info i{};
    i.struct_size = sizeof i;
    check(strata_runtime_get_info(rt(), &i));
    return i.dtype;
  }
  strata_runtime rt() const {
    if (!h_)
      throw StatusError(STRATA_ERR_INVALID_HANDLE, "STRATA_ERR_INVALID_HANDLE: this Runtime was closed; make a new one");
    return h_->rt;
  }
  // Runs a C call without the GIL: its status, and its message in *msg when it failed.
  template <class F>
  strata_status try_call(F&& f, std::string* msg) {
    const strata_runtime r = rt();
    strata_status s;
    {
      py::gil_scoped_release nogil;
      s = f(r);
      if (s != STRATA_OK) *msg = strata_last_error();  // the same thread, before the GIL returns
    }
    return s;
  }
  template <class F>
  void call(F&& f) {
    std::string msg;
    const strata_status s = try_call(f, &msg);
    if (s != STRATA_OK) throw StatusError(s, std::string(strata_status_name(s)) + ": " + msg);
  }

  HandlePtr h_;
};

}  // namespace

PYBIND11_MODULE(_strata, m) {
  m.doc() = "Strata's C API (libstrata) from Python: see docs/embedding.md";
  static py::exception<StatusError> error(m, "StrataError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object inst = py::reinterpret_borrow<py::object>(error.ptr())(e.what());
      inst.attr("status") = strata_status_name(e.status);
      PyErr_SetObject(error.ptr(), inst.ptr());
    }
  });
  m.def("api_version", [] { return strata_api_version(); }, "STRATA_API_VERSION of the loaded libstrata");
  m.def("version", [] { return std::string(strata_version_string()); });
  m.attr("API_VERSION") = STRATA_API_VERSION;
  m.def("latest_checkpoint", [](const std::string& root) -> py::object {
    std::vector<char> dir(8192);
    strata_status s = strata_latest_checkpoint(c_text(root, "the checkpoint root"), dir.data(), dir.size());
    if (s == STRATA_ERR_NOT_FOUND) return py::none();
    check(s);
    return py::str(dir.data());
  });

  py::class_<Buffer>(m, "Buffer", "A group's parameters (acquire) or gradient buffer (grad_buffer), shared "
                                  "through DLPack. Valid until release / grad_ready.")
      .def("__dlpack__", &Buffer::dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &Buffer::dlpack_device)
      .def_property_readonly("numel", &Buffer::numel)
      .def_property_readonly("shape", &Buffer::shape)
      .def_property_readonly("ptr", &Buffer::ptr)
      .def_property_readonly("group", &Buffer::group)
      .def_property_readonly("dtype", &Buffer::dtype)
      .def_property_readonly("writable", &Buffer::writable)
      .def_property_readonly("device", &Buffer::device);

  py::class_<Runtime>(m, "Runtime")
      .def(py::init([](py::object config_json, py::object path) {
             if (config_json.is_none() == path.is_none())
               throw StatusError(STRATA_ERR_INVALID_ARGUMENT, "give either config_json or path=, not both or neither");
             return path.is_none() ? Runtime::from_json(config_json.cast<std::string>())
                                   : Runtime::from_file(path.cast<std::string>());
           }),
           py::arg("config_json") = py::none(), py::kw_only(), py::arg("path") = py::none(),
           "A runtime from a JSON configuration string, or from a file with path=")
      .def("close", &Runtime::close)
      .def_property_readonly("closed", &Runtime::closed)
      .def_property_readonly("handle_id", &Runtime::handle_id)
      .def("register_group", &Runtime::register_group, py::arg("name"), py::arg("shape"), py::arg("init") = "normal",
           py::arg("std") = 0.02f, py::arg("value") = 0.0f, py::arg("data") = py::none(),
           py::arg("frozen") = false)
      .def("find_group", &Runtime::find_group)
      .def("group_shape", &Runtime::group_shape)
      .def("start", &Runtime::start)
      .def("set_schedule", &Runtime::set_schedule)
      .def("begin_micro_step", &Runtime::begin_micro_step)
      .def("acquire", &Runtime::acquire)
      .def("release", &Runtime::release)
      .def("grad_buffer", &Runtime::grad_buffer)
      .def("grad_ready", &Runtime::grad_ready)
      .def("submit_grad", &Runtime::submit_grad, py::arg("group"), py::arg("grad"))
      .def("step", &Runtime::step)
      .def("read_params", &Runtime::read_params)
      .def("loss_scale", &Runtime::loss_scale,
           "The factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise). Read it again "
           "after every step: an fp16 overflow skips the step and lowers it.")
      .def("learning_rate", &Runtime::learning_rate,
           "The learning rate of the next optimizer step: the config's schedule, or set_learning_rate's value.")
      .def("set_learning_rate", &Runtime::set_learning_rate, py::arg("lr"),
           "Sets the lr of every step from the next on (between steps; not with a `scheduler` section).")
      .def_property_readonly("dtype", &Runtime::dtype,
                             "'float32', 'bfloat16' or 'float16': every group's, buffer's and gradient's")
      .def("save_checkpoint", &Runtime::save_checkpoint, py::arg("root"), py::arg("extra_json") = py::none())
      .def("load_checkpoint", &Runtime::load_checkpoint)
      .def("stats", &Runtime::stats)
      .def("info", &Runtime::info);
}
