// CpuAdam: picks the kernel for this CPU, splits a step over a persistent pool of
// threads, and runs the scalar kernel where no vector one applies.
#include "strata/offload/cpu_adam.hpp"

#include <algorithm>
#include <atomic>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu_adam_kernels.hpp"
#include "strata/core/error.hpp"

namespace strata {

namespace detail {
void adam_kernel_scalar(const math::AdamStepScalars& s, const AdamArrays& a, size_t n, bool) {
  dispatch_adam(a, [&](auto kind, auto grad) { adam_scalar_range<kind.value, grad.value>(s, a, 0, n); });
}
}  // namespace detail

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Auto: return "auto";
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::Auto, CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (name == to_string(isa)) return isa;
  throw ConfigError("unknown CPU ISA '" + name + "': choose auto, scalar, avx2 or avx512");
}

#if defined(__x86_64__)
// F16C (CPUID leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know it.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Auto:
    case CpuIsa::Scalar: return true;
#if defined(__x86_64__)
    case CpuIsa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case CpuIsa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    case CpuIsa::Avx2:
    case CpuIsa::Avx512: return false;
#endif
  }
  return false;
}

const char* to_string(CpuPrefetch prefetch) {
  switch (prefetch) {
    case CpuPrefetch::Auto: return "auto";
    case CpuPrefetch::Off: return "off";
    case CpuPrefetch::L1: return "l1";
  }
  return "?";
}

CpuPrefetch parse_cpu_prefetch(const std::string& name) {
  for (CpuPrefetch p : {CpuPrefetch::Auto, CpuPrefetch::Off, CpuPrefetch::L1})
    if (name == to_string(p)) return p;
  throw ConfigError("unknown CPU prefetch '" + name + "': choose auto, off or l1");
}

namespace {
// CPUID leaf 0's vendor string is "GenuineIntel" (EBX, EDX, ECX).
bool cpu_is_intel() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return std::strcmp(vendor, "GenuineIntel") == 0;
#else
  return false;
#endif
}
}  // namespace

CpuIsa best_cpu_isa() {
  for (CpuIsa isa : {CpuIsa::Avx512, CpuIsa::Avx2})
    if (cpu_supports(isa)) return isa;
  return CpuIsa::Scalar;
}

namespace {
detail::AdamKernel kernel_for(CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case CpuIsa::Avx512: return detail::adam_kernel_avx512;
    case CpuIsa::Avx2: return detail::adam_kernel_avx2;
#endif
    default: return detail::adam_kernel_scalar;
  }
}

// The aliasing step_into allows: each out array is its own in array or touches none of
// the arrays. Anything else would read values another element already overwrote.
void check_no_partial_overlap(const float* params_in, const float* exp_avg_in, const float* exp_avg_sq_in,
                              const AdamGrads& grads, const float* params_out, const float* exp_avg_out,
                              const float* exp_avg_sq_out, size_t n, const void* half_out) {
  struct Range {
    const char* begin;
    size_t bytes;
    bool overlaps(const Range& o) const { return begin < o.begin + o.bytes && o.begin < begin + bytes; }
  };
  auto range = [](const void* p, size_t bytes) { return Range{static_cast<const char*>(p), p ? bytes : 0}; };
  const Range in[] = {range(params_in, n * 4), range(exp_avg_in, n * 4), range(exp_avg_sq_in, n * 4),
                      range(grads.data, n * dtype_size(grads.type))};
  const Range out[] = {range(params_out, n * 4), range(exp_avg_out, n * 4), range(exp_avg_sq_out, n * 4),
                       range(half_out, n * 2)};
  for (size_t o = 0; o < 4; ++o) {
    for (size_t i = 0; i < 4; ++i)
      STRATA_CHECK(!out[o].overlaps(in[i]) || (o < 3 && o == i && out[o].begin == in[i].begin),
                   "CpuAdam: an output array overlaps an input other than its own in-place twin");
    for (size_t p = o + 1; p < 4; ++p)
      STRATA_CHECK(!out[o].overlaps(out[p]), "CpuAdam: two output arrays overlap");
  }
}

// Block boundaries fall on multiples of this many elements: a 64-byte line of the
// 16-bit copy, so no two threads write the same cache line of any array (given
// line-aligned arrays).
constexpr size_t kChunkAlign = 32;
// The largest block a thread takes at a time: 64K elements, 1.75 MiB of traffic at 28
// bytes per parameter, about 30 us of one core here; small enough that a descheduled
// thread leaves little for the others to wait on, large enough that the shared counter is
// touched a few thousand times per 64M-parameter step.
constexpr size_t kMaxBlock = size_t{1} << 16;
}  // namespace

