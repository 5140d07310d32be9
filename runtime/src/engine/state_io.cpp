#include "state_io.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <thread>

#include "strata/core/value_checks.hpp"

namespace strata::engine {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A standard normal value that depends only on (seed, group, element): every rank and
// every world size computes the same initial model.
float normal_at(uint64_t seed, uint64_t group, uint64_t index) {
  uint64_t h = splitmix(splitmix(seed ^ (group * 0x632be59bd9b4e019ull)) + index);
  uint64_t h2 = splitmix(h);
  double u1 = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;         // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

float init_value(const GroupSpec& s, uint64_t seed, uint64_t group, uint64_t index) {
  if (index >= s.numel) return 0.0f;  // padding
  for (const auto& c : s.constants)
    if (index >= c.begin && index < c.end) return c.value;
  switch (s.init) {
    case InitKind::Zeros: return 0.0f;
    case InitKind::Ones: return 1.0f;
    case InitKind::Normal:
      if (s.init_group >= 0) return s.init_std * normal_at(seed, static_cast<uint64_t>(s.init_group), s.init_offset + index);
      return s.init_std * normal_at(seed, group, index);
  }
  return 0.0f;
}

// out[i] = init_value(s, seed, group, base + i) for i < n, on up to `threads` threads (0:
// every core). Each value depends on its index alone, so the split changes no bit; a 1.1B
// model's initial states took 100 s per engine on one thread (on an H200's host).
void fill_initial(float* out, uint64_t n, const GroupSpec& s, uint64_t seed, uint64_t group, uint64_t base,
                  unsigned threads) {
  const uint64_t per = uint64_t{1} << 20;  // below this, one thread
  unsigned t = threads ? threads : std::max(1u, std::thread::hardware_concurrency());
  t = static_cast<unsigned>(std::min<uint64_t>(t, (n + per - 1) / per));
  auto part = [&](uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; ++i) out[i] = init_value(s, seed, group, base + i);
  };
  if (t <= 1) return part(0, n);
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < t; ++k) pool.emplace_back(part, n * k / t, n * (k + 1) / t);
  part(0, n / t);
  for (std::thread& th : pool) th.join();
}

