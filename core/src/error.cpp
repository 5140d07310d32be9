#include "strata/core/error.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace strata {

namespace {
std::atomic<int> g_rank{0};

std::string io_message(const std::string& what, const std::string& path, uint64_t offset,
                       uint64_t length, int err, const std::string& on_full) {
  std::ostringstream os;
  os << what << ": " << std::strerror(err) << " (errno " << err << ") on " << path << " at offset "
     << offset << ", length " << length;
  if (err == ENOSPC || err == EDQUOT) os << "; the disk is full: " << on_full;
  return os.str();
}
}  // namespace

IoError::IoError(const std::string& what, std::string path, uint64_t offset, uint64_t length, int err,
                 const std::string& on_full)
    : Error(io_message(what, path, offset, length, err, on_full)),
      path_(std::move(path)),
      offset_(offset),
      length_(length),
      err_(err) {}

void set_process_rank(int rank) { g_rank.store(rank); }
int process_rank() { return g_rank.load(); }

void fatal(const char* file, int line, std::string_view msg) {
  std::fprintf(stderr, "strata: fatal [rank %d] %s:%d: %.*s\n", process_rank(), file, line,
               static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}

void fail_call(const char* kind, const char* call, long code, const std::string& detail,
               const char* file, int line) {
  std::ostringstream os;
  os << call << " failed: " << detail << " (" << kind << " code " << code << ")";
  fatal(file, line, os.str());
}

std::string format_bytes(uint64_t bytes, ByteStyle style) {
  static const char* full_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  static const char* compact_units[] = {"", "K", "M", "G"};
  static const int compact_decimals[] = {0, 0, 1, 2};
  const bool compact = style == ByteStyle::Compact;
  // Compact keeps to K..G so that a column of them reads at a glance.
  const int lowest = compact ? 1 : 0, highest = compact ? 3 : 5;
  double v = static_cast<double>(bytes);
  for (int i = 0; i < lowest; ++i) v /= 1024.0;
  int u = lowest;
  while (v >= 1024.0 && u < highest) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (compact)
    std::snprintf(buf, sizeof buf, "%.*f%s", compact_decimals[u], v, compact_units[u]);
  else if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, full_units[u]);
  return buf;
}

}  // namespace strata
