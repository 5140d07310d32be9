#include "gradient_reducer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/math/quantize.hpp"

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
    if (c_.resolved.grads_in_place) {
      // One rank: the reduce-scatter would copy the buffer whole. Accumulate from it; it
      // is free for the next micro-step once that has read it.
      accumulate(gr, s.grad, c_.work_t, s.tail_zeroed, micro == 0, last, c_.replicas != nullptr);
      s.consumed = c_.reduce_stream.record();
      if (gr.grad_full_scratch) c_.store.discard_after(gr.grad_full, s.consumed);
      return;
    }
    Acquired out = c_.store.acquire_for_overwrite(gr.grad_reduced, Tier::Device);
    // Written only once the previous accumulation has read the last contents.
    const Event ready = when_all({s.tail_zeroed, s.reduced_consumed, out.ready});
    ++c_.stats.reduce_scatters;
    const Event reduced = gr.quantized_reduce != 0
                              ? reduce_quantized(gr, s.grad, out.data, ready)
                              : c_.comm.reduce_scatter(view(s.grad, gr.padded, c_.work_t),
                                                       view_mut(out.data, gr.shard, c_.work_t), coll::ReduceOp::Sum,
                                                       ready);
    if (gr.quantized_reduce == 0) c_.sent_in_shard(gr.padded, c_.wb);
    c_.store.release(gr.grad_reduced, Tier::Device, Access::Write, reduced);
    // MiCS: the accumulated shard is all-reduced across the groups at the last micro-step,
    // on the collective queue behind the reduce-scatters, while the backward pass goes on.
    accumulate(gr, out.data, c_.work_t, reduced, micro == 0, last, c_.replicas != nullptr);
    s.reduced_consumed = c_.reduce_stream.record();
    if (gr.grad_full_scratch) c_.store.discard_after(gr.grad_full, reduced);
    c_.store.discard_after(gr.grad_reduced, s.reduced_consumed);
    s.consumed = reduced;
  }

  // ZeRO++ qgZ: the reduce-scatter of `grad` ([padded], the working type) into `out`
  // ([shard]) as all-to-alls of int8 blocks, summed in fp32 where they arrive. Host work
  // on the engine's stream (the cpu backend's device memory is the host's), through the
  // group's scratch (qgz_scratch_bytes of a chunk, qgz_chunks):
  //   [send: world parts][received: world parts][fp32: a chunk per node][send 2][received 2]
  // One hop: part r of the send is the gradient's slice r quantized, to rank r, and the
  // slice is the sum of what arrives. Two hops (world = nodes x L ranks a node): the send
  // is ordered by local index, then node, so that local rank l gets, in one part, the
  // slices of every node's rank l; each rank sums what its node sent it for those
  // slices (one per node), quantizes the sums again and sends each to its node's rank
  // over `cross`; its own slice is the sum of those. A shard whose scratch would exceed
  // EngineOptions::quantized_scratch_bytes goes in chunks of each slice through two
  // buffers: chunk i + 1 is quantized while chunk i moves. Returns when `out` is written.
  Event reduce_quantized(GroupState& gr, const void* grad, void* out, const Event& ready) {
    const uint64_t n = gr.shard, block = static_cast<uint64_t>(c_.opts.quantized_gradients_block);
    const uint64_t world = static_cast<uint64_t>(c_.world);
    const bool two_hops = c_.qgz_node != nullptr;
    const uint64_t nodes = two_hops ? static_cast<uint64_t>(c_.qgz_cross->size()) : 1;
    const QuantizedChunks ch =
        qgz_chunks(n, c_.world, two_hops ? c_.qgz_cross->size() : 1, block, c_.opts.quantized_scratch_bytes);
    const uint64_t stride = qgz_scratch_bytes(ch.elems, c_.world, two_hops ? c_.qgz_cross->size() : 1, block);
    Acquired qs = c_.store.acquire_for_overwrite(gr.quantized_reduce, Tier::Device);
    Stream& rs = c_.reduce_stream;
    rs.wait(when_all({ready, qs.ready}));
    // What this rank quantized for this reduce-scatter, both hops, every chunk (the
    // stream's tasks run one at a time): its relative error is the one reported.
    auto err = std::make_shared<math::QuantizeError>();
    struct Moving {
      Event arrived;
      uint8_t* recv;
      float* sums;
      uint8_t *send2, *recv2;
      uint64_t first, m, q;
    };
    // The chunk's parts have arrived: summed into `out` (two hops: via the cross hop).
    auto land = [&](const Moving& mv) {
      rs.wait(mv.arrived);
      if (!two_hops) {
        rs.host_task([mv, world, block, out = at(out, mv.first, c_.wb), t = c_.work_t] {
          sum_parts(mv.recv, world, mv.q, mv.m, block, mv.sums, out, t);
        });
        return;
      }
      const uint64_t per_node = world / nodes;
      rs.host_task([mv, nodes, per_node, block, err] {
        // From local rank l, part l holds one slice per node: slice k at (l * nodes + k).
        std::fill(mv.sums, mv.sums + nodes * mv.m, 0.0f);
        for (uint64_t k = 0; k < nodes; ++k) {
          for (uint64_t l = 0; l < per_node; ++l)
            math::dequantize_add_int8(mv.recv + (l * nodes + k) * mv.q, mv.m, block, mv.sums + k * mv.m);
          add(*err, math::quantize_int8(mv.sums + k * mv.m, DType::F32, mv.m, block, mv.send2 + k * mv.q,
                                        math::NonFinite::Propagate));
        }
      });
      const Event crossed = c_.qgz_cross->all_to_all(view(mv.send2, nodes * mv.q, DType::U8),
                                                     view_mut(mv.recv2, nodes * mv.q, DType::U8), rs.record());
      c_.stats.cross_collective_bytes += EngineCore::all_to_all_bytes(mv.q, c_.qgz_cross->size());
      rs.wait(crossed);
      rs.host_task([mv, nodes, block, out = at(out, mv.first, c_.wb), t = c_.work_t] {
        sum_parts(mv.recv2, nodes, mv.q, mv.m, block, mv.sums, out, t);
      });
    };
    Moving last{};
    for (uint64_t first = 0, i = 0; first < n; first += ch.elems, ++i) {
      const uint64_t m = std::min(ch.elems, n - first), q = quantized_bytes(m, block);
      auto* send = static_cast<uint8_t*>(qs.data) + (i % static_cast<uint64_t>(ch.buffers)) * stride;
      uint8_t* recv = send + world * q;
      auto* sums = reinterpret_cast<float*>(send + qgz_sums_offset(m, c_.world, block));  // [nodes][m], or [m]
      uint8_t* send2 = reinterpret_cast<uint8_t*>(sums + nodes * m);
      uint8_t* recv2 = send2 + nodes * q;
      const uint64_t per_node = world / nodes;
      rs.host_task([=, t = c_.work_t, tb = c_.wb] {
        for (uint64_t r = 0; r < world; ++r) {
          const uint64_t part = two_hops ? (r % per_node) * nodes + r / per_node : r;
          add(*err, math::quantize_int8(at(grad, r * n + first, tb), t, m, block, send + part * q,
                                        math::NonFinite::Propagate));
        }
      });
      coll::Communicator& hop = two_hops ? *c_.qgz_node : c_.comm;
      const Event arrived =
          hop.all_to_all(view(send, world * q, DType::U8), view_mut(recv, world * q, DType::U8), rs.record());
      if (two_hops)
        c_.stats.node_collective_bytes += EngineCore::all_to_all_bytes(nodes * q, hop.size());
      else
        c_.stats.shard_collective_bytes += EngineCore::all_to_all_bytes(q, hop.size());
      if (i > 0) land(last);
      last = {arrived, recv, sums, send2, recv2, first, m, q};
    }
    land(last);
    rs.host_task([err, worst = worst_error_] { raise(*worst, err->relative()); });
    const Event done = rs.record();
    c_.store.release(gr.quantized_reduce, Tier::Device, Access::Write, done);
    c_.store.discard_after(gr.quantized_reduce, done);
    return done;
  }

  // out (n of type t) = the fp32 sum of `parts` quantized parts of q bytes each.
  static void sum_parts(const uint8_t* in, uint64_t parts, uint64_t q, uint64_t n, uint64_t block, float* sum,
                        void* out, DType t) {
    std::fill(sum, sum + n, 0.0f);
    for (uint64_t p = 0; p < parts; ++p) math::dequantize_add_int8(in + p * q, n, block, sum);
    convert_from_f32(out, t, sum, n);
  }
  static void add(math::QuantizeError& into, const math::QuantizeError& e) {
    into.error_sq += e.error_sq;
    into.value_sq += e.value_sq;
  }
  static void raise(std::atomic<double>& worst, double e) {
    double seen = worst.load();
    while (e > seen && !worst.compare_exchange_weak(seen, e)) {
    }
  }

  void reductions_done() override {
    if (c_.opts.quantized_gradients_block > 0) c_.stats.quantized_gradients_error = worst_error_->load();
  }

  // The largest relative error of a gradient part this rank quantized so far (the
  // engine's stream writes it; EngineStats::quantized_gradients_error).
  std::shared_ptr<std::atomic<double>> worst_error_ = std::make_shared<std::atomic<double>>(0.0);
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

void GradientReducer::grads_ready(int g, int micro, bool last, const Event& after) {
  GroupState& gr = c_.groups.at(g);
  Slot& s = slots_[g];
  if (!s.grad) throw Error("grads_ready: group '" + gr.spec.name + "' has no gradient buffer");
  if (micro < 0) throw Error("grads_ready before begin_micro_step()");
  // Every reader of the buffer (the reductions, a move of it) waits for its padding to be
  // zeroed: and now for the model's writes too.
  s.tail_zeroed = when_all({s.tail_zeroed, after});
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
  reductions_done();
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