void init_group(EngineCore& c, int g) {
  const Tier t = c.resolved.optimizer_host_tier;
  GroupState& gr = c.groups[g];
  const uint64_t base = static_cast<uint64_t>(c.rank) * gr.shard;  // global index of the shard
  // The shard's initial values, computed once: the master weights and, rounded to the
  // working type, the parameters. (Allocated where the work runs: sim runs none of it.)
  std::vector<float> vals;
  c.device.host_compute(4.0 * gr.shard, [&] {
    vals.resize(gr.shard);
    fill_initial(vals.data(), gr.shard, gr.spec, c.opts.seed, g, base, c.opts.optimizer_threads);
    // The working copy is these rounded: an initialiser beyond a 16-bit range would make
    // it inf (the C API refuses such initialisers when the group is registered).
    if (c.work_t != DType::F32)
      check_range(vals.data(), std::min(gr.shard, gr.spec.numel - std::min(gr.spec.numel, base)), c.work_t,
                  c.opts.out_of_range, "the initial values of group '" + gr.spec.name + "'",
                  "give initial values the working type can hold, or set strata.out_of_range to \"clamp\"", base);
  });
  for (SubGroupState& sg : gr.sub_groups) {
    // The master weights: the sub-group's own, or (master_in_shard) the shard written below.
    Acquired m = gr.master_in_shard ? Acquired{} : c.store.acquire_for_overwrite(sg.master, t);
    Acquired a = c.store.acquire_for_overwrite(sg.exp_avg, t);
    Acquired v = c.store.acquire_for_overwrite(sg.exp_avg_sq, t);
    when_all({m.ready, a.ready, v.ready}).wait();
    c.device.host_compute(12.0 * sg.n, [&] {
      if (m.data) std::memcpy(m.data, vals.data() + sg.offset, sg.n * 4);
      std::memset(a.data, 0, sg.n * 4);
      std::memset(v.data, 0, sg.n * 4);
    });
    for (TensorId id : {sg.master, sg.exp_avg, sg.exp_avg_sq}) {
      if (id == 0) continue;
      c.store.release(id, t, Access::Write);
      if (t != gr.optimizer_home) c.store.drop(id, t).wait();
    }
  }
  if (c.opts.stage == 3) {
    Acquired p = c.store.acquire_for_overwrite(gr.param_shard, Tier::Pinned);
    p.ready.wait();
    // The working copy is the master weights rounded to the working type.
    c.device.host_compute((4.0 + c.wb) * gr.shard, [&] { convert_from_f32(p.data, c.work_t, vals.data(), gr.shard); });
    c.store.release(gr.param_shard, Tier::Pinned, Access::Write);
    if (c.opts.param_home != Tier::Pinned) {
      if (c.opts.param_home == Tier::Device) c.store.fetch(gr.param_shard, Tier::Device).wait();
      c.store.drop(gr.param_shard, Tier::Pinned).wait();
    }
    return;
  }
  // Replicated parameters: fill this rank's slice, then gather the others.
  Acquired f = c.store.acquire(gr.gathered, Tier::Device);
  f.ready.wait();
  std::vector<std::byte> slice(gr.shard * c.wb);
  c.device.host_compute((4.0 + c.wb) * gr.shard, [&] { convert_from_f32(slice.data(), c.work_t, vals.data(), gr.shard); });
  void* mine = at(f.data, base, c.wb);
  c.reduce_stream.copy_async(mine, slice.data(), gr.shard * c.wb);
  Event copied = c.reduce_stream.record();
  c.comm.all_gather(view(mine, gr.shard, c.work_t), view_mut(f.data, gr.padded, c.work_t), copied).wait();
  c.store.release(gr.gathered, Tier::Device, Access::Write);
}

}  // namespace

void init_shards(EngineCore& c) {
  for (size_t g = 0; g < c.groups.size(); ++g) init_group(c, static_cast<int>(g));
}

std::vector<float> gather_full_params(EngineCore& c, Gatherer& gatherer, int g) {
  const GroupState& gr = c.groups.at(g);
  std::vector<float> out(gr.spec.numel);
  // The full parameters are device memory, which host code may not address (cuda): a
  // stream copies them out on every backend, then they are widened on the host.
  gatherer.with_full(g, [&](const void* src) {
    std::vector<std::byte> raw(gr.spec.numel * c.wb);
    c.reduce_stream.copy_async(raw.data(), src, raw.size());
    c.reduce_stream.synchronize();
    convert_to_f32(out.data(), raw.data(), c.work_t, gr.spec.numel);
  });
  return out;
}

namespace {

// A frozen group's "master weights": its working parameter shard widened (exactly), read
// from wherever it lives through pinned memory (stage 3) or the device (stages 1, 2).
void read_frozen_shard(EngineCore& c, GroupState& gr, float* master) {
  if (c.opts.stage == 3) {
    Acquired p = c.store.acquire(gr.param_shard, Tier::Pinned);
    p.ready.wait();
    c.device.host_compute((4.0 + c.wb) * gr.shard, [&] { convert_to_f32(master, p.data, c.work_t, gr.shard); });
    c.store.release(gr.param_shard, Tier::Pinned);
    if (c.opts.param_home != Tier::Pinned) c.store.drop(gr.param_shard, Tier::Pinned).wait();
    return;
  }
  Acquired f = c.store.acquire(gr.gathered, Tier::Device);
  std::vector<std::byte> raw(gr.shard * c.wb);
  c.reduce_stream.wait(f.ready);
  c.reduce_stream.copy_async(raw.data(), at(f.data, static_cast<uint64_t>(c.rank) * gr.shard, c.wb), raw.size());
  c.reduce_stream.synchronize();
  c.store.release(gr.gathered, Tier::Device);
  c.device.host_compute((4.0 + c.wb) * gr.shard, [&] { convert_to_f32(master, raw.data(), c.work_t, gr.shard); });
}

}  // namespace

