// FaultPlan and the fault backend: a decorator of the raw backend that fails or shortens
// the ops the plan picks, below the engine, so the engine's handling of real failures
// (resubmission, retries, errors naming path/offset/length) is what gets tested.
#include "strata/offload/fault_injection.hpp"

#include <algorithm>
#include <vector>

#include "strata/core/error.hpp"

namespace strata {

FaultPlan& FaultPlan::add(FaultRule rule) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(Live{std::move(rule), 0});
  return *this;
}

FaultPlan& FaultPlan::fail_nth(FaultTarget t, uint64_t n, int error) {
  return add({.target = t, .first = n, .count = 1, .action = FaultAction::Fail, .error = error});
}

FaultPlan& FaultPlan::fail_from(FaultTarget t, uint64_t n, int error) {
  return add({.target = t, .first = n, .count = FaultRule::kEveryOp, .action = FaultAction::Fail, .error = error});
}

FaultPlan& FaultPlan::fail_if(FaultTarget t, std::function<bool(const FaultOpInfo&)> pred, int error) {
  return add({.target = t, .predicate = std::move(pred), .first = 0, .count = FaultRule::kEveryOp,
              .action = FaultAction::Fail, .error = error});
}

FaultPlan& FaultPlan::short_nth(FaultTarget t, uint64_t n, double fraction) {
  return add({.target = t, .first = n, .count = 1, .action = FaultAction::Short, .fraction = fraction});
}

FaultDecision FaultPlan::decide(const FaultOpInfo& op) {
  constexpr uint64_t kUnit = 4096;  // short lengths stay O_DIRECT-aligned on any file system
  std::lock_guard<std::mutex> lock(mu_);
  ++ops_;
  const Live* chosen = nullptr;
  for (auto& l : rules_) {
    const FaultRule& r = l.rule;
    bool dir_ok = r.target == FaultTarget::Any || (r.target == FaultTarget::Reads) == (op.dir == IoDir::Read);
    if (!dir_ok || (r.predicate && !r.predicate(op))) continue;
    uint64_t idx = l.matched++;
    bool in_window = idx >= r.first && (r.count == FaultRule::kEveryOp || idx - r.first < r.count);
    if (in_window && !chosen) chosen = &l;
  }
  FaultDecision d;
  if (!chosen) return d;
  const FaultRule& r = chosen->rule;
  if (r.action == FaultAction::Fail) {
    d.action = FaultAction::Fail;
    d.error = r.error;
  } else if (r.action == FaultAction::Short) {
    uint64_t keep = static_cast<uint64_t>(static_cast<double>(op.length) * std::clamp(r.fraction, 0.0, 1.0));
    keep = keep / kUnit * kUnit;
    if (keep == 0 || keep >= op.length) return d;  // too small to shorten and stay aligned
    d.action = FaultAction::Short;
    d.bytes = static_cast<uint32_t>(keep);
  }
  ++injected_;
  return d;
}

FaultPlan& FaultPlan::fail_uring_call(UringCall call, uint64_t first, uint64_t count, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  uring_rules_.push_back(UringRule{call, first, count, error});
  return *this;
}

int FaultPlan::uring_call_error(UringCall call) {
  std::lock_guard<std::mutex> lock(mu_);
  int err = 0;
  for (auto& r : uring_rules_) {
    if (r.call != call) continue;
    uint64_t idx = r.seen++;
    if (!err && idx >= r.first && idx - r.first < r.count) err = r.error;
  }
  if (err) ++injected_;
  return err;
}

uint64_t FaultPlan::ops_seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_;
}

uint64_t FaultPlan::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

namespace {

class FaultBackend final : public IoBackend {
 public:
  FaultBackend(std::unique_ptr<IoBackend> inner, std::shared_ptr<FaultPlan> plan)
      : inner_(std::move(inner)), plan_(std::move(plan)) {
    STRATA_CHECK(inner_ && plan_, "fault backend needs a backend and a plan");
  }

  const char* name() const override { return inner_->name(); }
  bool sqpoll() const override { return inner_->sqpoll(); }
  void set_files(const std::vector<int>& fds, std::vector<std::string>* notes) override {
    inner_->set_files(fds, notes);
  }
  unsigned buffer_slots() const override { return inner_->buffer_slots(); }
  int set_buffer(unsigned slot, void* base, uint64_t bytes) override { return inner_->set_buffer(slot, base, bytes); }

  void queue(const RawOp& op) override {
    FaultDecision d = plan_->decide(FaultOpInfo{op.dir, op.file, op.offset, op.len});
    switch (d.action) {
      case FaultAction::Pass:
        inner_->queue(op);
        break;
      case FaultAction::Fail:
        failed_.push_back(RawCompletion{op.tag, -static_cast<int64_t>(d.error)});
        break;
      case FaultAction::Short: {
        RawOp shorter = op;
        shorter.len = d.bytes;
        inner_->queue(shorter);
        break;
      }
    }
  }

  void submit(unsigned wait_for) override {
    const unsigned ready = static_cast<unsigned>(std::min<size_t>(failed_.size(), wait_for));
    inner_->submit(wait_for - ready);
  }

  size_t reap(RawCompletion* out, size_t max) override {
    size_t n = std::min(max, failed_.size());
    std::copy_n(failed_.begin(), n, out);
    failed_.erase(failed_.begin(), failed_.begin() + static_cast<ptrdiff_t>(n));
    return n + inner_->reap(out + n, max - n);
  }

  void wake() override { inner_->wake(); }

 private:
  std::unique_ptr<IoBackend> inner_;
  std::shared_ptr<FaultPlan> plan_;
  std::vector<RawCompletion> failed_;  // injected failures, completed at the next reap
};

}  // namespace

std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner, std::shared_ptr<FaultPlan> plan) {
  return std::make_unique<FaultBackend>(std::move(inner), std::move(plan));
}

}  // namespace strata
