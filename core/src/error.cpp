#include "strata/core/error.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace strata {

namespace {
std::atomic<int> g_rank{0};

std::string io_message(const std::string& what, const std::string& path, uint64_t offset,
                       uint64_t length, int err) {
  std::ostringstream os;
  os << what << ": " << std::strerror(err) << " (errno " << err << ") on " << path << " at offset "
     << offset << ", length " << length;
  if (err == ENOSPC) os << "; the disk is full: free space on it or point nvme_path elsewhere";
  return os.str();
}
}  // namespace

IoError::IoError(const std::string& what, std::string path, uint64_t offset, uint64_t length, int err)
    : Error(io_message(what, path, offset, length, err)),
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

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace strata
