// Events: the one way asynchronous work reports completion. Readers wait on events,
// never poll (DESIGN.md, memory manager contract). An event that completes with an
// error rethrows it from wait(), so a failed read can never be mistaken for good data.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace strata {

namespace detail {
// Backend-specific completion state. The host implementation below serves the cpu
// backend, the I/O engine and anything else that completes on a host thread.
class EventImpl {
 public:
  virtual ~EventImpl() = default;
  virtual void wait() = 0;    // blocks until complete; rethrows the error if it failed
  virtual bool ready() = 0;   // complete (successfully or not)
};
}  // namespace detail

class Event {
 public:
  Event() = default;  // a default event is already complete
  explicit Event(std::shared_ptr<detail::EventImpl> impl) : impl_(std::move(impl)) {}

  void wait() const {
    if (impl_) impl_->wait();
  }
  bool ready() const { return !impl_ || impl_->ready(); }
  detail::EventImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<detail::EventImpl> impl_;
};

// A completion flag set from a host thread, with an optional error and callbacks.
class HostEvent final : public detail::EventImpl {
 public:
  void wait() override;
  bool ready() override;
  // Completes the event; error may be null. Runs callbacks registered with then().
  void complete(std::exception_ptr error = nullptr);
  // Runs fn(error) on completion (immediately, on this thread, if already complete).
  void then(std::function<void(std::exception_ptr)> fn);
  std::exception_ptr error();

  static std::pair<Event, std::shared_ptr<HostEvent>> make();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
};

// An event that completes when all of the given events have; the first error wins.
Event when_all(std::vector<Event> events);

}  // namespace strata
