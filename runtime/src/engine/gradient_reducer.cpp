#include "gradient_reducer.hpp"

#include <cmath>

#include "strata/core/error.hpp"

namespace strata::engine {

namespace {

// Stage 1: the full gradient stays on the device, accumulated over micro-steps, and is
// all-reduced once per step.
class AllReduceAtStep final : public GradientReducer {
 public:
  explicit AllReduceAtStep(EngineCore& core) : GradientReducer(core) {}

 private:
  void reduce(int g, int micro, bool last) override {
    GroupState& gr = c_.groups[g];
    Slot& s = slots_[g];
    Stream& rs = c_.reduce_stream;
    Acquired acc = c_.store.acquire(gr.grad_accumulated, Tier::Device);
    rs.wait(acc.ready);
    rs.wait(s.tail_zeroed);
    if (micro == 0)
      rs.convert(acc.data, c_.grad_t, s.grad, c_.work_t, gr.padded);
    else
      rs.accumulate(static_cast<float*>(acc.data), s.grad, c_.work_t, gr.padded);
    Event done = rs.record();
    c_.store.release(gr.grad_accumulated, Tier::Device, Access::Write, done);
    if (gr.grad_full_scratch) c_.store.discard_after(gr.grad_full, done);
    s.consumed = done;
    // Speculating: the step's all-reduce now rather than at step(), so the sub-groups
    // can be stepped during the rest of the backward pass.
    if (last && c_.opts.speculative) all_reduce(g);
  }
  void reduce_rest() override {
    for (size_t g = 0; g < c_.groups.size(); ++g)
      if (!slots_[g].reduced && !c_.groups[g].frozen) all_reduce(static_cast<int>(g));
  }
  void all_reduce(int g) {
    GroupState& gr = c_.groups[g];
    Acquired acc = c_.store.acquire(gr.grad_accumulated, Tier::Device);
    Event reduced = c_.comm.all_reduce(view_mut(acc.data, gr.padded, c_.grad_t), coll::ReduceOp::Sum, acc.ready);
    c_.sent_in_shard(gr.padded, c_.gb, true);
    if (c_.replicas) {  // MiCS: then across the groups
      reduced = c_.replicas->all_reduce(view_mut(acc.data, gr.padded, c_.grad_t), coll::ReduceOp::Sum, reduced);
      c_.sent_to_replicas(gr.padded, c_.gb);
    }
    accumulate(gr, at(acc.data, static_cast<uint64_t>(c_.rank) * gr.shard, c_.gb), c_.grad_t, reduced, true, true);
    c_.store.release(gr.grad_accumulated, Tier::Device, Access::Write, reduced);
    slots_[g].reduced = true;
  }
};

// Stages 2 and 3: every micro-batch's gradient is reduce-scattered as soon as it is ready.
class ReduceScatterEachMicroStep final : public GradientReducer {
 public:
  explicit ReduceScatterEachMicroStep(EngineCore& core) : GradientReducer(core) {}

