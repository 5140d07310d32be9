#include "strata/core/event.hpp"

#include <algorithm>

#include "strata/core/sim.hpp"

namespace strata {

std::exception_ptr Event::result() const {
  if (!impl_) return nullptr;
  sim::ScopedNow keep(sim::now());  // asking how it ended is not waiting for it
  try {
    impl_->wait();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

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

std::pair<Event, std::shared_ptr<HostEvent>> HostEvent::make(DeviceWait how) {
  auto impl = std::make_shared<HostEvent>(how);
  return {Event(impl), impl};
}

Event when_all(std::vector<Event> events) {
  std::vector<Event> parts;
  double latest = -1.0;  // of the sim parts that succeeded
  for (Event& e : events) {
    detail::EventImpl* impl = e.impl();
    if (impl == nullptr) continue;
    const double t = impl->virtual_time();
    if (t >= 0 && !e.result()) {
      latest = std::max(latest, t);
      continue;
    }
    if (t < 0 && impl->ready() && !e.result()) continue;  // nothing left to wait for
    parts.push_back(std::move(e));
  }
  if (latest >= 0) parts.push_back(sim::event_at(latest));
  if (parts.empty()) return Event();
  if (parts.size() == 1) return parts[0];
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
    bool for_each_part(const std::function<void(Event&, bool)>& fn) override {
      for (auto& p : parts) fn(p, false);
      return true;
    }
    double virtual_time() override {  // the latest, when every part is a sim event
      double t = 0;
      for (auto& p : parts) {
        const double pt = p.impl()->virtual_time();
        if (pt < 0) return -1.0;
        t = std::max(t, pt);
      }
      return t;
    }
  };
  auto j = std::make_shared<Joined>();
  j->parts = std::move(parts);
  return Event(j);
}

Event when_done(Event e) {
  detail::EventImpl* impl = e.impl();
  if (impl == nullptr) return Event();
  if (impl->virtual_time() >= 0) return sim::event_at(impl->virtual_time());
  if (impl->ready()) return Event();
  struct Done final : detail::EventImpl {
    Event inner;
    void wait() override {
      try {
        inner.wait();
      } catch (...) {
      }
    }
    bool ready() override { return inner.ready(); }
    bool for_each_part(const std::function<void(Event&, bool)>& fn) override {
      fn(inner, true);
      return true;
    }
  };
  auto d = std::make_shared<Done>();
  d->inner = std::move(e);
  return Event(d);
}

}  // namespace strata
