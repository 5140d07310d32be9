// The ZeRO engine's activation checkpoint store (model/activation_store.hpp): one
// TieredStore tensor per checkpoint, home on the device, or in pinned memory or on NVMe
// with activation_checkpointing.cpu_checkpointing (shard_layout.hpp, ShardStrategy::checkpoints).
// Off the device, a checkpoint is written there in forward, moved home once its block has
// read it (the write of checkpoint i waits until checkpoint i - 3 has left, so no more
// than kLiveCheckpoints are on the device, nor on their way through pinned memory to
// NVMe, whatever the queues), and fetched
// back one block ahead of the backward that reads it; the last
// block's input, which backward reads first, stays where it is (a cache copy the store
// may still write home if it needs the room). Reads and frees never write anything back:
// a finished checkpoint's contents are dead.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "strata/core/device.hpp"
#include "strata/model/activation_store.hpp"
#include "strata/offload/tiered_store.hpp"

namespace strata {

class TieredActivationStore final : public ActivationStore {
 public:
  // waited(since, what): an exposed wait of the model's thread ended now (device clock).
  TieredActivationStore(TieredStore& store, Device& device, std::vector<TensorId> ids, uint64_t bytes, Tier home,
                    std::function<void(double, const std::string&)> waited);
  int count() const override { return static_cast<int>(ids_.size()); }
  uint64_t bytes() const override { return bytes_; }
  void* begin_write(int i) override;
  void end_forward(int i, bool keep) override;
  const void* read(int i) override;
  void finish(int i) override;
  Tier home() const { return home_; }
  // Lets go of every checkpoint still held (a micro-step the model left half-way through,
  // by an exception): released, contents dead. ZeroEngine::begin_micro_step calls it.
  void reset();

 private:
  enum class Held { None, Writing, Reading };
  void check_index(int i, const char* what) const;
  void wait(const Event& ready, int i, const char* what);
  void let_go(int i);  // a checkpoint still held from an interrupted micro-step: released, contents dead

  TieredStore& store_;
  Device& device_;
  std::vector<TensorId> ids_;
  uint64_t bytes_;
  Tier home_;
  std::function<void(double, const std::string&)> waited_;
  std::vector<Held> held_;
  std::vector<Event> leaving_;  // the move home of a checkpoint after its forward
};

}  // namespace strata
