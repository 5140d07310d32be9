// A model that hands its buffers back with an event of its work still running
// (WeightSource::release_params_after / grads_ready_after), as the cuda GPT does instead
// of synchronising its stream before each hand-back. Here the model's "kernels" run on a
// cpu stream that a gate holds shut while the host issues a pass, so every read of a
// parameter and every write of a gradient happens after the engine was handed the
// buffer back: where the engine wrote gathered memory again, or reduced a gradient, before
// the model's event, the model reads other values or the engine sums unwritten ones, and
// the weights differ from the same run with the model synchronised before each hand-back.
// The gate opens when the host has issued the pass, or, where the host waits for the
// model's work (acquire waits for a gather that memory fenced by the model's reads holds
// back), after a moment; the tests count those waits.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "engine_harness.hpp"
#include "strata/core/device.hpp"
#include "strata/core/event.hpp"

using namespace strata;
using namespace strata::testing_engine;

namespace {

constexpr int kGroups = 4;
constexpr uint64_t kNumel = 4096;

// Holds a stream shut from close() until open(), or until a watchdog opens it when it has
// stayed shut for 20 ms (the host waiting for the model's work); `forced` counts those.
class Gate {
 public:
  Gate() : watchdog_([this] { watch(); }) {}
  ~Gate() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    open();
  }
  void close(Stream& st) {
    auto [ev, host] = HostEvent::make();
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = host;
      since_ = std::chrono::steady_clock::now();
    }
    st.wait(ev);
  }
  void open() {
    std::shared_ptr<HostEvent> h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      h = std::exchange(held_, nullptr);
    }
    if (h) h->complete();
  }
  int forced() const {
    std::lock_guard<std::mutex> lock(mu_);
    return forced_;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(2));
      if (held_ && std::chrono::steady_clock::now() - since_ > std::chrono::milliseconds(20)) {
        ++forced_;
        std::shared_ptr<HostEvent> h = std::exchange(held_, nullptr);
        lock.unlock();
        h->complete();
        lock.lock();
      }
    }
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<HostEvent> held_;
  std::chrono::steady_clock::time_point since_;
  int forced_ = 0;
  bool stop_ = false;
  std::thread watchdog_;
};

struct PassConfig {
  std::string label;
  int stage = 3;
  OffloadDevice param = OffloadDevice::None;
  OffloadDevice optimizer = OffloadDevice::None;
  uint64_t device_budget = 2 << 20;
  int accum = 2;
  // Nothing the engine does within a pass needs the model's work done (stage 1: no
  // collective before step()), so the host issues every pass without waiting. Elsewhere the
  // host waits where the engine's collectives on this backend run on the calling thread (the
  // self communicator waits for `after` there) or a gather lands in memory the model is
  // still reading.
  bool issues_without_waiting = false;
  bool optimizer_on_stream = false;  // the GPU optimizer's path: the update on the engine's stream
};

struct Outcome {
  std::vector<std::vector<float>> weights;
  int releases = 0;  // hand-backs with an event
  int forced = 0;    // passes the host could not issue without the model's work
};

// One rank's engine of a configuration on the cpu backend, and the model's stream, whose
// hand-backs carry its events or follow a synchronisation of the stream.
struct Rig {
  std::unique_ptr<Device> device = make_device({});
  std::unique_ptr<coll::Communicator> comm = coll::make_host_communicator(coll::HostBackend::Self);
  std::unique_ptr<ZeroEngine> engine;
  std::unique_ptr<Stream> st;
  bool events;
  Outcome out;

