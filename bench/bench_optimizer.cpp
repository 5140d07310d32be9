// strata bench optimizer: the fused CPU Adam against PyTorch's Adam and against the
// memory bandwidth the machine gives (a STREAM triad), interleaved in one run.
//
// Each repetition times, in turn: one CpuAdam step, one step of DeepSpeed's
// DeepSpeedCPUAdam (when its op can be had; fp32, or bf16 weights and gradients when
// CpuAdam reads 16-bit gradients or writes a 16-bit copy), one torch.optim.Adam step with
// foreach=False and one with foreach=True (DeepSpeed and torch in a PyTorch process that
// stays up for the whole run, bench/ref/torch_adam.py, which times its own steps), and one
// triad pass a[i] = b[i] + s*c[i] over doubles with the same number of threads, and one
// pass that moves CpuAdam's bytes over its arrays with no arithmetic (adam_bytes).
// Interleaving keeps slow drifts of the machine (other tenants, frequency) from favouring
// one of them.
//
// CpuAdam's arrays are carved from one mapping one page apart (--array-layout staggered),
// as separate malloc'd tensors happen to be for torch and DeepSpeed. Arrays whose
// addresses differ by a large power of two (power-of-two: 2^28 bytes apart at the default
// size) make every contender that touches them slower; see docs/bench-optimizer.md.
//
// Adam moves 28 bytes per parameter (reads p, g, m, v: 16; writes p, m, v: 12), 2 fewer
// with 16-bit gradients (--grad), +2 for a 16-bit copy; the triad moves 24 bytes per
// element, counted as STREAM counts them (the read-for-ownership of `a` is not counted).
// Its arrays hold as many bytes as Adam's state, both far beyond the caches at the
// default size.
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/bench/commands.hpp"
#include "strata/bench/reference_process.hpp"
#include "strata/bench/report.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"
#include "strata/offload/cpu_adam.hpp"

#ifndef STRATA_TORCH_ADAM_SCRIPT
#define STRATA_TORCH_ADAM_SCRIPT "bench/ref/torch_adam.py"
#endif
#ifndef STRATA_VENV_PYTHON
#define STRATA_VENV_PYTHON ".venv/bin/python"
#endif

