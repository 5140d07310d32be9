#include "optimizer_steppers.hpp"

#include <algorithm>
#include <cstring>

#include "strata/core/error.hpp"
#include "sub_group_io.hpp"

namespace strata::engine {

// ---------------------------------------------------------------------------------------
// CPU Adam.

void CpuAdamStepper::launch(const std::vector<Update>& items, const StepArgs& args) {
  const Tier t = c_.resolved.optimizer_compute_tier;
  // The next sub-group's states are fetched while this one is updated and the previous
  // one is written back.
  if (!items.empty()) fetch_update_states(c_, *items[0].group, *items[0].sub, t);
  // Without speculation (its few plain updates at step() read as they always did).
  const bool read_ahead = c_.resolved.ablation.plain_state_prefetch && !c_.opts.speculative;
  size_t ahead = 2;  // the first sub-group not yet asked for ahead: each is asked once
  for (size_t i = 0; i < items.size(); ++i) {
    if (open_ != items[i].group) {
      close_group(args.speculative);
      open_group(items, i, args);
    }
    if (i + 1 < items.size()) fetch_update_states(c_, *items[i + 1].group, *items[i + 1].sub, t);
    // And, into room the tier has free (nothing evicted for them), the ones after it, in
    // order until one finds none: the disk reads further ahead than one sub-group while
    // the room that the stepped ones leave allows.
    ahead = std::max(ahead, i + 2);
    while (read_ahead && ahead < items.size() &&
           prefetch_update_states(c_, *items[ahead].group, *items[ahead].sub, t, true))
      ++ahead;
    step_one(items[i], args);
  }
  close_group(args.speculative);
}

void CpuAdamStepper::open_group(const std::vector<Update>& items, size_t i, const StepArgs& args) {
  const Tier t = c_.resolved.optimizer_compute_tier;
  GroupState& gr = *items[i].group;
  open_ = &gr;
  // Stage 3 overwrites the whole parameter shard when every sub-group of the group is
  // stepped here; otherwise the others' values are kept.
  size_t mine = 0;
  for (size_t j = i; j < items.size() && items[j].group == &gr; ++j) ++mine;
  const bool whole = mine == gr.sub_groups.size();
  // Where the shard is the master weights it is read (and stepped in place, or into the
  // next shard when speculative).
  params_ = c_.opts.stage != 3                 ? c_.store.acquire(gr.gathered, Tier::Device)
            : whole && !gr.master_in_shard ? c_.store.acquire_for_overwrite(gr.param_shard, t)
                                               : c_.store.acquire(gr.param_shard, t);
  next_params_ = !gr.master_in_shard || !args.speculative ? Acquired{}
                 : whole                                  ? c_.store.acquire_for_overwrite(gr.next_param_shard, t)
                                                          : c_.store.acquire(gr.next_param_shard, t);
  const double t0 = c_.device.now();
  params_.ready.wait();
  next_params_.ready.wait();
  const double t1 = c_.device.now();
  *args.waited += t1 - t0;
  if (trace::Recorder* r = trace::active(); r && t1 > t0) r->record("wait", "wait params " + gr.spec.name, t0, t1);
}

void CpuAdamStepper::close_group(bool speculative) {
  if (!open_) return;
  const Tier t = c_.resolved.optimizer_compute_tier;
  GroupState& gr = *open_;
  if (gr.master_in_shard) {
    // The shard is the master weights: stepped in place, or read beside the next shard.
    c_.store.release(gr.param_shard, t, speculative ? Access::Read : Access::Write);
    if (speculative) c_.store.release(gr.next_param_shard, t, Access::Write);
    if (c_.opts.param_home != t)
      for (TensorId id : {gr.param_shard, speculative ? gr.next_param_shard : TensorId{0}})
        if (id != 0) c_.store.drop(id, t);  // towards NVMe
  } else if (c_.opts.stage == 3) {
    c_.store.release(gr.param_shard, t, Access::Write);
    if (c_.opts.param_home != t) c_.store.drop(gr.param_shard, t);  // to device or towards NVMe
  } else {
    Event copied = c_.reduce_stream.record();
    c_.store.release(gr.gathered, Tier::Device, Access::Write, copied);
  }
  open_ = nullptr;
}

void CpuAdamStepper::step_one(const Update& item, const StepArgs& args) {
  const Tier t = c_.resolved.optimizer_compute_tier;
  GroupState& gr = *item.group;
  SubGroupState& sg = *item.sub;
  UpdateTensors u = acquire_for_update(c_, sg, t, args.speculative);
  if (gr.master_in_shard) {
    u.m.data = at(params_.data, sg.offset, 4);
    u.out[0].data = args.speculative ? at(next_params_.data, sg.offset, 4) : u.m.data;
  }
  const double t0 = c_.device.now();
  for (Acquired* x : {&u.m, &u.a, &u.v, &u.gd, &u.out[0], &u.out[1], &u.out[2]}) x->ready.wait();
  const double t1 = c_.device.now();
  *args.waited += t1 - t0;
  // One fused pass: read the weight, both moments and the (scaled) gradient, write the
  // weight and moments and, in 16 bits, the working copy; fp32 copies it after.
  const HalfKind kind = half_kind(c_.work_t);
  // Where the 16-bit working copy goes: the parameter shard (stage 3, host memory in the
  // optimizer's tier) or a host buffer that a stream copies into the replicated
  // parameters (stages 1 and 2, device memory).
  if (kind != HalfKind::None && c_.opts.stage != 3) half_copy_.resize(sg.n * c_.wb);
  void* half_out = kind == HalfKind::None ? nullptr
                   : c_.opts.stage == 3   ? at(params_.data, sg.offset, c_.wb)
                                          : half_copy_.data();
  auto* mo = static_cast<float*>(u.out[0].data);
  c_.device.host_compute(update_bytes(c_, gr, sg), [&] {
    c_.adam.step_into(args.t, static_cast<const float*>(u.m.data), static_cast<const float*>(u.a.data),
                      static_cast<const float*>(u.v.data), AdamGrads{u.gd.data, c_.grad_t, args.grad_scale}, mo,
                      static_cast<float*>(u.out[1].data), static_cast<float*>(u.out[2].data), sg.n, half_out, kind);
    if (c_.opts.stage == 3 && kind == HalfKind::None && !gr.master_in_shard)
      std::memcpy(at(params_.data, sg.offset, 4), mo, sg.n * 4);
  });
  if (trace::Recorder* r = trace::active()) {
    if (t1 > t0) r->record("wait", "wait optimizer states " + gr.spec.name, t0, t1);
    r->record("optimizer",
              std::string(args.speculative ? "adam (speculative) " : "adam ") + gr.spec.name + " [" +
                  std::to_string(sg.offset) + ", " + std::to_string(sg.offset + sg.n) + ")",
              t1, c_.device.now());
  }
  if (c_.opts.stage != 3) {
    void* full = at(params_.data, static_cast<uint64_t>(c_.rank) * gr.shard + sg.offset, c_.wb);
    c_.reduce_stream.copy_async(full, kind == HalfKind::None ? static_cast<void*>(mo) : half_copy_.data(),
                                sg.n * c_.wb);
    c_.reduce_stream.synchronize();  // the master copy may move once released
  }
  release_stepped(c_, gr, sg, t, args.speculative);
}

// ---------------------------------------------------------------------------------------
// The GPU optimizer: launch queues a group's sub-groups together and finish waits for them
// before releasing what they read and write.

DeviceAdamStepper::DeviceAdamStepper(EngineCore& core) : c_(core), stream_(core.device.create_stream("optimizer")) {}

DeviceAdamStepper::~DeviceAdamStepper() {
  try {
    stream_->synchronize();
  } catch (...) {
  }
}

void DeviceAdamStepper::launch(const std::vector<Update>& items, const StepArgs& args) {
  for (size_t i = 0; i < items.size();) {
    size_t end = i;
    while (end < items.size() && items[end].group == items[i].group) ++end;
    launch_group(items, i, end, args);
    // A parameter shard brought to the device from a host home is sent back before the
    // next group's comes, so that the device holds one at a time.
    if (c_.opts.stage == 3 && c_.opts.param_home != Tier::Device) finish();
    i = end;
  }
}

void DeviceAdamStepper::launch_group(const std::vector<Update>& items, size_t i, size_t end, const StepArgs& args) {
  const Tier t = Tier::Device;
  Stream& s = *stream_;
  GroupState& gr = *items[i].group;
  const bool whole = end - i == gr.sub_groups.size();
  // The GPU optimizer's groups have master weights of their own (the layout's rule).
  STRATA_CHECK(!gr.master_in_shard, "a group whose shard is its master weights on the GPU optimizer");
  const math::AdamStepScalars sc = c_.adam.scalars(args.t);
  const DType half_t = half_kind(c_.work_t) == HalfKind::None ? DType::F32 : c_.work_t;
  Acquired params = c_.opts.stage != 3 ? c_.store.acquire(gr.gathered, t)
                    : whole            ? c_.store.acquire_for_overwrite(gr.param_shard, t)
                                       : c_.store.acquire(gr.param_shard, t);
  s.wait(params.ready);
  Pending p{&gr, {}, {}, args.speculative, c_.device.now()};
  for (size_t k = i; k < end; ++k) {
    SubGroupState& sg = *items[k].sub;
    p.subs.push_back(&sg);
    Acquired m = c_.store.acquire(sg.master, t);
    Acquired a = c_.store.acquire(sg.exp_avg, t);
    Acquired v = c_.store.acquire(sg.exp_avg_sq, t);
    Acquired gd = c_.store.acquire(sg.grad, t);
    Acquired out[3] = {m, a, v};
    if (args.speculative) {
      out[0] = c_.store.acquire_for_overwrite(sg.next_master, t);
      out[1] = c_.store.acquire_for_overwrite(sg.next_exp_avg, t);
      out[2] = c_.store.acquire_for_overwrite(sg.next_exp_avg_sq, t);
    }
    for (Acquired* x : {&m, &a, &v, &gd, &out[0], &out[1], &out[2]}) s.wait(x->ready);
    // The working copy: in the parameter shard (stage 3) or this rank's slice of the
    // replicated parameters (stages 1 and 2), both in device memory.
    void* working = c_.opts.stage == 3
                        ? at(params.data, sg.offset, c_.wb)
                        : at(params.data, static_cast<uint64_t>(c_.rank) * gr.shard + sg.offset, c_.wb);
    AdamStepArgs sa;
    sa.s = sc;
    sa.p_in = static_cast<const float*>(m.data);
    sa.m_in = static_cast<const float*>(a.data);
    sa.v_in = static_cast<const float*>(v.data);
    sa.grad = gd.data;
    sa.grad_t = c_.grad_t;
    sa.grad_scale = args.grad_scale;
    sa.p_out = static_cast<float*>(out[0].data);
    sa.m_out = static_cast<float*>(out[1].data);
    sa.v_out = static_cast<float*>(out[2].data);
    sa.half_out = half_t == DType::F32 ? nullptr : working;
    sa.half_t = half_t;
    sa.n = sg.n;
    s.adam_step(sa);
    if (half_t == DType::F32) s.copy_async(working, out[0].data, sg.n * 4);
  }
  p.done = s.record();
  pending_.push_back(std::move(p));
}

void DeviceAdamStepper::finish() {
  const Tier t = Tier::Device;
  for (Pending& p : pending_) {
    p.done.wait();
    if (trace::Recorder* r = trace::active())
      r->record("optimizer",
                std::string(p.speculative ? "adam on the device (speculative) " : "adam on the device ") +
                    p.group->spec.name,
                p.t0, c_.device.now());
    for (SubGroupState* sg : p.subs) release_stepped(c_, *p.group, *sg, t, p.speculative);
    const TensorId pid = c_.opts.stage == 3 ? p.group->param_shard : p.group->gathered;
    c_.store.release(pid, t, Access::Write);
    if (c_.opts.stage == 3 && c_.opts.param_home != t) c_.store.drop(pid, t);  // towards its home
  }
  pending_.clear();
}

// ---------------------------------------------------------------------------------------

Steppers::Steppers(EngineCore& core) : host_(core) {
  if (core.resolved.gpu_optimizer) device_ = std::make_unique<DeviceAdamStepper>(core);
}

void Steppers::update(const std::vector<Update>& items, const StepArgs& args) {
  std::vector<Update> on_device, on_host;
  for (const Update& u : items) (u.group->optimizer_on_device ? on_device : on_host).push_back(u);
  if (!on_device.empty()) device_->launch(on_device, args);
  try {
    if (!on_host.empty()) host_.launch(on_host, args);
  } catch (...) {
    try {
      if (device_) device_->finish();
    } catch (...) {
    }
    throw;
  }
  if (device_) device_->finish();
}

}  // namespace strata::engine
