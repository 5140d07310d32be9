// Trains a small GPT under the ZeRO engine with a given stage and offload, so that runs
// at different world sizes and settings can be compared step by step (the GPT's
// counterpart of engine_harness.hpp's residual MLP).
#pragma once

#include <random>
#include <span>
#include <vector>

#include "engine_harness.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/engine/parted_source.hpp"
#include "strata/runtime/train/train.hpp"

namespace strata::testing_engine {

inline GptShape small_gpt() { return {2, 32, 2, 16, 64}; }
// Llama of the same size: grouped-query attention (4 heads, 2 kv heads), SwiGLU of 48,
// rope_theta 500000, an untied head.
inline GptShape small_llama() {
  GptShape s{2, 32, 4, 16, 64};
  s.arch = Arch::Llama;
  s.kv_heads = 2;
  s.ffn = 48;
  s.rope_theta = 500000;
  s.norm_eps = 1e-6;
  return s;
}
constexpr int kGptGlobalBatch = 4;  // sequences per micro-step, over all ranks

// Sequence `row` of micro-step (step, micro): an arithmetic progression mod vocab with a
// random start and stride in {1, 2, 3}, which the model learns to continue.
inline void gpt_row(int step, int micro, int row, const GptShape& s, int32_t* x, int32_t* y) {
  std::mt19937 rng(static_cast<uint32_t>(step * 7919 + micro * 104729 + row * 1299709 + 3));
  const int start = static_cast<int>(rng() % s.vocab), stride = 1 + static_cast<int>(rng() % 3);
  for (int t = 0; t < s.seq_len; ++t) {
    x[t] = (start + stride * t) % s.vocab;
    y[t] = (start + stride * (t + 1)) % s.vocab;
  }
}

// `replicas` (MiCS): comm and host span this rank's group of consecutive ranks, replicas
// the ranks with its index in the other groups; the data is split over all of them.
// `hpz` (ZeRO++ hpZ): the consecutive ranks of comm that share secondary partitions
// (EngineOptions::hpz_partition_size is its size).
inline RunResult train_gpt(coll::Communicator& comm, coll::Communicator& host, const RunSpec& spec, int steps,
                           const std::string& nvme_dir, bool checkpointing = false,
                           const GptShape& shape = small_gpt(), coll::Communicator* replicas = nullptr,
                           coll::Communicator* hpz = nullptr) {
  auto device = make_device({});
  // Look-ahead: three blocks; with parts, the bucket bounds both (one key in strata train).
  EngineOptions o = test_engine_options(spec, spec.part_bucket ? spec.part_bucket : 13'333, nvme_dir);
  o.optimizer.lr = 1e-2f;
  if (hpz) o.hpz_partition_size = hpz->size();
  const int groups = replicas ? replicas->size() : 1;
  const int world = comm.size() * groups, rank = (replicas ? replicas->rank() : 0) * comm.size() + comm.rank();
  const int local = kGptGlobalBatch / world;
  GptOptions mo{local, checkpointing ? ActivationCheckpointing::PerBlock : ActivationCheckpointing::None,
                spec.precision};
  if (spec.checkpoints) {  // the engine holds them, as strata train has it
    mo.checkpoints_from_source = true;
    o.checkpoints.count = shape.layers + 1;
    o.checkpoints.bytes = static_cast<uint64_t>(local) * shape.seq_len * shape.d_model * sizeof(float);
    o.cpu_checkpointing = *spec.checkpoints != OffloadDevice::None;
    if (*spec.checkpoints == OffloadDevice::Nvme) o.checkpoints.home = Tier::Nvme;
  }
  // Blocks in parts when asked (as strata train cuts them; the engine learns their order).
  const std::vector<std::vector<uint64_t>> parts =
      gpt_parts(shape, spec.part_bucket ? spec.part_bucket : UINT64_MAX, spec.tile_factor);
  const std::vector<GroupSpec> specs = gpt_group_specs(shape, parts);
  o.first_gradient_held = shape.tied();  // the tied head's, as strata train has it
  if (spec.minimum_device_budget) {
    std::vector<GroupSize> sizes;
    for (const GroupSpec& g : specs) sizes.push_back({g.name, g.numel});
    const ShardLayout L = make_shard_layout(sizes, o.shard_strategy(comm.size()));
    // Plus one largest group in the working type: the pool's placement is not perfect
    // packing (docs/architecture.md, Tiers).
    o.store.device_budget = L.need[int(Tier::Device)].homes() + L.device_working +
                            L.max_padded * L.elem_bytes(StateRole::GatherBuffer);
  }
  ZeroEngine engine(*device, comm, host, o, specs, test_engine_ablation(spec), replicas, hpz);
  const bool parted = engine.num_groups() != static_cast<int>(parts.size());
  if (spec.give_schedule && !parted) engine.set_schedule(gpt_schedule(shape));
  Gpt model(shape, mo);
  std::vector<int32_t> x(static_cast<size_t>(local) * shape.seq_len), y(x.size());
  RunResult r;
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    for (int m = 0; m < spec.accum; ++m) {
      for (int i = 0; i < local; ++i)
        gpt_row(step, m, rank * local + i, shape, &x[i * shape.seq_len], &y[i * shape.seq_len]);
      engine.begin_micro_step();
      PoisoningSource poisoning(engine, step == spec.poison_step && rank == spec.poison_rank && m == spec.accum - 1);
      PartedSource source(poisoning, parts);
      loss += model.forward_backward(source, x.data(), y.data(), static_cast<float>(engine.loss_scale()));
    }
    host.all_reduce(std::span<double>(&loss, 1)).wait();
    if (replicas) replicas->all_reduce(std::span<double>(&loss, 1)).wait();
    r.losses.push_back(loss / (world * spec.accum));
    r.stepped.push_back(engine.step());
    r.norms.push_back(engine.stats().last_grad_norm);
    if (spec.snapshots) r.states.push_back(snapshot(engine));
  }
  r.train_stats = engine.stats();
  // The model's groups' weights, parts put back together.
  for (int g = 0, e = 0; g < static_cast<int>(parts.size()); ++g) {
    std::vector<float> w;
    for (size_t p = 0; p < parts[static_cast<size_t>(g)].size(); ++p, ++e) {
      const std::vector<float> part = engine.gather_full_params(e);
      w.insert(w.end(), part.begin(), part.end());
    }
    r.weights.push_back(std::move(w));
  }
  r.stats = engine.stats();
  return r;
}

}  // namespace strata::testing_engine
