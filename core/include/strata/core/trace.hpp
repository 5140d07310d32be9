// The trace recorder: spans of work on named lanes, written as Chrome trace-event JSON
// (open it in https://ui.perfetto.dev or chrome://tracing). One process is one rank:
// pid = rank, and each lane is a thread row.
//
// Lanes used across Strata:
//   "compute"      the model's kernels (sim: every Stream::compute)
//   "copy:h2d", "copy:d2h", "copy:d2d"   stream copies (sim)
//   "nvme:read", "nvme:write"            NVMe transfers (sim)
//   "collectives"  all_gather, reduce_scatter, all_reduce (sim)
//   "optimizer"    the CPU optimizer, one span per sub-group (engine, every backend)
//   "wait"         the engine's thread blocked on data: the exposed transfer time is the
//                  sum of these spans (engine, every backend)
//   "gather"       a stage-3 all_gather from its issue until the engine saw it complete
//                  (engine, every backend)
// Times are seconds on the device's clock (Device::now()): steady time on cpu and cuda,
// virtual time on sim.
//
// Tracing costs one atomic load per span site when it is off: callers test active()
// before building names.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace strata::trace {

struct Span {
  std::string lane;
  std::string name;
  double begin_s = 0;  // seconds, device clock
  double end_s = 0;    // seconds, >= begin_s
};

// Thread-safe: any thread may record.
class Recorder {
 public:
  explicit Recorder(int pid = 0) : pid_(pid) {}
  void record(std::string_view lane, std::string_view name, double begin_s, double end_s);
  std::vector<Span> spans() const;  // in the order recorded
  size_t size() const;
  // {"traceEvents": [...], "displayTimeUnit": "ms"}: one complete ("X") event per span,
  // timestamps in microseconds, plus process and thread names.
  void write_json(std::ostream& os) const;
  // Writes the JSON to a file, whole or not at all (ReplacingFile: an earlier trace there
  // stays as it was when the write fails); throws IoError naming the path when it cannot.
  void write_json(const std::string& path) const;

 private:
  int pid_;
  mutable std::mutex mu_;
  std::vector<Span> spans_;
};

// The recorder spans go to, or null when tracing is off.
Recorder* active();
// Makes r the active recorder (null: off); returns the one it replaces.
Recorder* set_active(Recorder* r);

// Records into the active recorder, if there is one.
inline void span(std::string_view lane, std::string_view name, double begin_s, double end_s) {
  if (Recorder* r = active()) r->record(lane, name, begin_s, end_s);
}

}  // namespace strata::trace
