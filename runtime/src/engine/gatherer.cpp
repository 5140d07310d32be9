#include "gatherer.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/math/quantize.hpp"
#include "strata/core/log.hpp"

namespace strata::engine {

Gatherer::Gatherer(EngineCore& core)
    : c_(core), slots_(core.groups.size()), secondary_valid_(core.groups.size(), 0) {}

void Gatherer::set_schedule(std::vector<int> order) {
  for (int g : order)
    if (g < 0 || g >= static_cast<int>(c_.groups.size()))
      throw Error("set_schedule: unknown parameter group " + std::to_string(g));
  schedule_given_ = true;
  adopt_schedule(std::move(order));
}

void Gatherer::adopt_schedule(std::vector<int> order) {
  schedule_ = std::move(order);
  readopt_schedule();
}

void Gatherer::readopt_schedule() {
  std::vector<TensorId> tensors;
  for (int g : schedule_) tensors.push_back(c_.opts.stage == 3 ? c_.groups[g].param_shard : c_.groups[g].gathered);
  c_.store.set_schedule(std::move(tensors));
}

void Gatherer::begin_micro_step() {
  if (!recording_.empty() && !schedule_given_ && (departed_ || schedule_.empty())) adopt_schedule(recording_);
  recording_.clear();
  departed_ = false;
  pos_ = 0;
}

void Gatherer::start_gather(int g, bool ahead) {
  GroupState& gr = c_.groups[g];
  Slot& s = slots_[g];
  if (s.state != State::Released || in_place(g)) return;
  // Every rank decides the same way (validity changes at the same points everywhere), so
  // each communicator sees its gathers in the same order on all its ranks.
  const bool from_secondary = gr.param_secondary != 0 && secondary_valid_[g];
  s.source = from_secondary ? gr.param_secondary : gr.param_shard;
  s.source_elems = from_secondary ? gr.padded / c_.secondary->size() : gr.shard;
  s.fills_secondary = gr.param_secondary != 0 && !from_secondary;
  Acquired ps = c_.store.acquire(s.source, Tier::Device);
  Acquired fb = c_.store.acquire_for_overwrite(gr.gathered, Tier::Device);
  s.data = fb.data;
  s.quantized = gr.quantized != 0 && !from_secondary;
  if (s.quantized) {
    gather_quantized(g, ps, fb);
  } else {
    coll::Communicator& over = from_secondary ? *c_.secondary : c_.comm;
    s.gathered = over.all_gather(view(ps.data, s.source_elems, c_.work_t), view_mut(fb.data, gr.padded, c_.work_t),
                                 when_all({ps.ready, fb.ready}));
    if (from_secondary)
      c_.sent_in_secondary(gr.padded, c_.wb);
    else
      c_.sent_in_shard(gr.padded, c_.wb);
  }
  s.issued = c_.device.now();
  s.state = State::Gathering;
  live_full_bytes_ += gr.persistent ? 0 : gr.padded * c_.wb;
  s.passing_bytes = passing_bytes(g, from_secondary);
  gathering_shard_bytes_ += s.passing_bytes;
  ++c_.stats.gathers;
  if (ahead) ++c_.stats.prefetched;
}

// qwZ: the shard quantized into the group's scratch (math::quantize_int8), every rank's
// gathered as bytes after it, then dequantized into the gather buffer: on the engine's
// stream, as host work (the cpu backend's device memory is the host's). A shard whose
// buffers exceed EngineOptions::quantized_scratch_bytes goes in chunks of each rank's part
// through two buffers (qwz_chunks): chunk i + 1 is quantized while chunk i moves.
void Gatherer::gather_quantized(int g, const Acquired& ps, const Acquired& fb) {
  GroupState& gr = c_.groups[g];
  const uint64_t block = static_cast<uint64_t>(c_.opts.quantized_weights_block);
  const uint64_t n = gr.shard, world = static_cast<uint64_t>(c_.comm.size());
  const QuantizedChunks ch = qwz_chunks(n, c_.world, block, c_.opts.quantized_scratch_bytes);
  const uint64_t stride = (world + 1) * quantized_bytes(ch.elems, block);  // one buffer
  Acquired qb = c_.store.acquire_for_overwrite(gr.quantized, Tier::Device);
  auto* base = static_cast<uint8_t*>(qb.data);
  Stream& st = c_.reduce_stream;
  st.wait(when_all({ps.ready, fb.ready, qb.ready}));
  struct Moving {
    Event arrived;
    uint8_t* recv;
    uint64_t first, m, q;
  };
  auto land = [&](const Moving& mv) {
    st.wait(mv.arrived);
    st.host_task([mv, world, n, block, dst = fb.data, t = c_.work_t, wb = c_.wb] {
      for (uint64_t r = 0; r < world; ++r)
        math::dequantize_int8(mv.recv + r * mv.q, mv.m, block, at(dst, r * n + mv.first, wb), t);
    });
  };
  Moving last{};
  // The shard's error over its chunks (the stream's tasks run one at a time).
  auto err = std::make_shared<math::QuantizeError>();
  for (uint64_t first = 0, i = 0; first < n; first += ch.elems, ++i) {
    const uint64_t m = std::min(ch.elems, n - first), q = quantized_bytes(m, block);
    uint8_t* send = base + (i % static_cast<uint64_t>(ch.buffers)) * stride;
    uint8_t* recv = send + q;
    st.host_task([src = at(ps.data, first, c_.wb), t = c_.work_t, m, block, send, err] {
      const math::QuantizeError e = math::quantize_int8(src, t, m, block, send);
      err->error_sq += e.error_sq;
      err->value_sq += e.value_sq;
    });
    const Event arrived = c_.comm.all_gather(view(send, q, DType::U8), view_mut(recv, world * q, DType::U8), st.record());
    c_.stats.shard_collective_bytes += EngineCore::ring_bytes(world * q, 1, c_.world, false);
    if (i > 0) land(last);
    last = {arrived, recv, first, m, q};
  }
  land(last);
  st.host_task([err, worst = worst_quantized_error_] {
    const double e = err->relative();
    double seen = worst->load();
    while (e > seen && !worst->compare_exchange_weak(seen, e)) {
    }
  });
  slots_[g].gathered = st.record();
}

void Gatherer::wait_gathered(int g) {
  GroupState& gr = c_.groups[g];
  Slot& s = slots_[g];
  if (s.state != State::Gathering) return;
  const double t0 = c_.device.now();
  Event e = s.gathered;
  try {
    e.wait();
  } catch (...) {
    c_.waited(t0, "wait params", &gr);
    if (s.quantized) {
      c_.store.release(gr.quantized, Tier::Device);
      c_.store.discard(gr.quantized);
    }
    c_.store.release(s.source, Tier::Device);
    c_.store.release(gr.gathered, Tier::Device);
    c_.store.discard(gr.gathered);
    s.state = State::Released;
    live_full_bytes_ -= gr.persistent ? 0 : gr.padded * c_.wb;
    gathering_shard_bytes_ -= s.passing_bytes;
    throw;
  }
  c_.waited(t0, "wait params", &gr);
  if (trace::Recorder* r = trace::active()) r->record("gather", "all_gather " + gr.spec.name, s.issued, c_.device.now());
  if (s.quantized) {
    c_.store.release(gr.quantized, Tier::Device);
    c_.store.discard(gr.quantized);
    c_.stats.quantized_weights_error = worst_quantized_error_->load();
  }
  c_.store.release(s.source, Tier::Device);
  c_.store.release(gr.gathered, Tier::Device, Access::Write);
  gathering_shard_bytes_ -= s.passing_bytes;
  if (s.fills_secondary) {
    // hpZ: this rank's slice of the gathered group becomes its secondary partition, copied
    // on the engine's stream while the model goes on; the buffer is discarded after it.
    const uint64_t n = gr.padded / c_.secondary->size();
    Acquired sec = c_.store.acquire_for_overwrite(gr.param_secondary, Tier::Device);
    c_.reduce_stream.wait(sec.ready);
    c_.reduce_stream.copy_async(sec.data, at(s.data, static_cast<uint64_t>(c_.secondary_rank) * n, c_.wb), n * c_.wb);
    s.secondary_copied = c_.reduce_stream.record();
    c_.store.release(gr.param_secondary, Tier::Device, Access::Write, s.secondary_copied);
    secondary_valid_[g] = 1;
    s.fills_secondary = false;
  }
  s.state = State::Ready;
}

uint64_t Gatherer::reuse_distance(int g, size_t pos) const {
  if (schedule_.empty() || departed_) return std::numeric_limits<uint64_t>::max();
  uint64_t dist = 0;
  for (size_t q = pos + 1; q < schedule_.size(); ++q) {
    if (schedule_[q] == g) return dist;
    dist += c_.groups[schedule_[q]].spec.numel;
  }
  return std::numeric_limits<uint64_t>::max();  // not again before the optimizer step
}

void Gatherer::prefetch_after(size_t pos) {
  if (!c_.opts.prefetch || departed_) return;
  uint64_t window = 0;
  // Every gather in flight holds its source (parameter shard, or hpZ's secondary
  // partition) on the device until it lands; the working set holds one (the group
  // gathered on demand), the others take prefetch room.
  const ShardLayout& L = c_.resolved.layout;
  const uint64_t max_source = c_.secondary ? std::max(L.max_shard, L.max_padded / c_.secondary->size()) : L.max_shard;
  const uint64_t block = static_cast<uint64_t>(c_.opts.quantized_weights_block);
  const uint64_t shard_in_working =
      max_source * c_.wb +
      (block > 0 ? qwz_chunks(L.max_shard, c_.world, block, c_.opts.quantized_scratch_bytes).bytes : 0);
  for (size_t q = pos + 1; q < schedule_.size(); ++q) {
    const int h = schedule_[q];
    const GroupState& hg = c_.groups[h];
    window += hg.spec.numel;
    if (window > c_.opts.prefetch_bucket_elems) break;
    if (slots_[h].state != State::Released) continue;
    // A persistent group's buffer is counted among the homes, but its first gather still
    // passes its shard through the device.
    const uint64_t bytes = hg.persistent ? 0 : hg.padded * c_.wb;
    const uint64_t shards = gathering_shard_bytes_ + passing_bytes(h, hg.param_secondary != 0 && secondary_valid_[h]);
    const uint64_t passing = shards > shard_in_working ? shards - shard_in_working : 0;
    // Decided from sizes and the schedule alone, so every rank gathers in the same order.
    if (live_full_bytes_ + passing + bytes > c_.resolved.prefetch_room) break;
    if ((live_full_bytes_ + bytes) / c_.wb > c_.opts.max_live_elems) break;
    start_gather(h, true);
  }
}

const void* Gatherer::acquire(int g) {
  if (g < 0 || g >= static_cast<int>(c_.groups.size()))
    throw Error("acquire_params: unknown parameter group " + std::to_string(g));
  GroupState& gr = c_.groups[g];
  Slot& s = slots_[g];
  recording_.push_back(g);
  const size_t here = pos_;
  if (!departed_ && !schedule_.empty()) {
    if (pos_ < schedule_.size() && schedule_[pos_] == g) {
      ++pos_;
    } else {
      // The model left the known order: fetch on demand for the rest of this
      // micro-step, and learn the new order from it.
      departed_ = true;
      ++c_.stats.trace_departures;
      log::debug("acquire order departed from the schedule at group " + gr.spec.name);
    }
  }
  if (!departed_ && !schedule_.empty()) c_.store.set_position(here);
  if (in_place(g)) {
    // The holder's pin on the shard itself; ready once the optimizer's last write is.
    const double t0 = c_.device.now();
    Acquired f = c_.store.acquire(gr.param_shard, Tier::Device);
    f.ready.wait();
    c_.waited(t0, "wait params", &gr);
    s.data = f.data;
  } else if (c_.opts.stage == 3) {
    start_gather(g, false);
    if (!departed_ && !schedule_.empty()) prefetch_after(here);
    wait_gathered(g);
    // The holder's pin (release() lets it go with the model's readers); the copy is valid.
    Acquired held = c_.store.acquire(gr.gathered, Tier::Device);
    STRATA_CHECK(held.data == s.data, "gatherer: group '" + gr.spec.name + "' moved while gathered");
  } else {
    const double t0 = c_.device.now();
    Acquired f = c_.store.acquire(gr.gathered, Tier::Device);
    f.ready.wait();
    c_.waited(t0, "wait params", &gr);
    s.data = f.data;
  }
  ++s.holders;
  return s.data;
}

void Gatherer::drop(int g) {
  Slot& s = slots_[g];
  if (s.state != State::Ready || s.holders > 0) return;
  const GroupState& gr = c_.groups[g];
  if (s.secondary_copied.impl() != nullptr) {
    c_.store.discard_after(gr.gathered, std::exchange(s.secondary_copied, Event()));
  } else {
    c_.store.discard(gr.gathered);
  }
  s.state = State::Released;
  s.data = nullptr;
  live_full_bytes_ -= gr.persistent ? 0 : gr.padded * c_.wb;
}

void Gatherer::release(int g, const Event& after) {
  const GroupState& gr = c_.groups.at(g);
  Slot& s = slots_[g];
  if (s.holders <= 0) throw Error("release_params: group '" + gr.spec.name + "' is not acquired");
  --s.holders;
  // Each holder pins the copy in the store (acquire): its reads still running are the
  // copy's last readers there, which fence its memory however it goes (dropped, discarded,
  // gathered into again) and whatever writes it next (the optimizer, in place).
  c_.store.release(handed_out(g), Tier::Device, Access::Read, after);
  if (c_.opts.stage < 3 || in_place(g)) return;
  if (s.holders > 0 || gr.persistent) return;
  // Keep the gathered parameters when they are needed again soon, room permitting.
  const size_t here = pos_ == 0 ? 0 : pos_ - 1;
  if (reuse_distance(g, here) <= c_.opts.max_reuse_distance_elems && live_full_bytes_ <= c_.resolved.prefetch_room)
    return;
  drop(g);
}

uint64_t Gatherer::passing_bytes(int g, bool from_secondary) const {
  const GroupState& gr = c_.groups[g];
  if (from_secondary) return gr.padded / c_.secondary->size() * c_.wb;
  const uint64_t block = static_cast<uint64_t>(c_.opts.quantized_weights_block);
  return gr.shard * c_.wb +
         (gr.quantized != 0 ? qwz_chunks(gr.shard, c_.world, block, c_.opts.quantized_scratch_bytes).bytes : 0);
}

void Gatherer::invalidate_secondary(int g) {
  if (!secondary_valid_[g]) return;
  secondary_valid_[g] = 0;
  c_.store.discard_contents(c_.groups[g].param_secondary);  // stale: never written back
}

void Gatherer::parameters_changed(int g) {
  drop(g);
  invalidate_secondary(g);
}

void Gatherer::refresh() {
  // A frozen group's parameters did not change: its gathered copy and secondary stay good.
  if (c_.opts.stage == 3) {
    for (size_t g = 0; g < c_.groups.size(); ++g)
      if (!c_.groups[g].frozen) parameters_changed(static_cast<int>(g));
    return;
  }
  // Replicated parameters: every rank updated its slice; gather the rest.
  for (GroupState& gr : c_.groups) {
    if (gr.frozen) continue;
    Acquired f = c_.store.acquire(gr.gathered, Tier::Device);
    const void* mine = at(f.data, static_cast<uint64_t>(c_.rank) * gr.shard, c_.wb);
    Event ev = c_.comm.all_gather(view(mine, gr.shard, c_.work_t), view_mut(f.data, gr.padded, c_.work_t), f.ready);
    c_.sent_in_shard(gr.padded, c_.wb);
    ev.wait();
    c_.store.release(gr.gathered, Tier::Device, Access::Write);
  }
}

const void* Gatherer::acquire_for_host(int g) {
  Slot& s = slots_.at(g);
  if (c_.opts.stage == 3 && !in_place(g)) {
    s.kept_for_host = s.state != State::Released;
    start_gather(g, false);
    wait_gathered(g);
    return s.data;
  }
  Acquired f = c_.store.acquire(handed_out(g), Tier::Device);
  f.ready.wait();
  return f.data;
}

void Gatherer::release_for_host(int g) {
  const GroupState& gr = c_.groups[g];
  if (c_.opts.stage != 3 || in_place(g)) {
    c_.store.release(handed_out(g), Tier::Device);
    return;
  }
  if (!slots_[g].kept_for_host && !gr.persistent) drop(g);
}

}  // namespace strata::engine
