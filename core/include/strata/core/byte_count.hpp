// Byte counts as users write them: the one parser behind every configuration key and
// command-line flag that takes a size (strata.*_budget, `export --shard-size`, `plan
// --hbm`, the benches' sizes), so that "5G" means the same wherever it is given.
//
// A count is a decimal number, with an optional fraction and exponent ("1.5", "1e9"),
// and an optional unit, in any case, optionally after spaces:
//   B                                  bytes
//   KB, MB, GB, TB                     powers of 1000 (the SI prefixes, as disks are sold)
//   K, M, G, T; Ki, Mi, Gi, Ti;        powers of 1024 (dd's single letters, and the IEC
//   KiB, MiB, GiB, TiB                 prefixes, as memory is sized)
// The result is rounded to the nearest byte. Anything else (a sign, a unit not above, a
// count above kMaxByteCount) is a ConfigError that names the key or flag, the text, the
// problem and the forms accepted or the limit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

inline constexpr uint64_t kMaxByteCount = UINT64_MAX;  // bytes: 2^64 - 1, 16 EiB

// The units in one phrase, for help texts.
inline constexpr const char* kByteCountUnits =
    "B; KB, MB, GB, TB in powers of 1000; K, M, G, T, KiB, MiB, GiB, TiB in powers of 1024; any case";
// What a byte count may be, for key listings and error messages: "a byte count: a whole
// number, or a number and a unit such as ... (<kByteCountUnits>)".
std::string byte_count_forms();

// `what` names the key or flag ("strata.device_budget", "--shard-size"); messages start
// `<what> = "<text>"`.
uint64_t parse_byte_count(std::string_view text, const std::string& what);

// "is too large: a byte count is at most 18446744073709551615 (2^64 - 1 bytes, 16 EiB)",
// for a count given as a number elsewhere (a JSON number) that does not fit.
std::string byte_count_too_large_text();

}  // namespace strata