  Rig(const PassConfig& c, bool events, const std::string& nvme_dir) : events(events) {
    RunSpec spec{.stage = c.stage, .param = c.param, .optimizer = c.optimizer, .accum = c.accum};
    spec.device_budget = c.device_budget;
    spec.optimizer_on_stream = c.optimizer_on_stream;
    const EngineOptions o = test_engine_options(spec, kNumel, nvme_dir);
    std::vector<GroupSpec> groups;
    for (int g = 0; g < kGroups; ++g)
      groups.push_back({"block." + std::to_string(g), kNumel, InitKind::Normal, 0.1f, {}});
    engine = std::make_unique<ZeroEngine>(*device, *comm, *comm, o, groups);
    st = device->create_stream("model");
  }
  void release(int g) {
    if (!events) {
      st->synchronize();
      return engine->release_params(g);
    }
    ++out.releases;
    engine->release_params_after(g, st->record());
  }
  void grads_ready(int g) {
    if (!events) {
      st->synchronize();
      return engine->grads_ready(g);
    }
    engine->grads_ready_after(g, st->record());
  }
  // The weights once the model's work is done, and the passes the gate was forced open.
  Outcome finish(const Gate& gate) {
    st->synchronize();
    for (int g = 0; g < kGroups; ++g) out.weights.push_back(engine->gather_full_params(g));
    out.forced = gate.forced();
    return out;
  }
};

void expect_same_weights(const Outcome& ref, const Outcome& got) {
  ASSERT_EQ(ref.weights.size(), got.weights.size());
  for (size_t g = 0; g < ref.weights.size(); ++g) {
    ASSERT_EQ(ref.weights[g].size(), got.weights[g].size());
    EXPECT_EQ(0, std::memcmp(ref.weights[g].data(), got.weights[g].data(), ref.weights[g].size() * sizeof(float)))
        << "group " << g;
  }
}

// Forward over the groups (each read copied aside), a synchronisation (the GPT's loss),
// backward in reverse (each gradient from the group's values now and in forward), per
// micro-step; `events`: hand-backs with the model's events and its stream gated, else
// the stream synchronised before each plain hand-back.
Outcome run(const PassConfig& c, bool events, int steps, const std::string& nvme_dir) {
  Rig rig(c, events, nvme_dir);
  ZeroEngine& engine = *rig.engine;
  Stream& st = *rig.st;
  std::vector<int> order;
  for (int g = 0; g < kGroups; ++g) order.push_back(g);
  for (int g = kGroups - 1; g >= 0; --g) order.push_back(g);
  engine.set_schedule(order);
  Gate gate;
  std::vector<std::vector<float>> saved(kGroups, std::vector<float>(kNumel));
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < c.accum; ++m) {
      engine.begin_micro_step();
      if (events) gate.close(st);
      for (int g = 0; g < kGroups; ++g) {
        const auto* p = static_cast<const float*>(engine.acquire_params(g));
        st.compute(0, [p, &s = saved[g]] { std::memcpy(s.data(), p, kNumel * sizeof(float)); });
        rig.release(g);
      }
      gate.open();
      st.synchronize();  // the loss
      if (events) gate.close(st);
      for (int g = kGroups - 1; g >= 0; --g) {
        const auto* p = static_cast<const float*>(engine.acquire_params(g));
        auto* grad = static_cast<float*>(engine.gradient_buffer(g));
        st.compute(0, [p, grad, &s = saved[g], g, step, m] {
          for (uint64_t i = 0; i < kNumel; ++i) {
            const float target = 0.05f * static_cast<float>((i * 7 + static_cast<uint64_t>(g * 13 + step + m)) % 17) - 0.4f;
            grad[i] = (p[i] - target) + 0.25f * s[i];
          }
        });
        rig.release(g);
        rig.grads_ready(g);
      }
      gate.open();
    }
    engine.step();
  }
  return rig.finish(gate);
}

