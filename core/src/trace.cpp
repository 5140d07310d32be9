#include "strata/core/trace.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <ostream>

#include "strata/core/error.hpp"
#include "strata/core/output_file.hpp"
#include "strata/core/safe_io.hpp"

namespace strata::trace {

namespace {

constexpr const char* kTraceFull = "free space on it or point strata.trace (or --trace) at a disk with room";

std::atomic<Recorder*> g_active{nullptr};

void write_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (char c : s) {
    switch (c) {
      case '"': os << "\\\""; break;
      case '\\': os << "\\\\"; break;
      case '\n': os << "\\n"; break;
      case '\t': os << "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          os << buf;
        } else {
          os << c;
        }
    }
  }
  os << '"';
}

// Microseconds with nanosecond resolution, in a form every JSON reader accepts.
void write_us(std::ostream& os, double seconds) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e6);
  os << buf;
}

}  // namespace

void Recorder::record(std::string_view lane, std::string_view name, double begin_s, double end_s) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(Span{std::string(lane), std::string(name), begin_s, end_s < begin_s ? begin_s : end_s});
}

std::vector<Span> Recorder::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

size_t Recorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_.size();
}

void Recorder::write_json(std::ostream& os) const {
  std::vector<Span> spans = this->spans();
  // Lanes get thread ids in a fixed order (the usual ones first), so traces of two runs
  // line up row by row.
  static const char* const kOrder[] = {"compute", "wait", "gather", "collectives", "copy:h2d", "copy:d2h",
                                       "copy:d2d", "nvme:read", "nvme:write", "optimizer"};
  std::map<std::string, int> tid;
  int next = 1;
  for (const char* l : kOrder)
    for (const Span& s : spans)
      if (s.lane == l) {
        tid.emplace(l, next++);
        break;
      }
  for (const Span& s : spans)
    if (tid.emplace(s.lane, next).second) ++next;

  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid_ << ",\"tid\":0,\"args\":{\"name\":\"rank "
     << pid_ << "\"}}";
  for (const auto& [lane, id] : tid) {
    os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid_ << ",\"tid\":" << id << ",\"args\":{\"name\":";
    write_string(os, lane);
    os << "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" << pid_ << ",\"tid\":" << id
       << ",\"args\":{\"sort_index\":" << id << "}}";
  }
  for (const Span& s : spans) {
    os << ",\n{\"name\":";
    write_string(os, s.name);
    os << ",\"cat\":";
    write_string(os, s.lane);
    os << ",\"ph\":\"X\",\"ts\":";
    write_us(os, s.begin_s);
    os << ",\"dur\":";
    write_us(os, s.end_s - s.begin_s);
    os << ",\"pid\":" << pid_ << ",\"tid\":" << tid[s.lane] << "}";
  }
  os << "\n]}\n";
}

void Recorder::write_json(const std::string& path) const {
  check_output_path(path, "the trace file");  // never a device, a FIFO or a checkpoint's file
  // Whole or not at all: a full disk leaves the earlier trace, not a cut one.
  ReplacingFile f(path, "the trace file", kTraceFull);
  write_json(f.stream());
  f.commit();
}

Recorder* active() { return g_active.load(std::memory_order_acquire); }

Recorder* set_active(Recorder* r) { return g_active.exchange(r, std::memory_order_acq_rel); }

}  // namespace strata::trace
