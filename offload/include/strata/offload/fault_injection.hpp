// Fault injection under the I/O engine, so that tests reach the failures a healthy disk
// never gives (EIO, ENOSPC, EAGAIN, short transfers, refused io_uring calls).
// A FaultPlan is a list of rules; the fault backend (a decorator of the raw backend,
// io_engine.hpp) asks it about every op before the op reaches the real backend:
//  - Fail: the op never reaches the disk and completes with -error (EIO, ENOSPC, or
//    EAGAIN/EINTR to exercise retries).
//  - Short: the op goes to the disk with fewer bytes (`fraction` of them, rounded down
//    to 4 KiB so O_DIRECT accepts it) and completes short, as a real short transfer
//    would; the engine must resubmit the rest.
// Ops are counted per rule among the ops the rule matches (direction and predicate),
// from 0, including the engine's own resubmissions. The first rule in order whose
// window holds an op acts on it. Thread-safe: every ring of an engine shares a plan.
#pragma once

#include <cerrno>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "strata/offload/io_engine.hpp"

namespace strata {

enum class FaultTarget : uint8_t { Reads, Writes, Any };
enum class FaultAction : uint8_t { Pass, Fail, Short };

// What a rule's predicate sees of an op.
struct FaultOpInfo {
  IoDir dir = IoDir::Read;
  unsigned file = 0;     // index among the engine's files
  uint64_t offset = 0;   // bytes into the file
  uint64_t length = 0;   // bytes
};

struct FaultRule {
  static constexpr uint64_t kEveryOp = UINT64_MAX;
  FaultTarget target = FaultTarget::Any;
  std::function<bool(const FaultOpInfo&)> predicate;  // optional: only ops it accepts match
  uint64_t first = 0;               // index of the first matching op to hit (0-based)
  uint64_t count = 1;               // matching ops hit from `first` on; kEveryOp: all later ones
  FaultAction action = FaultAction::Fail;
  int error = EIO;                  // Fail: the op completes with -error
  double fraction = 0.5;            // Short: share of the bytes that really move
};

struct FaultDecision {
  FaultAction action = FaultAction::Pass;
  int error = 0;        // Fail
  uint32_t bytes = 0;   // Short: bytes to really move
};

// The io_uring backend's own calls a plan can fail. The call is not made; the backend
// sees -error as the kernel's answer, so its retries, fall-backs and fatal errors for
// each answer are what gets tested.
enum class UringCall : uint8_t {
  Submit,          // the submit call of IoBackend::submit (io_uring_submit*)
  WaitCqe,         // the bounded wait after the kernel answered EAGAIN/EBUSY to a submit
  RegisterFiles,   // io_uring_register_files
  RegisterBuffer,  // io_uring_register_buffers_update_tag (registering or clearing a slot)
  RegisterRingFd,  // io_uring_register_ring_fd
};

struct FaultPlan {
  // The nth matching op (0-based) fails with `error`.
  FaultPlan& fail_nth(FaultTarget t, uint64_t n, int error = EIO);
  // Every matching op from the nth on fails.
  FaultPlan& fail_from(FaultTarget t, uint64_t n, int error = EIO);
  // Every op the predicate accepts fails.
  FaultPlan& fail_if(FaultTarget t, std::function<bool(const FaultOpInfo&)> pred, int error = EIO);
  // The nth matching op moves only `fraction` of its bytes.
  FaultPlan& short_nth(FaultTarget t, uint64_t n, double fraction = 0.5);
  FaultPlan& add(FaultRule rule);
  // Calls `call` number first..first+count-1 (0-based, per call kind, every ring of the
  // engine counted together) return -error without being made.
  FaultPlan& fail_uring_call(UringCall call, uint64_t first, uint64_t count, int error);

  // Makes io_uring setup fail as if the kernel refused it (tests the fallback).
  bool refuse_uring = false;

  FaultDecision decide(const FaultOpInfo& op);  // called by the fault backend per op
  int uring_call_error(UringCall call);          // called by the io_uring backend: 0 or the errno
  uint64_t ops_seen() const;   // ops decided on
  uint64_t injected() const;   // ops failed or shortened, and io_uring calls failed

 private:
  struct Live {
    FaultRule rule;
    uint64_t matched = 0;  // matching ops seen so far
  };
  mutable std::mutex mu_;
  std::vector<Live> rules_;
  struct UringRule {
    UringCall call;
    uint64_t first, count;
    int error;
    uint64_t seen = 0;  // calls of this kind so far
  };
  std::vector<UringRule> uring_rules_;
  uint64_t ops_ = 0;
  uint64_t injected_ = 0;
};

}  // namespace strata