void read_optimizer_shard(EngineCore& c, int g, float* master, float* exp_avg, float* exp_avg_sq) {
  GroupState& gr = c.groups.at(g);
  const Tier t = c.resolved.optimizer_host_tier;
  if (gr.frozen) {  // no optimizer state: the parameters, and moments of zero
    read_frozen_shard(c, gr, master);
    std::fill(exp_avg, exp_avg + gr.shard, 0.0f);
    std::fill(exp_avg_sq, exp_avg_sq + gr.shard, 0.0f);
    return;
  }
  if (gr.master_in_shard) {  // the parameter shard is the master weights
    Acquired p = c.store.acquire(gr.param_shard, t);
    p.ready.wait();
    c.device.host_compute(8.0 * gr.shard, [&] { std::memcpy(master, p.data, gr.shard * 4); });
    c.store.release(gr.param_shard, t);
    if (t != c.opts.param_home) c.store.drop(gr.param_shard, t).wait();
  }
  for (SubGroupState& sg : gr.sub_groups) {
    TensorId ids[3] = {sg.master, sg.exp_avg, sg.exp_avg_sq};
    float* outs[3] = {master, exp_avg, exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (ids[k] == 0) continue;  // master_in_shard: read above
      Acquired a = c.store.acquire(ids[k], t);
      a.ready.wait();
      c.device.host_compute(8.0 * sg.n, [&] { std::memcpy(outs[k] + sg.offset, a.data, sg.n * 4); });
      c.store.release(ids[k], t);
      if (t != gr.optimizer_home) c.store.drop(ids[k], t).wait();
    }
  }
}

void write_optimizer_shard(EngineCore& c, Gatherer& gatherer, int g, const float* master, const float* exp_avg,
                           const float* exp_avg_sq) {
  GroupState& gr = c.groups.at(g);
  const Tier t = c.resolved.optimizer_host_tier;
  for (SubGroupState& sg : gr.sub_groups) {
    TensorId ids[3] = {sg.master, sg.exp_avg, sg.exp_avg_sq};
    const float* ins[3] = {master, exp_avg, exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (ids[k] == 0) continue;  // master_in_shard: the parameter shard, written below
      Acquired a = c.store.acquire_for_overwrite(ids[k], t);
      a.ready.wait();
      c.device.host_compute(8.0 * sg.n, [&] { std::memcpy(a.data, ins[k] + sg.offset, sg.n * 4); });
      c.store.release(ids[k], t, Access::Write);
      if (t != gr.optimizer_home) c.store.drop(ids[k], t).wait();
    }
  }
  // The working parameters follow the master weights (or are them: master_in_shard).
  if (c.opts.stage == 3) {
    Acquired p = c.store.acquire_for_overwrite(gr.param_shard, Tier::Pinned);
    p.ready.wait();
    c.device.host_compute((4.0 + c.wb) * gr.shard, [&] { convert_from_f32(p.data, c.work_t, master, gr.shard); });
    c.store.release(gr.param_shard, Tier::Pinned, Access::Write);
    if (c.opts.param_home != Tier::Pinned) c.store.drop(gr.param_shard, Tier::Pinned).wait();
    gatherer.parameters_changed(g);
    return;
  }
  Acquired f = c.store.acquire(gr.gathered, Tier::Device);
  f.ready.wait();
  std::vector<std::byte> working(gr.shard * c.wb);
  convert_from_f32(working.data(), c.work_t, master, gr.shard);
  void* mine = at(f.data, static_cast<uint64_t>(c.rank) * gr.shard, c.wb);
  c.reduce_stream.copy_async(mine, working.data(), working.size());
  Event copied = c.reduce_stream.record();
  c.comm.all_gather(view(mine, gr.shard, c.work_t), view_mut(f.data, gr.padded, c.work_t), copied).wait();
  c.store.release(gr.gathered, Tier::Device, Access::Write);
}

}  // namespace strata::engine
