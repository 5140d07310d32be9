#include "speculation.hpp"

#include <algorithm>
#include <cmath>

#include "strata/core/error.hpp"

namespace strata::engine {

double clip_coefficient(double clipping, double norm) {
  return clipping > 0 ? std::min(1.0, clipping / (norm + 1e-6)) : 1.0;
}

Speculation::Speculation(EngineCore& core, Gatherer& gatherer, Steppers& steppers)
    : c_(core), gatherer_(gatherer), steppers_(steppers) {
  if (core.resolved.lane) lane_ = std::make_unique<OptimizerLane>(core, wait_);
}

Speculation::~Speculation() = default;

void Speculation::group_reduced(int g, int64_t next_t, float grad_scale) {
  // One group behind the backward pass: the newest group's reduction is still in
  // flight, and on a GPU the model's next kernels are queued while the host steps.
  // Its states start on their way now, so that they are there when it is stepped.
  if (c_.resolved.ablation.early_state_fetch) prefetch_first_states(c_.groups[g]);
  queue_.push_back(g);
  while (queue_.size() > 1) {
    const int q = queue_.front();
    queue_.erase(queue_.begin());
    speculate_group(q, next_t, grad_scale);
  }
}

void Speculation::pump() {
  if (lane_) lane_->pump();
}

void Speculation::finish_lane() {
  if (lane_) lane_->finish();
}

double Speculation::take_wait() {
  const double w = wait_;
  wait_ = 0;
  return w;
}

bool Speculation::commits(double norm) const {
  // The step the speculation assumed is the step to take: a finite gradient, no clipping
  // (the same gradient scale to the bit) and the learning rate it used.
  return std::isfinite(norm) && clip_coefficient(c_.opts.gradient_clipping, norm) == 1.0 &&
         c_.adam.config().lr == lr_;
}

void Speculation::free_dead_kept_grads(double norm) {
  if (!commits(norm)) return;
  // The gradients kept for a rollback are dead: let them go now, unwritten, so that the
  // lane's last groups and the states of the groups stepped plainly find room without
  // writing them home first. Those the lane still reads go at the commit.
  for (GroupState& gr : c_.groups)
    for (SubGroupState& sg : gr.sub_groups)
      if (sg.speculated && !(lane_ && lane_->reading(&sg))) {
        c_.store.discard_contents(sg.grad);
        ++c_.stats.kept_grads_freed_early;
      }
}

void Speculation::prefetch_first_states(const GroupState& gr) {
  const Tier t = c_.resolved.optimizer_compute_tier;
  if (gr.optimizer_on_device || t == gr.optimizer_home) return;  // stepped where they live
  for (const SubGroupState& sg : gr.sub_groups) {
    if (!sg.has_next || sg.speculated) continue;  // stepped plainly, or already
    ++c_.stats.early_state_fetches;
    // A hint only (the update fetches them when it steps them): it takes room the tier
    // has or can free without writing anything home. Making room by writing out the
    // gradients kept for a rollback would write data that step() most often finds dead
    // (at the end of backward, with the last group's states).
    bool placed = true;
    for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq}) placed = (id == 0 || c_.store.prefetch(id, t)) && placed;
    if (gr.master_in_shard) placed = c_.store.prefetch(gr.param_shard, t) && placed;  // its master weights
    if (!placed) ++c_.stats.early_state_fetches_skipped;
    return;  // the first one; the update fetches each next one while stepping the one before
  }
}

void Speculation::speculate_group(int g, int64_t next_t, float grad_scale) {
  GroupState& gr = c_.groups.at(g);
  if (gatherer_.held(g)) return;  // still in use by the model: stepped at step()
  std::vector<Update> items;
  for (SubGroupState& sg : gr.sub_groups)
    if (sg.has_next && !sg.speculated) items.push_back({&gr, &sg});
  if (items.empty()) return;
  // The step the speculation assumes: t + 1, no clipping, this learning rate.
  bool first = true;
  for (const GroupState& o : c_.groups)
    for (const SubGroupState& sg : o.sub_groups) first = first && !sg.speculated;
  if (first) lr_ = c_.adam.config().lr;
  if (c_.adam.config().lr != lr_) return;
  if (lane_) {
    // The host's sub-groups go to the lane; the GPU optimizer's (offload_optimizer.ratio)
    // are stepped now, on its stream.
    std::vector<Update> on_device;
    size_t mine = 0;
    for (const Update& u : items) mine += u.group->optimizer_on_device ? 0 : 1;
    for (const Update& u : items) {
      if (u.group->optimizer_on_device)
        on_device.push_back(u);
      else
        lane_->push({u, next_t, grad_scale, mine == gr.sub_groups.size()});
    }
    items = std::move(on_device);
    if (items.empty()) return;
  }
  steppers_.update(items, {next_t, grad_scale, true, &wait_});
}