// Workers that wait for a step, each run one part of it, and report back. The calling
// thread runs part 0, so `threads` workers means threads - 1 here.
class CpuAdam::Pool {
 public:
  explicit Pool(unsigned extra_workers) {
    for (unsigned w = 1; w <= extra_workers; ++w) threads_.emplace_back([this, w] { work(w); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs part(i) for i in [0, parts); returns when every part has.
  template <typename Fn>
  void run(unsigned parts, const Fn& part) {
    const std::function<void(unsigned)> job = [&part](unsigned i) { part(i); };
    if (parts > 1) {
      std::lock_guard lock(mu_);
      job_ = &job;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    if (parts > 1) start_cv_.notify_all();
    part(0);
    if (parts > 1) {
      std::unique_lock lock(mu_);
      done_cv_.wait(lock, [this] { return pending_ == 0; });
      job_ = nullptr;
    }
  }

 private:
  void work(unsigned index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(unsigned)>* job;
      {
        std::unique_lock lock(mu_);
        start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= parts_) continue;
        job = job_;
      }
      (*job)(index);
      {
        std::lock_guard lock(mu_);
        if (--pending_ != 0) continue;
      }
      done_cv_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(unsigned)>* job_ = nullptr;  // valid while run() waits
  unsigned parts_ = 0;
  unsigned pending_ = 0;  // parts not yet done, part 0 excluded
  uint64_t generation_ = 0;
  bool stop_ = false;
};

CpuAdam::CpuAdam(const AdamConfig& config, const CpuAdamOptions& options)
    : config_(config),
      isa_(options.isa == CpuIsa::Auto ? best_cpu_isa() : options.isa),
      prefetch_(options.prefetch != CpuPrefetch::Auto ? options.prefetch
                : cpu_is_intel()                      ? CpuPrefetch::L1
                                                      : CpuPrefetch::Off),
      threads_(options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency())),
      min_elements_per_thread_(std::max<size_t>(options.min_elements_per_thread, kChunkAlign)) {
  if (!cpu_supports(isa_))
    throw Unavailable(std::string("CpuAdam: the ") + to_string(isa_) +
                      " kernel was asked for, but this CPU does not support it (best here: " +
                      to_string(best_cpu_isa()) + ")");
  pool_ = std::make_unique<Pool>(threads_ - 1);
}

CpuAdam::~CpuAdam() = default;

void CpuAdam::step_into(int64_t t, const float* params_in, const float* exp_avg_in, const float* exp_avg_sq_in,
                        AdamGrads grads, float* params_out, float* exp_avg_out, float* exp_avg_sq_out, size_t n,
                        void* half_out, HalfKind kind) {
  if (grads.type != DType::F32 && grads.type != DType::BF16 && grads.type != DType::F16)
    throw Error(std::string("CpuAdam: gradients of type ") + to_string(grads.type) +
                "; the optimizer reads float, bfloat16 or float16 gradients");
  STRATA_CHECK(t >= 1, "Adam steps count from 1, got " + std::to_string(t));
  STRATA_CHECK((half_out != nullptr) == (kind != HalfKind::None),
               "a 16-bit output buffer goes with a 16-bit kind, and none with HalfKind::None");
  if (n == 0) return;
  STRATA_CHECK(params_in && exp_avg_in && exp_avg_sq_in && grads.data && params_out && exp_avg_out && exp_avg_sq_out,
               "null array for a non-empty shard");

  check_no_partial_overlap(params_in, exp_avg_in, exp_avg_sq_in, grads, params_out, exp_avg_out, exp_avg_sq_out, n,
                           half_out);

  const math::AdamStepScalars scalars = math::adam_step_scalars(config_, t);
  const detail::AdamArrays arrays{params_in,  grads.data,  grads.type,     grads.scale, exp_avg_in, exp_avg_sq_in,
                                  params_out, exp_avg_out, exp_avg_sq_out, half_out,    kind};
  const detail::AdamKernel kernel = kernel_for(isa_);
  const bool prefetch = prefetch_ == CpuPrefetch::L1;

  const size_t by_size = std::max<size_t>(1, n / min_elements_per_thread_);
  const unsigned parts = static_cast<unsigned>(std::min<size_t>(threads_, by_size));
  // The parts take blocks from a shared counter rather than one equal share each: a core
  // that another process (or the training loop's own threads) holds, or a worker slow to
  // wake, then costs the step only its current block, not its whole share. Blocks of at
  // most kMaxBlock elements (256 KiB of each fp32 array), at least 4 per part, aligned.
  const size_t per_part_quarter = (n + size_t{parts} * 4 - 1) / (size_t{parts} * 4);
  const size_t block =
      std::min(kMaxBlock, (per_part_quarter + kChunkAlign - 1) / kChunkAlign * kChunkAlign);
  const size_t blocks = (n + block - 1) / block;
  std::atomic<size_t> next{0};
  pool_->run(parts, [&](unsigned) {
    for (size_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
      const size_t begin = b * block;
      kernel(scalars, arrays.offset(begin), std::min(n, begin + block) - begin, prefetch);
    }
  });
}

math::AdamStepScalars CpuAdam::scalars(int64_t t) const { return math::adam_step_scalars(config_, t); }

}  // namespace strata
