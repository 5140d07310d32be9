// The optimizer's update of a list of sub-groups, behind one small interface:
//   - CpuAdamStepper: CPU Adam over states in host memory (pinned, or the device tier on
//     the cpu backend), on the calling thread, fetching the next sub-group's states while
//     it updates one and writes the one before back;
//   - DeviceAdamStepper: the GPU optimizer, one Stream::adam_step per sub-group on the
//     optimizer stream over states in device memory (math::adam_update: CpuAdam's bits).
// Steppers holds one of each as the resolved layout needs them; offload_optimizer.ratio
// is the two side by side: the device's groups are queued first, CPU Adam steps the
// others while the GPU works, and the device's are finished last.
// Speculative updates write the sub-groups' Next sets and keep their gradients for
// step() to validate (speculation.hpp); plain ones step in place.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine_state.hpp"

namespace strata::engine {

struct StepArgs {
  int64_t t = 0;            // Adam's step number
  float grad_scale = 1.0f;  // averaging, clipping and the loss scale, applied as the gradient is read
  bool speculative = false;
  double* waited = nullptr;  // where the time spent waiting for states is added
};

class OptimizerStepper {
 public:
  virtual ~OptimizerStepper() = default;
  // Steps `items` (grouped by group, in order), or queues them where the work is on a stream.
  virtual void launch(const std::vector<Update>& items, const StepArgs& args) = 0;
  // Waits for what launch queued and lets go of its tensors.
  virtual void finish() = 0;
};

class CpuAdamStepper final : public OptimizerStepper {
 public:
  explicit CpuAdamStepper(EngineCore& core) : c_(core) {}
  void launch(const std::vector<Update>& items, const StepArgs& args) override;
  void finish() override {}

 private:
  // The group whose working parameters the updates write: acquired once for its sub-groups.
  void open_group(const std::vector<Update>& items, size_t i, const StepArgs& args);
  void close_group(bool speculative);
  void step_one(const Update& u, const StepArgs& args);

  EngineCore& c_;
  GroupState* open_ = nullptr;
  Acquired params_{};
  Acquired next_params_{};            // master_in_shard, speculative: the group's next shard
  std::vector<std::byte> half_copy_;  // stages 1, 2 in 16 bits: a sub-group's working copy
};

class DeviceAdamStepper final : public OptimizerStepper {
 public:
  explicit DeviceAdamStepper(EngineCore& core);
  ~DeviceAdamStepper() override;
  void launch(const std::vector<Update>& items, const StepArgs& args) override;
  void finish() override;

 private:
  struct Pending {
    GroupState* group;
    std::vector<SubGroupState*> subs;
    Event done;
    bool speculative;
    double t0;
  };
  void launch_group(const std::vector<Update>& items, size_t i, size_t end, const StepArgs& args);

  EngineCore& c_;
  std::unique_ptr<Stream> stream_;  // the GPU optimizer's
  std::vector<Pending> pending_;
};

class Steppers {
 public:
  explicit Steppers(EngineCore& core);
  // Steps `items`: the GPU optimizer's groups (GroupState::optimizer_on_device) on the
  // device, the others with CPU Adam, at the same time.
  void update(const std::vector<Update>& items, const StepArgs& args);

 private:
  CpuAdamStepper host_;
  std::unique_ptr<DeviceAdamStepper> device_;  // where the resolved layout has a GPU optimizer
};

}  // namespace strata::engine