namespace strata::bench {

namespace {

constexpr double kAdamBytesPerParam = 28;  // read p, g, m, v; write p, m, v (fp32)
constexpr double kTriadBytesPerElement = 24;  // read b, c; write a (fp64)

// The repository's .venv (scripts/install-deps.sh: torch and DeepSpeed from PyPI) when it
// exists, else the system Python (torch only).
std::string default_python() {
  return access(STRATA_VENV_PYTHON, X_OK) == 0 ? STRATA_VENV_PYTHON : "/usr/bin/python3";
}

struct OptimizerOptions {
  uint64_t params = uint64_t{1} << 26;  // elements; 64M = 1 GiB of fp32 state
  unsigned threads = 0;                 // 0: hardware_concurrency
  unsigned reps = 7;
  std::string isa = "auto";
  std::string prefetch = "auto";  // CpuAdam's software prefetch: auto | off | l1
  std::string variant = "adam";  // adam | adamw
  std::string half = "none";     // none | bf16 | fp16
  std::string grad = "f32";      // the gradient CpuAdam reads: f32 | bf16 | fp16
  bool hugepages = false;
  bool torch = true;
  bool deepspeed = true;                 // with the PyTorch process only
  std::string layout = "staggered";      // staggered | power-of-two
  std::string python = default_python();
  std::string torch_script = STRATA_TORCH_ADAM_SCRIPT;
  OutputOptions out;
};

// Anonymous memory taken with mmap, as the pinned pool takes it (4 KiB pages unless
// asked for transparent huge pages), and touched before any timing.
class HostBuffer {
 public:
  HostBuffer(size_t bytes, bool hugepages) : bytes_(bytes) {
    ptr_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr_ == MAP_FAILED) throw OutOfBudget("bench optimizer: cannot map " + format_bytes(bytes) + ": " + std::strerror(errno));
    if (hugepages && madvise(ptr_, bytes, MADV_HUGEPAGE) != 0)
      std::fprintf(stderr, "bench optimizer: madvise(MADV_HUGEPAGE) refused: %s\n", std::strerror(errno));
  }
  ~HostBuffer() { munmap(ptr_, bytes_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_;
  size_t bytes_;
};

// Where CpuAdam's arrays lie in their one mapping: each starts on a page. staggered: one
// page after the previous one ends, so that no two start a multiple of a large power of
// two apart; power-of-two: each at a multiple of the largest array's size rounded up to a
// power of two, the layout a pool of power-of-two classes produces.
std::vector<size_t> array_offsets(const std::vector<size_t>& bytes, const std::string& layout) {
  constexpr size_t kPage = 4096;
  std::vector<size_t> offsets;
  size_t at = 0, slot = kPage;
  for (size_t b : bytes) slot = std::max(slot, std::bit_ceil(b));
  for (size_t i = 0; i < bytes.size(); ++i) {
    offsets.push_back(layout == "power-of-two" ? i * slot : at);
    at += (bytes[i] + kPage - 1) / kPage * kPage + kPage;
  }
  offsets.push_back(layout == "power-of-two" ? bytes.size() * slot : at);  // the mapping's size
  return offsets;
}

// Runs fn(begin, end) over [0, n) split into `threads` equal parts, one thread each.
template <typename Fn>
void parallel_parts(size_t n, unsigned threads, const Fn& fn) {
  const size_t chunk = (n / threads + 63) / 64 * 64;
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < threads; ++t)
    workers.emplace_back([&, t] { fn(std::min(n, t * chunk), t + 1 == threads ? n : std::min(n, (t + 1) * chunk)); });
  fn(0, threads == 1 ? n : std::min(n, chunk));
  for (auto& w : workers) w.join();
}

void triad_range(double* __restrict a, const double* __restrict b, const double* __restrict c, double s,
                 size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
}

// The same with non-temporal stores, which skip reading `a` before writing it.
void triad_range_streaming(double* a, const double* b, const double* c, double s, size_t begin, size_t end) {
#if defined(__x86_64__)
  size_t i = begin;
  const __m128d vs = _mm_set1_pd(s);
  for (; i + 2 <= end; i += 2)
    _mm_stream_pd(a + i, _mm_add_pd(_mm_load_pd(b + i), _mm_mul_pd(vs, _mm_load_pd(c + i))));
  _mm_sfence();
  triad_range(a, b, c, s, i, end);
#else
  triad_range(a, b, c, s, begin, end);
#endif
}

// Adam's memory traffic without its arithmetic, over CpuAdam's own arrays: reads p, g, m
// and v, writes p, m, v (and the 16-bit copy), each value written back unchanged (z is 0
// at run time, which the compiler cannot know): what an in-place Adam over these arrays
// costs when its arithmetic is free. Where CpuAdam runs at this pass's speed, the step is
// bound by memory, and only fewer bytes would make any CPU Adam faster.
// Vectorised at the widest ISA the CPU has (CpuAdam's kernels use AVX-512 where there is
// one, and on a core of this VM the vector width moves the bandwidth one thread reaches);
// the build's -O2 would leave the loops scalar on GCC 12.
// G: fp32 gradients, or 16-bit ones read as their bits (z is 0); the 16-bit copy is
// written where half is given.
template <class G>
[[gnu::target_clones("avx512f", "avx2", "default"), gnu::optimize("tree-vectorize", "vect-cost-model=dynamic")]]
void adam_bytes(float* __restrict p, const G* __restrict g, float* __restrict m,
                                        float* __restrict v, uint16_t* __restrict half, float z, size_t begin,
                                        size_t end) {
  if (half)
    for (size_t i = begin; i < end; ++i) {
      const float gi = z * static_cast<float>(g[i]);
      p[i] += gi, m[i] += gi, v[i] += gi;
      half[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(p[i]) >> 16);
    }
  else
    for (size_t i = begin; i < end; ++i) {
      const float gi = z * static_cast<float>(g[i]);
      p[i] += gi, m[i] += gi, v[i] += gi;
    }
}

// DeepSpeed's weights and gradients: bf16 when CpuAdam runs its 16-bit path (16-bit
// gradients or a 16-bit copy), else fp32. DeepSpeedCPUAdam has no fp32-master-with-copy
// mode; its 16-bit mode keeps bf16 weights and fp32 moments (22 bytes per parameter). The
// same work as CpuAdam's 16-bit path is timed beside it the way ZeRO-Offload does it: an
// upcast, the fp32 step and a copy down (torch_adam.py's OffloadStep).
std::string deepspeed_dtype(const OptimizerOptions& o) { return o.grad != "f32" || o.half != "none" ? "bf16" : "fp32"; }

// bench/ref/torch_adam.py in a child process (reference_process.hpp).
class TorchAdam {
 public:
  TorchAdam(const OptimizerOptions& o, unsigned threads)
      : proc_(make_args(o, threads), "bench optimizer: the PyTorch reference",
              "it needs a Python with torch: --python names another Python; --no-torch measures without it") {}