std::vector<Update> Speculation::settle(const std::vector<Update>& speculated, std::vector<Update> plain, double norm) {
  if (speculated.empty()) return plain;
  const bool valid = commits(norm);
  bool shards_swapped = false;
  for (const Update& u : speculated) {
    SubGroupState& sg = *u.sub;
    sg.speculated = false;
    if (valid) {
      std::swap(sg.master, sg.next_master);
      std::swap(sg.exp_avg, sg.next_exp_avg);
      std::swap(sg.exp_avg_sq, sg.next_exp_avg_sq);
      c_.store.discard_contents(sg.grad);
    }
    // The set not taken is dead: the next speculation overwrites it whole.
    for (TensorId id : {sg.next_master, sg.next_exp_avg, sg.next_exp_avg_sq})
      if (id != 0) c_.store.discard_contents(id);
  }
  // Where the shard is the master weights, the group's next shard holds all its
  // sub-groups' new master weights (every one speculative: the layout's rule). The list
  // is in group order: each group once, at its first sub-group.
  for (size_t i = 0; i < speculated.size(); ++i) {
    GroupState& gr = *speculated[i].group;
    if ((i > 0 && speculated[i - 1].group == &gr) || !gr.master_in_shard || gr.next_param_shard == 0) continue;
    if (valid) {
      std::swap(gr.param_shard, gr.next_param_shard);
      shards_swapped = true;
    }
    c_.store.discard_contents(gr.next_param_shard);
  }
  // The store's eviction order names the parameter shards the next step reads.
  if (shards_swapped && gatherer_.has_schedule()) gatherer_.readopt_schedule();
  if (valid) {
    ++c_.stats.speculation_commits;
    return plain;
  }
  ++c_.stats.speculation_rollbacks;
  plain.insert(plain.begin(), speculated.begin(), speculated.end());  // stepped again, in order
  std::stable_sort(plain.begin(), plain.end(), [](const Update& a, const Update& b) {
    return a.group != b.group ? a.group < b.group : a.sub->offset < b.sub->offset;
  });
  return plain;
}

void Speculation::restore_params(const std::vector<Update>& items) {
  const Tier t = c_.resolved.optimizer_host_tier;
  const bool s3 = c_.opts.stage == 3;
  for (const Update& u : items) {
    GroupState& gr = *u.group;
    SubGroupState& sg = *u.sub;
    if (gr.master_in_shard) continue;  // the speculation wrote the Next set only
    Acquired m = c_.store.acquire(sg.master, t);
    Acquired p = s3 ? c_.store.acquire(gr.param_shard, t) : c_.store.acquire(gr.gathered, Tier::Device);
    when_all({m.ready, p.ready}).wait();
    std::vector<std::byte> working(s3 ? 0 : sg.n * c_.wb);
    c_.device.host_compute((4.0 + c_.wb) * sg.n, [&] {
      void* to = s3 ? at(p.data, sg.offset, c_.wb) : static_cast<void*>(working.data());
      convert_from_f32(to, c_.work_t, static_cast<const float*>(m.data), sg.n);
    });
    if (!s3) {
      c_.reduce_stream.copy_async(at(p.data, static_cast<uint64_t>(c_.rank) * gr.shard + sg.offset, c_.wb),
                                  working.data(), working.size());
      c_.reduce_stream.synchronize();
    }
    c_.store.release(sg.master, t);
    if (t != gr.optimizer_home) c_.store.drop(sg.master, t);
    if (s3) {
      c_.store.release(gr.param_shard, t, Access::Write);
      if (c_.opts.param_home != t) c_.store.drop(gr.param_shard, t);
    } else {
      c_.store.release(gr.gathered, Tier::Device, Access::Write);
    }
  }
}

}  // namespace strata::engine
