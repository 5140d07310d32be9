// Events: the one way asynchronous work reports completion. Readers wait on events,
// never poll: a wait costs no CPU, and on the sim backend waiting is what moves a
// thread's virtual clock (sim.hpp). An event that completes with an error rethrows it
// from wait(), so a failed read can never be mistaken for good data.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace strata {

class Event;

namespace detail {
// Backend-specific completion state. The host implementation below serves the cpu
// backend, the I/O engine and anything else that completes on a host thread.
class EventImpl {
 public:
  virtual ~EventImpl() = default;
  virtual void wait() = 0;    // blocks until complete; rethrows the error if it failed
  virtual bool ready() = 0;   // complete (successfully or not)
  // The sim backend's events complete at a point of simulated time (seconds, >= 0) and
  // are always ready in real time; events that complete in real time return -1.
  virtual double virtual_time() { return -1.0; }
  // For composite events (when_all, when_done): calls fn on each part, with `fence` true
  // when the part's error does not count (when_done), and returns true; false for a
  // plain event. A device stream uses it to wait on its own kind of events natively
  // instead of blocking in a host callback (where a CUDA call is not allowed).
  virtual bool for_each_part(const std::function<void(Event&, bool fence)>&) { return false; }
  // The cudaEvent_t this event completes with, when it is one (a CUDA stream's or an NCCL
  // collective's), so that a CUDA stream can wait for it on the GPU (cudaStreamWaitEvent)
  // rather than in a host callback, where CUDA and NCCL calls are not allowed. The
  // event's own error, if any, is then seen only by host waits.
  virtual void* cuda_event_handle() { return nullptr; }
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
  // Waits in real time for completion and returns the error (null when it succeeded)
  // without rethrowing. Unlike wait(), it does not advance the calling thread's clock on
  // the sim backend: it asks how an operation ended, it does not depend on it.
  std::exception_ptr result() const;
  detail::EventImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<detail::EventImpl> impl_;
};

// A completion flag set from a host thread, with an optional error and callbacks.
class HostEvent final : public detail::EventImpl {
 public:
  // How a device stream is ordered after the event (cuda_device.cu). Stream: the GPU
  // waits (a CUDA stream holds a hardware queue until the event completes). Host: the
  // thread that orders the stream waits for the event before it issues more, and no GPU
  // queue is held. An event whose completion needs this process's own later GPU work (the
  // staged communicator's copies out of and back into device memory) asks for Host: a
  // stream held on the GPU could hold that work too, where CUDA puts both streams on one
  // hardware queue, and neither would move again. Other backends wait the same either way.
  enum class DeviceWait { Stream, Host };

  HostEvent() = default;
  explicit HostEvent(DeviceWait how) : device_wait_(how) {}
  void wait() override;
  bool ready() override;
  // Completes the event; error may be null. Runs callbacks registered with then().
  void complete(std::exception_ptr error = nullptr);
  // Runs fn(error) on completion (immediately, on this thread, if already complete).
  void then(std::function<void(std::exception_ptr)> fn);
  std::exception_ptr error();

  DeviceWait device_wait() const { return device_wait_; }

  static std::pair<Event, std::shared_ptr<HostEvent>> make(DeviceWait how = DeviceWait::Stream);

 private:
  const DeviceWait device_wait_ = DeviceWait::Stream;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
};

// An event that completes when all of the given events have; the first error wins.
// Parts with nothing left to wait for (default events, real-time events that completed
// without error) are dropped, and sim events are merged into one at the latest time, so
// that joining again and again (a fence over many uses of one buffer) stays small.
Event when_all(std::vector<Event> events);

// Completes when e does, and never fails: for fences, which order uses of memory and
// carry no data (a failed transfer still ends, and the memory is free after it).
Event when_done(Event e);

}  // namespace strata