  const nlohmann::json& info() const { return proc_.info(); }
  bool has_deepspeed() const { return info().contains("deepspeed"); }
  bool has_deepspeed_offload() const { return info().contains("deepspeed_offload"); }

  // Per-step seconds of `steps` steps of one variant ("default" or "foreach").
  std::vector<double> time(const std::string& variant, unsigned steps) {
    const nlohmann::json r = proc_.command("time " + variant + " " + std::to_string(steps));
    if (!r.contains("seconds")) throw Unavailable("bench optimizer: the PyTorch reference failed: " + r.dump());
    return r["seconds"].get<std::vector<double>>();
  }

 private:
  static std::vector<std::string> make_args(const OptimizerOptions& o, unsigned threads) {
    std::vector<std::string> args = {o.python, o.torch_script, "--params", std::to_string(o.params),
                                     "--threads", std::to_string(threads)};
    if (o.variant == "adamw") args.push_back("--adamw");
    if (o.deepspeed) {
      args.push_back("--deepspeed");
      args.push_back(deepspeed_dtype(o));
      // The same work as CpuAdam's 16-bit path, the ZeRO-Offload way (torch_adam.py).
      args.insert(args.end(), {"--offload-grad", o.grad, "--offload-copy", o.half});
    }
    return args;
  }

  ReferenceProcess proc_;
};

struct Series {
  std::string name;
  double bytes_per_pass;    // bytes counted per timed pass
  double params_per_pass;   // Adam parameters per pass; 0 for the triad
  std::vector<double> seconds;

  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
  double min() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double max() const { return *std::max_element(seconds.begin(), seconds.end()); }
  double gbps() const { return bytes_per_pass / median() / 1e9; }
  double params_per_s() const { return params_per_pass / median(); }
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

HalfKind parse_half(const std::string& s) {
  if (s == "none") return HalfKind::None;
  if (s == "bf16") return HalfKind::Bf16;
  if (s == "fp16") return HalfKind::Fp16;
  throw ConfigError("--half '" + s + "': choose none, bf16 or fp16");
}

// Bytes one CpuAdam step moves per parameter: 28 with fp32 gradients, 26 with 16-bit
// ones, +2 for a 16-bit copy.
double adam_bytes_per_param(DType grad, HalfKind half) {
  return kAdamBytesPerParam - 4.0 + static_cast<double>(dtype_size(grad)) + (half != HalfKind::None ? 2 : 0);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

CpuAdamOptions cpu_adam_options(const OptimizerOptions& o, unsigned threads) {
  CpuAdamOptions options{threads, parse_cpu_isa(o.isa)};
  options.prefetch = parse_cpu_prefetch(o.prefetch);
  return options;
}

AdamConfig adam_config(const OptimizerOptions& o) {
  AdamConfig config;
  config.lr = 1e-3;
  config.weight_decay = 0.01;
  config.variant = o.variant == "adamw" ? AdamVariant::AdamW : AdamVariant::Adam;
  return config;
}

// The seconds of one round, one pass of each contender.
struct RoundSeconds {
  double strata = 0, triad = 0, triad_streaming = 0, adam_bytes = 0;
  double torch_default = 0, torch_foreach = 0;  // with the PyTorch reference only
  double deepspeed = 0;                         // with DeepSpeed's op only
  double deepspeed_offload = 0;                 // and CpuAdam's 16-bit path
};

// Everything that is timed, set up before any timing: CpuAdam with its state, the
// triad's arrays (as many bytes as Adam's state), and the PyTorch process unless
// --no-torch.
class Contenders {
 public:
  Contenders(const OptimizerOptions& o, unsigned threads)
      : n_(o.params), threads_(threads), half_(parse_half(o.half)), grad_(parse_precision(o.grad)),
        adam_(adam_config(o), cpu_adam_options(o, threads)),
        triad_n_(n_ * 16 / kTriadBytesPerElement),
        offsets_(array_offsets({n_ * 4, n_ * dtype_size(grad_), n_ * 4, n_ * 4, n_ * 2}, o.layout)),
        state_(offsets_.back(), o.hugepages),
        ta_(triad_n_ * 8, o.hugepages), tb_(triad_n_ * 8, o.hugepages), tc_(triad_n_ * 8, o.hugepages) {
    // First touch from the threads that will use the memory, values far from denormals.
    parallel_parts(n_, threads, [&](size_t b, size_t e) {
      float g[1024];  // the gradient in fp32, converted to its type a block at a time
      for (size_t block = b; block < e; block += 1024) {
        const size_t end = std::min(e, block + 1024);
        for (size_t i = block; i < end; ++i) {
          params()[i] = 0.5f - static_cast<float>(i % 1000) * 1e-3f;
          g[i - block] = 1e-2f * (static_cast<float>(i % 77) - 38.0f) + 1e-3f;
          exp_avg()[i] = 0.0f;
          exp_avg_sq()[i] = 0.0f;
        }
        convert_from_f32(static_cast<char*>(grads()) + block * dtype_size(grad_), grad_, g, end - block);
      }
    });
    parallel_parts(triad_n_, threads, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        ta_.as<double>()[i] = 0.0;
        tb_.as<double>()[i] = 1.0;
        tc_.as<double>()[i] = 2.0;
      }
    });
    if (o.torch) torch_ = std::make_unique<TorchAdam>(o, threads);
  }

