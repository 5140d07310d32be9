// The device interface: one small set of concepts (Device, Stream, Event) that the cpu,
// cuda and sim backends implement. Callers never branch on which backend they have
// (STYLE.md, habit 1).
//
//  - Device memory is raw bytes from the backend; budgets and sub-allocation live in
//    memory/ (DeviceArena), which asks for one region up front.
//  - A Stream is an in-order queue. Work enqueued on it runs after everything enqueued
//    before it, and after every event it was told to wait for.
//  - record() returns an Event that completes when the stream reaches that point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "strata/core/event.hpp"

namespace strata {

enum class Backend { Cpu, Cuda, Sim };
const char* to_string(Backend b);
Backend parse_backend(const std::string& name);  // throws ConfigError naming the choices

class Stream {
 public:
  virtual ~Stream() = default;
  // Copies bytes; both pointers may be device or host memory of this device's backend.
  virtual void copy_async(void* dst, const void* src, size_t bytes) = 0;
  // Runs fn on a host thread in stream order (cpu: the stream's worker; cuda: a host
  // callback). An exception thrown by fn (or by a failed event waited on) fails the
  // next event recorded on the stream, and only that one.
  virtual void host_task(std::function<void()> fn) = 0;
  // Later work on this stream starts only after e completes.
  virtual void wait(const Event& e) = 0;
  virtual Event record() = 0;
  virtual void synchronize() = 0;
  virtual const std::string& name() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Backend backend() const = 0;
  virtual std::string description() const = 0;
  // Raw device memory; throws OutOfBudget if the backend refuses.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  // Makes host memory [p, p+bytes) page-locked for fast copies, if the backend can.
  // Returns false (and the memory stays usable, just slower) when it cannot.
  virtual bool register_host(void* p, size_t bytes) = 0;
  virtual void unregister_host(void* p) = 0;
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  // NUMA node nearest this device, or -1 when unknown.
  virtual int numa_node() const = 0;
};

struct DeviceOptions {
  Backend backend = Backend::Cpu;
  int ordinal = 0;  // which GPU, for cuda
};

// Creates a device; throws Unavailable when the backend is not built or no device exists.
std::unique_ptr<Device> make_device(const DeviceOptions& opts);

// True when the cuda backend was compiled in and a GPU is present. reason explains a false.
bool cuda_available(std::string* reason);

}  // namespace strata
