// Checks on weight values where they enter or change type (docs/checkpoints.md, "Weights
// that cannot be used"): non-finite values, and narrowing conversions (fp32 to bf16 or
// fp16) whose values the narrower type cannot hold. Every narrowing of weights (export,
// import, a checkpoint or initial values loaded into a 16-bit run or C API runtime) goes
// through check_range or narrow_from_f32, so none overflows to inf silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/core/dtype.hpp"

namespace strata {

// What a narrowing conversion does with a finite value beyond the target type's range
// (one that would round to +-inf): refuse it, the default everywhere, or, where the user
// asks for it by name (--clamp, strata.out_of_range), clamp it to the largest finite
// value of its sign.
enum class OutOfRange { Refuse, Clamp };

// The largest finite value of t: F32 3.40282e+38, BF16 3.38953e+38, F16 65504.
double largest_finite(DType t);

// The range check before fp32 values x[0, n) are rounded to t. A finite value t cannot
// hold is, with Refuse, a ConfigError naming `what` (e.g. "tensor 'h.0.mlp.c_fc.weight'"),
// how many there are, the largest in magnitude with its flat index (first_index + its
// position in x), t's limit, and then `fix`; with Clamp it becomes +-largest_finite(t),
// in place. NaN and inf are left alone (check_finite's). Returns the values clamped.
uint64_t check_range(float* x, size_t n, DType t, OutOfRange mode, const std::string& what, const std::string& fix,
                     uint64_t first_index = 0);

// dst[i] = t(src[i]) rounded to nearest even, after check_range (on a copy: src is not
// changed). F32 copies.
void narrow_from_f32(void* dst, DType t, const float* src, size_t n, OutOfRange mode, const std::string& what,
                     const std::string& fix);

// Weights must be finite: a NaN or inf in x[0, n) is a ConfigError naming `what`, the
// first such value and its flat index (first_index + its position), how many there are,
// and then `fix`.
void check_finite(const float* x, size_t n, const std::string& what, const std::string& fix, uint64_t first_index = 0);

}  // namespace strata
