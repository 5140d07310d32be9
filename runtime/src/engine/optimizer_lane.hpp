// The optimizer lane: stage 3's speculative CPU Adam updates run on a host worker of their
// own (Device::create_host_stream) while the model's thread goes on with the backward
// pass. The model's thread does all the store's work (the store is used from it alone):
// it acquires a sub-group's tensors, queues the update on the lane and at once releases
// them behind it (TieredStore::release with the update's event: what the update reads
// may be evicted but its memory is not reused until the update is done; what it writes
// counts as being filled until then). So the lane holds no pins while the model's thread
// works: a full tier waits on the store's own queue, never on the lane. Once an update
// is done its copies away from their home go back (drop). At most kDepth updates are
// queued at a time, the rest wait in a backlog.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine_state.hpp"

namespace strata::engine {

class OptimizerLane {
 public:
  // waited: where the model's thread's waits for the lane are added (the speculation's).
  OptimizerLane(EngineCore& core, double& waited);
  ~OptimizerLane();

  struct Item {
    Update u;
    int64_t t;         // Adam's step number
    float grad_scale;  // unclipped
    bool whole;        // every sub-group of the group is in this speculation
  };
  void push(const Item& it) { backlog_.push_back(it); }
  // Releases what is done; starts what may start.
  void pump();
  // Completes the group begun (so that a parameter shard taken for overwrite is written
  // whole) and waits for everything queued; the backlog's other groups are dropped (they
  // step plainly at step()).
  void finish();
  // Whether the lane may still read sub-group sg (queued or running).
  bool reading(const SubGroupState* sg) const;
  void synchronize();  // the worker idle (destruction)

 private:
  struct Record {
    GroupState* group;
    SubGroupState* sub;  // null: the group's parameter shard, once its sub-groups are done
    Event done;
  };
  static constexpr size_t kDepth = 8;
  void submit(const Item& it);
  void open_group(GroupState& gr, bool whole);
  void close_group();  // the open group's parameter shard goes home when the lane gets there
  void retire_one();   // waits for the oldest record; its copies away from home go back

  EngineCore& c_;
  double& waited_;
  std::unique_ptr<Stream> stream_;
  std::deque<Item> backlog_;
  std::deque<Record> inflight_;
  size_t running_ = 0;            // sub-group records in inflight_
  GroupState* open_ = nullptr;    // whose parameter shard the lane writes
  bool overwrite_ = false;        // open_'s shard is next written whole: no fetch of the old one
  GroupState* last_ = nullptr;    // the group of the last sub-group submitted
  std::vector<const GroupState*> opened_;  // groups opened this step (reopened: not for overwrite)
};

}  // namespace strata::engine