 private:
  void reduce(int g, int micro, bool last) override {
    GroupState& gr = c_.groups[g];
    Slot& s = slots_[g];
    Acquired out = c_.store.acquire_for_overwrite(gr.grad_reduced, Tier::Device);
    // Written only once the previous accumulation has read the last contents.
    Event reduced = c_.comm.reduce_scatter(view(s.grad, gr.padded, c_.work_t),
                                           view_mut(out.data, gr.shard, c_.work_t), coll::ReduceOp::Sum,
                                           when_all({s.tail_zeroed, s.reduced_consumed, out.ready}));
    // MiCS: the group's shard, then all-reduced across the groups (the same shard of each),
    // on the collective queue behind the reduce-scatter, while the backward pass goes on.
    c_.sent_in_shard(gr.padded, c_.wb);
    c_.store.release(gr.grad_reduced, Tier::Device, Access::Write, reduced);
    // MiCS: the accumulated shard is all-reduced across the groups at the last micro-step.
    accumulate(gr, out.data, c_.work_t, reduced, micro == 0, last, c_.replicas != nullptr);
    s.reduced_consumed = c_.reduce_stream.record();
    if (gr.grad_full_scratch) c_.store.discard_after(gr.grad_full, reduced);
    c_.store.discard_after(gr.grad_reduced, s.reduced_consumed);
    s.consumed = reduced;
  }
};

}  // namespace

std::unique_ptr<GradientReducer> GradientReducer::make(EngineCore& core) {
  if (core.opts.stage == 1) return std::make_unique<AllReduceAtStep>(core);
  return std::make_unique<ReduceScatterEachMicroStep>(core);
}

void* GradientReducer::gradient_buffer(int g) {
  GroupState& gr = c_.groups.at(g);
  Slot& s = slots_[g];
  if (gr.frozen)
    throw Error("gradient_buffer: group '" + gr.spec.name + "' is frozen and has no gradient; hand in gradients "
                "only for the groups that are trained");
  if (s.grad) throw Error("gradient_buffer: group '" + gr.spec.name + "' already has one outstanding");
  Acquired a = c_.store.acquire_for_overwrite(gr.grad_full, Tier::Device);
  // The previous micro-batch's reduction may still be reading the buffer, and the memory
  // may still be in use by whoever held it before.
  const double t0 = c_.device.now();
  when_all({a.ready, s.consumed}).wait();
  c_.waited(t0, "wait gradient buffer", &gr);
  s.grad = a.data;
  // The model writes [0, numel); the padding is zeroed here.
  c_.reduce_stream.fill_as(at(s.grad, gr.spec.numel, c_.wb), c_.work_t, 0.0f, gr.padded - gr.spec.numel);
  s.tail_zeroed = c_.reduce_stream.record();
  return s.grad;
}

void GradientReducer::grads_ready(int g, int micro, bool last) {
  GroupState& gr = c_.groups.at(g);
  Slot& s = slots_[g];
  if (!s.grad) throw Error("grads_ready: group '" + gr.spec.name + "' has no gradient buffer");
  if (micro < 0) throw Error("grads_ready before begin_micro_step()");
  c_.store.release(gr.grad_full, Tier::Device, Access::Write, s.tail_zeroed);
  reduce(g, micro, last);
  s.grad = nullptr;
}

void GradientReducer::accumulate(GroupState& gr, const void* reduced, DType t, Event reduced_ready, bool first,
                                 bool last, bool across_replicas) {
  const uint64_t tb = dtype_size(t);
  Stream& rs = c_.reduce_stream;
  for (SubGroupState& sg : gr.sub_groups) {
    Acquired a = first ? c_.store.acquire_for_overwrite(sg.grad, Tier::Device) : c_.store.acquire(sg.grad, Tier::Device);
    rs.wait(a.ready);
    rs.wait(reduced_ready);
    const void* src = at(reduced, sg.offset, tb);
    if (first)
      rs.convert(a.data, c_.grad_t, src, t, sg.n);  // a copy when the types agree
    else  // later micro-steps: the reduced type is fp32 (grads_dtype)
      rs.accumulate(static_cast<float*>(a.data), src, t, sg.n);
    if (last && across_replicas) {
      // MiCS: the step's gradient of this sub-group, summed over the micro-steps, then
      // across the groups (the same shard of each), once a step, on the collective queue.
      Event summed = c_.replicas->all_reduce(view_mut(a.data, sg.n, c_.grad_t), coll::ReduceOp::Sum, rs.record());
      c_.sent_to_replicas(sg.n, c_.gb);
      rs.wait(summed);
    }
    if (last) {
      sg.grad_sumsq = 0;
      rs.sum_squares_as(a.data, c_.grad_t, sg.n, &sg.grad_sumsq);
    }
    Event done = rs.record();
    c_.store.release(sg.grad, Tier::Device, Access::Write, done);
    // Send it towards the optimizer's tier now, behind the accumulation, so that the
    // device holds one group's gradient at a time; or, with room for them all (the
    // resolved layout keeps them on the device), only in the last micro-step.
    if (gr.optimizer_home != Tier::Device && (last || !c_.resolved.keep_grads_on_device))
      c_.store.drop(sg.grad, Tier::Device);
  }
}

void GradientReducer::finish_reduction() {
  reduce_rest();
  const double t0 = c_.device.now();
  c_.reduce_stream.synchronize();
  c_.waited(t0, "wait gradient reduction", nullptr);
}

double GradientReducer::global_norm(double loss_scale) const {
  double local = 0;
  for (const GroupState& gr : c_.groups)
    for (const SubGroupState& sg : gr.sub_groups) local += sg.grad_sumsq;
  double total = local;
  c_.host_comm.all_reduce(std::span<double>(&total, 1)).wait();
  const double scale = static_cast<double>(c_.data_parallel) * c_.opts.gradient_accumulation_steps * loss_scale;
  return std::sqrt(total) / scale;  // of the averaged, unscaled gradient
}

void GradientReducer::end_step() {
  for (Slot& s : slots_) s.reduced = false;
}

}  // namespace strata::engine