// The model reads a group's parameters after handing its gradient back (as a model may
// that keeps a value of the weights for later), and releases them only then, with the
// read's event: the engine's fence on the parameters is that event alone, as the
// gradient's event comes before the read. The last group's late read is held behind the
// gate across step(), so an engine that wrote the parameters (the optimizer, in place, or a
// gather into the memory) before it would give that read the new values; the late reads
// feed the next step's gradients.
Outcome run_late_read(const PassConfig& c, bool events, int steps, const std::string& nvme_dir) {
  Rig rig(c, events, nvme_dir);
  ZeroEngine& engine = *rig.engine;
  Stream& st = *rig.st;
  Gate gate;
  std::vector<std::vector<float>> late(kGroups, std::vector<float>(kNumel, 0.0f));
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < c.accum; ++m) {
      engine.begin_micro_step();
      for (int g = kGroups - 1; g >= 0; --g) {
        const auto* p = static_cast<const float*>(engine.acquire_params(g));
        auto* grad = static_cast<float*>(engine.gradient_buffer(g));
        st.compute(0, [p, grad, &l = late[g], g, step, m] {
          for (uint64_t i = 0; i < kNumel; ++i) {
            const float target = 0.05f * static_cast<float>((i * 5 + static_cast<uint64_t>(g * 11 + step + m)) % 13) - 0.3f;
            grad[i] = (p[i] - target) + 0.5f * l[i];
          }
        });
        rig.grads_ready(g);
        if (events && g == 0 && m == c.accum - 1) gate.close(st);
        st.compute(0, [p, &l = late[g]] {
          for (uint64_t i = 0; i < kNumel; ++i) l[i] = 0.5f * l[i] + p[i];
        });
        rig.release(g);
      }
    }
    engine.step();
    gate.open();
  }
  return rig.finish(gate);
}

}  // namespace

TEST(EngineEvents, HandBacksAfterTheModelsEventsGiveTheSynchronisedWeights) {
  TempDir dir("engine-events");
  // Device budgets: ample (every gathered group fits), and the working set plus one group
  // (stage 3 gathers into memory the model may still be reading). With the parameters on
  // the device the one rank reads its shards in place, which the optimizer then writes:
  // on the host (CPU Adam) or on the engine's stream (the GPU optimizer's path).
  const std::vector<PassConfig> configs = {
      {"stage 1", 1, OffloadDevice::None, OffloadDevice::None, 2 << 20, 2, true},
      {"stage 2, optimizer on cpu", 2, OffloadDevice::None, OffloadDevice::Cpu},
      {"stage 3", 3},
      {"stage 3, device memory for two groups", 3, OffloadDevice::None, OffloadDevice::None, 2 * 336 * 1024},
      {"stage 3, params and optimizer on nvme", 3, OffloadDevice::Nvme, OffloadDevice::Nvme},
      {"stage 3, one micro-step", 3, OffloadDevice::Cpu, OffloadDevice::Cpu, 2 << 20, 1},
      {"stage 3, the GPU optimizer's path", 3, OffloadDevice::None, OffloadDevice::None, 2 << 20, 2, false, true},
  };
  for (const PassConfig& c : configs) {
    SCOPED_TRACE(c.label);
    const Outcome ref = run(c, false, 3, dir.path.string());
    const Outcome got = run(c, true, 3, dir.path.string());
    EXPECT_EQ(got.releases, 3 * c.accum * 2 * kGroups);
    expect_same_weights(ref, got);
    if (c.issues_without_waiting) EXPECT_EQ(got.forced, 0) << "the host waited for the model's work";
    std::printf("%s: %d of %d passes waited for the model's work\n", c.label.c_str(), got.forced, 3 * c.accum * 2);
  }
}

TEST(EngineEvents, AReadAfterTheGradientIsFencedByItsOwnEvent) {
  TempDir dir("engine-events-late");
  const std::vector<PassConfig> configs = {
      {"stage 1", 1},
      {"stage 3, read in place, CPU Adam", 3},
      {"stage 3, read in place, the GPU optimizer's path", 3, OffloadDevice::None, OffloadDevice::None, 2 << 20, 2,
       false, true},
      {"stage 3, gathered from pinned memory", 3, OffloadDevice::Cpu, OffloadDevice::Cpu},
  };
  for (const PassConfig& c : configs) {
    SCOPED_TRACE(c.label);
    const Outcome ref = run_late_read(c, false, 3, dir.path.string());
    const Outcome got = run_late_read(c, true, 3, dir.path.string());
    EXPECT_EQ(got.releases, 3 * c.accum * kGroups);
    expect_same_weights(ref, got);
    std::printf("%s: %d of 3 steps waited for the late read\n", c.label.c_str(), got.forced);
  }
}