  float* params() { return state_.as<float>() + offsets_[0] / 4; }
  void* grads() { return state_.as<char>() + offsets_[1]; }
  float* exp_avg() { return state_.as<float>() + offsets_[2] / 4; }
  float* exp_avg_sq() { return state_.as<float>() + offsets_[3] / 4; }
  void* half_copy() { return half_ != HalfKind::None ? state_.as<char>() + offsets_[4] : nullptr; }

  // One pass of each, in a fixed order: a CpuAdam step, DeepSpeed's, PyTorch's two Adams,
  // the triad with plain and with streaming stores.
  RoundSeconds round() {
    RoundSeconds r;
    auto start = std::chrono::steady_clock::now();
    adam_.step(++step_, params(), AdamGrads{grads(), grad_, 1.0f}, exp_avg(), exp_avg_sq(), n_, half_copy(), half_);
    r.strata = seconds_since(start);
    if (torch_) {
      if (torch_->has_deepspeed()) r.deepspeed = torch_->time("deepspeed", 1)[0];
      if (torch_->has_deepspeed_offload()) r.deepspeed_offload = torch_->time("deepspeed_offload", 1)[0];
      r.torch_default = torch_->time("default", 1)[0];
      r.torch_foreach = torch_->time("foreach", 1)[0];
      // libgomp's workers spin for a while after each parallel region; let them go idle
      // before the next timing, so they do not take cores from it.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    start = std::chrono::steady_clock::now();
    parallel_parts(triad_n_, threads_, [&](size_t b, size_t e) {
      triad_range(ta_.as<double>(), tb_.as<double>(), tc_.as<double>(), 3.0, b, e);
    });
    r.triad = seconds_since(start);
    start = std::chrono::steady_clock::now();
    parallel_parts(triad_n_, threads_, [&](size_t b, size_t e) {
      triad_range_streaming(ta_.as<double>(), tb_.as<double>(), tc_.as<double>(), 3.0, b, e);
    });
    r.triad_streaming = seconds_since(start);
    start = std::chrono::steady_clock::now();
    parallel_parts(n_, threads_, [&](size_t b, size_t e) {
      auto* half = static_cast<uint16_t*>(half_copy());
      const float z = zero_;
      if (grad_ != DType::F32)
        adam_bytes(params(), static_cast<const uint16_t*>(grads()), exp_avg(), exp_avg_sq(), half, z, b, e);
      else
        adam_bytes(params(), static_cast<const float*>(grads()), exp_avg(), exp_avg_sq(), half, z, b, e);
    });
    r.adam_bytes = seconds_since(start);
    return r;
  }

  size_t params() const { return n_; }
  size_t triad_elements() const { return triad_n_; }
  HalfKind half() const { return half_; }
  DType grad() const { return grad_; }
  CpuIsa isa() const { return adam_.isa(); }
  CpuPrefetch prefetch() const { return adam_.prefetch(); }
  const TorchAdam* torch() const { return torch_.get(); }

 private:
  size_t n_;  // Adam's parameters
  unsigned threads_;
  HalfKind half_;
  DType grad_;  // CpuAdam's gradient type
  CpuAdam adam_;
  size_t triad_n_;  // triad elements
  std::vector<size_t> offsets_;  // bytes into state_: params, grads, exp_avg, exp_avg_sq, half copy; its size
  HostBuffer state_;             // [n_] fp32 params, moments; [n_] of grad_; [n_] 16-bit copy
  HostBuffer ta_, tb_, tc_;                // [triad_n_] fp64
  std::unique_ptr<TorchAdam> torch_;
  int64_t step_ = 0;
  volatile float zero_ = 0.0f;  // adam_bytes's z: 0, unknown to the compiler
};

// DeepSpeedCPUAdam's bytes per parameter: fp32 like Strata's 28; bf16 weights and
// gradients with fp32 moments read 2 + 2 + 4 + 4 and write 2 + 4 + 4.
constexpr double kDeepSpeedBf16BytesPerParam = 22;
// ZeRO-Offload's pipeline for CpuAdam's 16-bit path: its fp32 step (28) plus, for a 16-bit
// gradient, the upcast (read 2, write 4) and, for a 16-bit copy, the copy down (read 4,
// write 2).
double deepspeed_offload_bytes_per_param(DType grad, HalfKind half) {
  return kAdamBytesPerParam + (grad != DType::F32 ? 6.0 : 0.0) + (half != HalfKind::None ? 6.0 : 0.0);
}

// One series per contender: strata, the two triads, Adam's bytes alone, then PyTorch's
// two Adams, then DeepSpeed's when its op loaded.
std::vector<Series> make_series(const Contenders& c, AdamVariant variant) {
  const double n = static_cast<double>(c.params());
  const double adam_bytes = n * adam_bytes_per_param(c.grad(), c.half());
  const double triad_bytes = static_cast<double>(c.triad_elements()) * kTriadBytesPerElement;
  const std::string grads = c.grad() != DType::F32 ? std::string(", ") + precision_name(c.grad()) + " grads" : "";
  const std::string strata_name =
      std::string("strata CpuAdam (") + to_string(c.isa()) + grads + (c.prefetch() == CpuPrefetch::L1 ? ", prefetch" : "") + ")";
  std::vector<Series> series = {{strata_name, adam_bytes, n, {}},
                                {"STREAM triad", triad_bytes, 0, {}},
                                {"STREAM triad, streaming stores", triad_bytes, 0, {}},
                                {"Adam's bytes, no arithmetic", adam_bytes, n, {}}};
  if (c.torch()) {
    const std::string cls = variant == AdamVariant::AdamW ? "AdamW" : "Adam";
    series.push_back({"torch " + cls + " (foreach=False)", n * kAdamBytesPerParam, n, {}});
    series.push_back({"torch " + cls + " (foreach=True)", n * kAdamBytesPerParam, n, {}});
    if (c.torch()->has_deepspeed()) {
      const bool bf16 = c.torch()->info().value("deepspeed_dtype", "") == "bf16";
      series.push_back({std::string("DeepSpeedCPUAdam (") + (bf16 ? "bf16 weights, grads" : "fp32") + ")",
                        n * (bf16 ? kDeepSpeedBf16BytesPerParam : kAdamBytesPerParam), n, {}});
    }
    if (c.torch()->has_deepspeed_offload())
      series.push_back({std::string("DeepSpeed ZeRO-Offload (") + (c.grad() != DType::F32 ? "16-bit grads" : "") +
                            (c.grad() != DType::F32 && c.half() != HalfKind::None ? ", " : "") +
                            (c.half() != HalfKind::None ? "copy" : "") + ")",
                        n * deepspeed_offload_bytes_per_param(c.grad(), c.half()), n, {}});
  }
  return series;
}

void record(std::vector<Series>& series, const RoundSeconds& r) {
  series[0].seconds.push_back(r.strata);
  series[1].seconds.push_back(r.triad);
  series[2].seconds.push_back(r.triad_streaming);
  series[3].seconds.push_back(r.adam_bytes);
  if (series.size() > 4) {
    series[4].seconds.push_back(r.torch_default);
    series[5].seconds.push_back(r.torch_foreach);
  }
  if (series.size() > 6) series[6].seconds.push_back(r.deepspeed);
  if (series.size() > 7) series[7].seconds.push_back(r.deepspeed_offload);
}

// What the human report says about DeepSpeed: how its result compared with torch.optim,
// or the one line naming what is missing (empty without the PyTorch process or with
// --no-deepspeed).
std::string deepspeed_note(const TorchAdam* torch) {
  if (!torch) return "";
  const nlohmann::json& info = torch->info();
  if (info.contains("deepspeed_missing"))
    return "DeepSpeedCPUAdam not run: " + info["deepspeed_missing"].get<std::string>();
  if (!info.contains("deepspeed_check")) return "";
  const nlohmann::json& c = info["deepspeed_check"];
  char line[256];
  std::snprintf(line, sizeof line,
                "DeepSpeed %s against torch.optim (4099 params, 5 steps): weights differ by at most %.2g lr, "
                "exp_avg by %.2g of its largest value",
                info.value("deepspeed", std::string("?")).c_str(), c.value("params_max_abs_diff_over_lr", -1.0),
                c.value("exp_avg_max_abs_diff_relative", -1.0));
  std::string note = line;
  if (info.contains("deepspeed_offload")) {
    const nlohmann::json& o = info["deepspeed_offload"].value("check", nlohmann::json::object());
    std::snprintf(line, sizeof line,
                  "\nDeepSpeed ZeRO-Offload pipeline against DeepSpeedCPUAdam on the upcast gradient (4099 params, 3 "
                  "steps): masters differ by at most %.2g, the 16-bit copy from the rounded masters by %.2g",
                  o.value("master_max_abs_diff", -1.0), o.value("copy_max_abs_diff", 0.0));
    note += line;
  }
  return note;
}

// The human report: the table, then how strata compares with the triad and PyTorch.
// torch_note: ", torch <version>" with the PyTorch reference, else "".
void print_optimizer_table(std::FILE* out, const std::vector<Series>& series, const std::string& torch_note,
                           const std::string& ds_note, double load_before, double load_after) {
  std::fprintf(out, "cpu: %s%s; load average %.2f before, %.2f after\n", cpu_model().c_str(), torch_note.c_str(),
               load_before, load_after);
  std::fprintf(out, "%-36s %10s %10s %10s %8s %12s %8s\n", "", "median ms", "min ms", "max ms", "spread",
               "Mparams/s", "GB/s");
  for (const Series& s : series) {
    std::fprintf(out, "%-36s %10.2f %10.2f %10.2f %7.1f%% %12s %8.2f\n", s.name.c_str(), s.median() * 1e3,
                 s.min() * 1e3, s.max() * 1e3, 100.0 * (s.max() - s.min()) / s.median(),
                 s.params_per_pass ? std::to_string(static_cast<long>(s.params_per_s() / 1e6)).c_str() : "-",
                 s.gbps());
  }
  std::fprintf(out, "strata / triad bandwidth: %.2f (plain stores), %.2f (streaming stores)\n",
               series[0].gbps() / series[1].gbps(), series[0].gbps() / series[2].gbps());
  std::fprintf(out, "strata / Adam's bytes with no arithmetic: %.2f (params/s; near 1 where the step is bound by "
               "memory, not arithmetic)\n", series[0].params_per_s() / series[3].params_per_s());
  if (series.size() > 4)
    std::fprintf(out, "strata / torch: %.2fx (foreach=False), %.2fx (foreach=True)\n",
                 series[4].median() / series[0].median(), series[5].median() / series[0].median());
  if (series.size() > 6)
    std::fprintf(out, "strata / DeepSpeedCPUAdam: %.2fx (params/s); DeepSpeedCPUAdam / Adam's bytes with no arithmetic: "
                 "%.2f (bytes/s)\n", series[0].params_per_s() / series[6].params_per_s(), series[6].gbps() / series[3].gbps());
  if (series.size() > 7)
    std::fprintf(out,
                 "strata / DeepSpeed ZeRO-Offload step (the same work: fp32 masters and moments, 16-bit gradient in "
                 "and copy out): %.2fx (params/s)\n",
                 series[0].params_per_s() / series[7].params_per_s());
  if (!ds_note.empty()) std::fprintf(out, "%s\n", ds_note.c_str());
}

Report optimizer_report(const OptimizerOptions& o, const Contenders& c, unsigned threads,
                        const std::vector<Series>& series, double load_before, double load_after,
                        const std::string& command) {
  const size_t n = c.params();
  const AdamVariant variant = adam_config(o).variant;
  const TorchAdam* torch = c.torch();
  nlohmann::json ratios;
  ratios["strata_over_triad_bandwidth"] = series[0].gbps() / series[1].gbps();
  ratios["strata_over_triad_streaming_bandwidth"] = series[0].gbps() / series[2].gbps();
  ratios["strata_over_adam_bytes_params_per_s"] = series[0].params_per_s() / series[3].params_per_s();
  if (torch) {
    ratios["strata_over_torch_default"] = series[4].median() / series[0].median();
    ratios["strata_over_torch_foreach"] = series[5].median() / series[0].median();
  }
  if (series.size() > 6) {
    ratios["strata_over_deepspeed_params_per_s"] = series[0].params_per_s() / series[6].params_per_s();
    ratios["deepspeed_over_adam_bytes_bandwidth"] = series[6].gbps() / series[3].gbps();
  }
  if (series.size() > 7)
    ratios["strata_over_deepspeed_offload_params_per_s"] = series[0].params_per_s() / series[7].params_per_s();
  Report report;
  report.benchmark = "optimizer";
  report.command = command;
  char title[256];
  std::snprintf(title, sizeof title,
                "strata bench optimizer: %s params (%s of fp32 state), %s, %u threads, %u reps, 16-bit copy: %s%s%s",
                std::to_string(n).c_str(), format_bytes(n * 16).c_str(),
                variant == AdamVariant::AdamW ? "AdamW" : "Adam", threads, o.reps, o.half.c_str(),
                c.grad() != DType::F32 ? (std::string(", ") + precision_name(c.grad()) + " gradients").c_str() : "",
                o.hugepages ? ", huge pages" : "");
  report.title = title;
  report.config = {{"params", n}, {"threads", threads}, {"reps", o.reps},
                   {"variant", variant == AdamVariant::AdamW ? "adamw" : "adam"}, {"half", o.half},
                   {"grad", precision_name(c.grad())},
                   {"isa", to_string(c.isa())}, {"prefetch", to_string(c.prefetch())}, {"hugepages", o.hugepages},
                   {"array_layout", o.layout},
                   {"load_average_start", load_before}, {"load_average_end", load_after}};
  report.table.columns = {{"name", "", ""},          {"median_ms", "median ms", "%.2f"},
                          {"min_ms", "min ms", "%.2f"}, {"max_ms", "max ms", "%.2f"},
                          {"spread", "spread", "%.3f"}, {"mparams_per_s", "Mparams/s", "%.0f"},
                          {"gbps", "GB/s", "%.2f"}};
  for (const Series& s : series)
    report.table.rows.push_back({{"name", s.name}, {"median_ms", s.median() * 1e3}, {"min_ms", s.min() * 1e3},
                                 {"max_ms", s.max() * 1e3}, {"spread", (s.max() - s.min()) / s.median()},
                                 {"mparams_per_s", s.params_per_pass ? nlohmann::json(s.params_per_s() / 1e6)
                                                                     : nlohmann::json()},
                                 {"gbps", s.gbps()}, {"min_gbps", s.bytes_per_pass / s.max() / 1e9},
                                 {"max_gbps", s.bytes_per_pass / s.min() / 1e9}});
  const std::string torch_note = torch ? ", torch " + torch->info().value("torch", std::string("?")) : "";
  const std::string ds_note = deepspeed_note(torch);
  report.print_human = [series, torch_note, ds_note, load_before, load_after](std::FILE* out) {
    print_optimizer_table(out, series, torch_note, ds_note, load_before, load_after);
  };
  // The fields `strata bench optimizer --json` has always had.
  nlohmann::json& j = report.extra;
  j["params"] = n;
  j["threads"] = threads;
  j["reps"] = o.reps;
  j["variant"] = variant == AdamVariant::AdamW ? "adamw" : "adam";
  j["half"] = o.half;
  j["grad"] = precision_name(c.grad());
  j["isa"] = to_string(c.isa());
  j["hugepages"] = o.hugepages;
  j["array_layout"] = o.layout;
  j["prefetch"] = to_string(c.prefetch());
  j["cpu"] = cpu_model();
  j["load_average_before"] = load_before;
  j["load_average_after"] = load_after;
  j["adam_bytes_per_param"] = adam_bytes_per_param(c.grad(), c.half());
  j["triad_bytes_per_element"] = kTriadBytesPerElement;
  j["triad_elements"] = c.triad_elements();
  if (torch) j["torch"] = torch->info();
  for (const Series& s : series) {
    nlohmann::json r;
    r["seconds"] = s.seconds;
    r["median_s"] = s.median();
    r["min_s"] = s.min();
    r["max_s"] = s.max();
    r["gb_per_s"] = s.gbps();
    if (s.params_per_pass) r["params_per_s"] = s.params_per_s();
    j["results"][s.name] = r;
  }
  j["ratios"] = ratios;
  return report;
}

int run_optimizer(const OptimizerOptions& o, const std::string& command) {
  check_output_options(o.out, {{o.python, "--python"}, {o.torch_script, "--torch-script"}});
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  Contenders contenders(o, threads);
  std::vector<Series> series = make_series(contenders, adam_config(o).variant);

  const double load_before = load_average();
  Progress progress("strata bench optimizer");
  progress.show("warm-up");
  contenders.round();  // warm-up: page tables, torch's first allocations
  for (unsigned r = 0; r < o.reps; ++r) {
    progress.show("rep " + std::to_string(r + 1) + "/" + std::to_string(o.reps));
    record(series, contenders.round());
  }
  progress.done();
  const double load_after = load_average();

  emit(optimizer_report(o, contenders, threads, series, load_before, load_after, command), o.out);
  return 0;
}

}  // namespace

void add_optimizer(CLI::App& bench, Runner& run) {
  auto opts = std::make_shared<OptimizerOptions>();
  auto* cmd = bench.add_subcommand("optimizer", "Fused CPU Adam against PyTorch's Adam and a STREAM triad, in one run");
  cmd->add_option("--params", opts->params, "parameters (elements) per step")->capture_default_str()->check(
      CLI::Validator([](std::string& v) { return v != "0" && v.find('-') == std::string::npos ? std::string()
                                                 : "--params must be at least 1 (elements per step)"; },
                     "POSITIVE"));
  cmd->add_option("--threads", opts->threads, "threads for every contender; 0: all cores")->capture_default_str();
  cmd->add_option("--reps", opts->reps, "timed repetitions of each")->capture_default_str()->check(CLI::Range(1u, 1000u));
  cmd->add_option("--isa", opts->isa, "CpuAdam kernel: auto, scalar, avx2, avx512")->capture_default_str();
  cmd->add_option("--prefetch", opts->prefetch, "CpuAdam's software prefetch: auto (l1 on Intel, off elsewhere), off, l1")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "off", "l1"}));
  cmd->add_option("--variant", opts->variant, "adam (L2 decay) or adamw (decoupled)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adam", "adamw"}));
  cmd->add_option("--half", opts->half, "16-bit copy written by CpuAdam: none, bf16, fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  cmd->add_option("--grad", opts->grad,
                  "gradient type CpuAdam reads: f32, bf16, fp16 (PyTorch is always given fp32 gradients)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "fp16"}));
  cmd->add_flag("--hugepages", opts->hugepages, "ask for transparent huge pages for Strata's and the triad's arrays");
  cmd->add_flag("!--no-torch", opts->torch, "skip the PyTorch reference (and DeepSpeed's, which runs in it)");
  cmd->add_flag("!--no-deepspeed", opts->deepspeed,
                "skip DeepSpeedCPUAdam (run by default when --python can load its op; scripts/setup-deepspeed-op.sh)");
  cmd->add_option("--array-layout", opts->layout,
                  "where CpuAdam's arrays lie: staggered (a page apart) or power-of-two (2^k apart)")
      ->capture_default_str()
      ->check(CLI::IsMember({"staggered", "power-of-two"}));
  cmd->add_option("--python", opts->python, "Python with PyTorch")->capture_default_str();
  cmd->add_option("--torch-script", opts->torch_script, "the PyTorch reference script")->capture_default_str();
  add_output_options(*cmd, opts->out, "GB/s of each contender, with min-max bars");
  cmd->callback([&run, opts, cmd] {
    run = [opts, c = command_line(*cmd, "strata bench optimizer")] { return run_optimizer(*opts, c); };
  });
}

}  // namespace strata::bench
