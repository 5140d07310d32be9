#include "optimizer_lane.hpp"

#include <algorithm>
#include <cstring>

#include "sub_group_io.hpp"

namespace strata::engine {

namespace {
// Whether e has completed by the calling thread's now: in real time on cpu and cuda, in
// virtual time on sim (where every event is complete in real time).
bool done_by_now(const Event& e, const Device& d) {
  if (e.impl() && e.impl()->virtual_time() >= 0) return e.impl()->virtual_time() <= d.now();
  return e.ready();
}
}  // namespace

OptimizerLane::OptimizerLane(EngineCore& core, double& waited)
    : c_(core), waited_(waited), stream_(core.device.create_host_stream("optimizer lane")) {}

OptimizerLane::~OptimizerLane() { synchronize(); }

void OptimizerLane::synchronize() {
  try {
    stream_->synchronize();
  } catch (...) {
  }
}

bool OptimizerLane::reading(const SubGroupState* sg) const {
  return std::any_of(inflight_.begin(), inflight_.end(), [&](const Record& r) { return r.sub == sg; });
}

void OptimizerLane::pump() {
  while (!inflight_.empty() && done_by_now(inflight_.front().done, c_.device)) retire_one();
  while (!backlog_.empty() && running_ < kDepth) {
    const Item it = backlog_.front();
    backlog_.pop_front();
    submit(it);
  }
}

void OptimizerLane::open_group(GroupState& gr, bool whole) {
  close_group();
  // Overwritten whole only the first time: a group reopened keeps what the lane wrote
  // into it. Where the shard is the master weights the lane writes the group's next shard
  // and reads the shard.
  const bool reopened = std::find(opened_.begin(), opened_.end(), &gr) != opened_.end();
  overwrite_ = whole && !reopened;
  open_ = &gr;
  if (!reopened) opened_.push_back(&gr);
}

void OptimizerLane::submit(const Item& it) {
  GroupState& gr = *it.u.group;
  SubGroupState& sg = *it.u.sub;
  const Tier t = c_.resolved.optimizer_compute_tier;
  if (open_ != &gr) open_group(gr, it.whole);
  // The next one's states start on their way while this one is stepped.
  if (!backlog_.empty()) fetch_update_states(c_, *backlog_.front().u.group, *backlog_.front().u.sub, t);
  UpdateTensors u = acquire_for_update(c_, sg, t, true);
  const TensorId written = gr.master_in_shard ? gr.next_param_shard : gr.param_shard;
  Acquired params = overwrite_ ? c_.store.acquire_for_overwrite(written, t) : c_.store.acquire(written, t);
  overwrite_ = false;  // the rest of it is written in place, range by range
  Acquired masters = gr.master_in_shard ? c_.store.acquire(gr.param_shard, t) : Acquired{};
  if (gr.master_in_shard) {
    u.m.data = at(masters.data, sg.offset, 4);
    u.out[0].data = at(params.data, sg.offset, 4);
  }
  for (const Acquired* x : {&u.m, &u.a, &u.v, &u.gd, &u.out[0], &u.out[1], &u.out[2], &params, &masters})
    stream_->wait(x->ready);
  const HalfKind kind = half_kind(c_.work_t);
  // The working copy goes straight into the parameter shard: in 16 bits from the fused
  // pass, in fp32 copied after it; none where the shard is the master weights (the Next
  // set becomes it at the commit).
  void* working = gr.master_in_shard ? nullptr : at(params.data, sg.offset, c_.wb);
  const AdamGrads g{u.gd.data, c_.grad_t, it.grad_scale};
  EngineCore& c = c_;
  stream_->host_task([&c, m = u.m.data, a = u.a.data, v = u.v.data, mo = u.out[0].data, ao = u.out[1].data,
                      vo = u.out[2].data, g, step = it.t, &gr, &sg, working, kind, bytes = update_bytes(c_, gr, sg)] {
    const double t0 = c.device.now();
    c.device.host_compute(bytes, [&] {
      c.adam.step_into(step, static_cast<const float*>(m), static_cast<const float*>(a), static_cast<const float*>(v),
                       g, static_cast<float*>(mo), static_cast<float*>(ao), static_cast<float*>(vo), sg.n,
                       kind == HalfKind::None ? nullptr : working, kind);
      if (kind == HalfKind::None && working) std::memcpy(working, mo, sg.n * 4);
    });
    if (trace::Recorder* r = trace::active())
      r->record("optimizer lane",
                "adam (speculative, lane) " + gr.spec.name + " [" + std::to_string(sg.offset) + ", " +
                    std::to_string(sg.offset + sg.n) + ")",
                t0, c.device.now());
  });
  const Event done = stream_->record();
  release_behind(c_, sg, t, done);
  c_.store.release(written, t, Access::Write, done);
  if (gr.master_in_shard) c_.store.release(gr.param_shard, t, Access::Read, done);
  inflight_.push_back({&gr, &sg, done});
  ++running_;
  ++c_.stats.lane_sub_groups;
  last_ = &gr;
}

void OptimizerLane::close_group() {
  if (!open_) return;
  inflight_.push_back({open_, nullptr, stream_->record()});
  open_ = nullptr;
}

void OptimizerLane::retire_one() {
  Record r = inflight_.front();
  inflight_.pop_front();
  const double t0 = c_.device.now();
  r.done.wait();  // rethrows a failed update (a failed fetch of its states)
  if (const double t1 = c_.device.now(); t1 > t0) {
    waited_ += t1 - t0;  // the model's thread waited for the lane
    if (trace::Recorder* rec = trace::active()) rec->record("wait", "wait optimizer lane", t0, t1);
  }
  const Tier t = c_.resolved.optimizer_compute_tier;
  GroupState& gr = *r.group;
  if (r.sub) {
    --running_;
    drop_speculated(c_, gr, *r.sub, t);
  } else if (c_.opts.param_home != t) {
    if (gr.master_in_shard) c_.store.drop(gr.next_param_shard, t);
    c_.store.drop(gr.param_shard, t);
  }
}

void OptimizerLane::finish() {
  while (!backlog_.empty() && backlog_.front().u.group == last_) {
    if (running_ >= kDepth) {
      retire_one();
      continue;
    }
    const Item it = backlog_.front();
    backlog_.pop_front();
    submit(it);
  }
  backlog_.clear();
  close_group();
  while (!inflight_.empty()) retire_one();
  last_ = nullptr;
  opened_.clear();
}

}  // namespace strata::engine
