#include "strata/core/event.hpp"

namespace strata {

void HostEvent::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool HostEvent::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::exception_ptr HostEvent::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void HostEvent::complete(std::exception_ptr error) {
  std::vector<std::function<void(std::exception_ptr)>> cbs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = error;
    cbs.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& cb : cbs) cb(error);
}

void HostEvent::then(std::function<void(std::exception_ptr)> fn) {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    err = error_;
  }
  fn(err);
}

std::pair<Event, std::shared_ptr<HostEvent>> HostEvent::make() {
  auto impl = std::make_shared<HostEvent>();
  return {Event(impl), impl};
}

Event when_all(std::vector<Event> events) {
  std::erase_if(events, [](const Event& e) { return e.impl() == nullptr; });
  if (events.empty()) return Event();
  if (events.size() == 1) return events[0];
  // Parts may be of different backends, so the joined event waits on each in turn.
  struct Joined final : detail::EventImpl {
    std::vector<Event> parts;
    void wait() override {
      std::exception_ptr first;
      for (auto& p : parts) {
        try {
          p.wait();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
      if (first) std::rethrow_exception(first);
    }
    bool ready() override {
      for (auto& p : parts)
        if (!p.ready()) return false;
      return true;
    }
  };
  auto j = std::make_shared<Joined>();
  j->parts = std::move(events);
  return Event(j);
}

}  // namespace strata
