// The planner behind `strata plan` (docs/plan.md): given a model, a cluster
// and a strategy (ZeRO stage, offload targets, micro-batch, sequence, activation
// checkpointing), it says how many bytes each rank holds in each tier, whether that fits,
// which link must carry how much, and how long a step takes, before anyone spends a
// GPU-hour on it.
//
// The analytic model counts bytes from the engine's own layout (shard_layout.hpp, the
// code the engine allocates from): every group padded to world x 1024 elements and cut
// into equal shards; fp32 working
// parameters, gradients, master weights and both Adam moments (20 bytes per parameter
// over the data-parallel group, not ZeRO's 16: the engine has no 16-bit working copy
// yet); the acquire order of the GPT (model/gpt_layout.hpp, gpt_schedule); one
// collective lane, one PCIe link per direction, one NVMe read and one write queue per
// rank. Its step time is a per-phase maximum over those resources (forward, backward,
// optimizer) plus what cannot overlap (the first fetch of a step, the last gradient's
// reduction). `simulate_plan` runs the real engine on the sim backend for the same
// configuration, so the two can be compared (docs/plan.md, tests/runtime/test_plan.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/sim.hpp"
#include "strata/memory/tier.hpp"
#include "strata/model/gpt_layout.hpp"
#include "strata/runtime/config/config.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata::plan {

// ----------------------------------------------------------------------------------------
// Inputs

struct ModelPreset {
  std::string name;    // "gpt-1.3b", ..., "10t"
  GptShape shape;
  std::string source;  // where the shape comes from
};
const std::vector<ModelPreset>& model_presets();
// Throws ConfigError naming the unknown preset and listing the valid ones.
const ModelPreset& find_model_preset(const std::string& name);

// One cluster, as the planner sees it. Per-GPU figures are for one rank; per-node figures
// are shared by the node's GPUs. Bandwidths in bytes/s, sizes in bytes, times in seconds.
struct ClusterSpec {
  std::string name;
  std::string description;
  bool cpu_backend = false;       // Strata's cpu backend: "device" memory is host RAM,
                                  // kernels are sgemm on the cores, the optimizer runs on
                                  // the same cores (one after the other, never together)
  int gpus_per_node = 1;          // ranks per node
  int nodes = 1;
  double hbm = 0;                 // bytes per GPU (cpu backend: the device arena in RAM)
  double device_reserve = 0;      // bytes per GPU the runtime cannot use (CUDA context,
                                  // allocator slack)
  double hbm_bandwidth = 0;       // bytes/s per GPU: element-wise kernels
  double gpu_flops = 0;           // FLOP/s per GPU, peak of the precision Strata computes in
  double matmul_efficiency = 0;   // fraction of gpu_flops the model's matmuls reach
  double host_ram = 0;            // bytes per node
  double host_ram_usable = 0.9;   // fraction of host_ram the pinned tier may take
  double host_bandwidth = 0;      // bytes/s per node the CPU optimizer streams through
                                  // (28 bytes per parameter and step, plus copies)
  double nvme_capacity = 0;       // bytes per node (0: no NVMe)
  double nvme_read = 0;           // bytes/s per node, all drives together
  double nvme_write = 0;          // bytes/s per node
  double pcie = 0;                // bytes/s per GPU and direction, host <-> device
  double intra_node = 0;          // bytes/s per GPU of collective bus bandwidth in a node
  double network = 0;             // bytes/s per node between nodes (all NICs)
  double pcie_latency = 10e-6;    // s per copy
  double nvme_latency = 80e-6;    // s per transfer
  double collective_latency = 20e-6;  // s per collective
  std::vector<std::string> measured;  // cpu preset: what was measured, how, and the figure

  int world() const { return gpus_per_node * nodes; }
  // Per-rank shares of the node's figures and the collective bandwidth one rank sees on a
  // ring (in a node: intra_node; across nodes: the smaller of that and network share).
  double nvme_read_per_rank() const { return nvme_read / gpus_per_node; }
  double nvme_write_per_rank() const { return nvme_write / gpus_per_node; }
  double host_bandwidth_per_rank() const { return host_bandwidth / gpus_per_node; }
  double pinned_per_rank() const { return host_ram * host_ram_usable / gpus_per_node; }
  double nvme_per_rank() const { return nvme_capacity / gpus_per_node; }
  double collective_bandwidth() const;
};

struct ClusterPreset {
  std::string name;
  std::string source;
};
// The names of the presets ("dgx-2", "dgx-a100", "dgx-h100", "gh200", "cpu").
const std::vector<ClusterPreset>& cluster_presets();
// Throws ConfigError listing the valid names. "cpu" measures this machine (measure_cpu).
ClusterSpec find_cluster_preset(const std::string& name, const std::string& nvme_dir = "");

// This machine's cpu backend, measured now (about a second): sgemm FLOP/s (cpu_sgemm) at
// the shape of `model`'s MLP matmul, memcpy bandwidth, the CPU Adam's rate, RAM from
// /proc/meminfo, and an O_DIRECT write and read of `nvme_dir` (skipped when empty).
// micro_batch: the sequences per micro-step the GPT kernels are calibrated at (their
// efficiency grows with the rows of each matmul).
ClusterSpec measure_cpu(const GptShape& model, const std::string& nvme_dir, int micro_batch = 1);

// Throws ConfigError naming every figure that is impossible (no GPUs, a negative or zero
// bandwidth, efficiency above 1, ...) and what to give instead.
// The largest cluster `strata plan` models: validate() refuses more (the rank count is an
// int, and per-rank tables are built).
inline constexpr int kMaxGpusPerNode = 1024;
inline constexpr int kMaxNodes = 1 << 20;
inline constexpr int64_t kMaxWorld = 1 << 20;
void validate(const ClusterSpec& c);

struct Strategy {
  int stage = 3;
  OffloadDevice offload_param = OffloadDevice::None;      // stage 3 only
  OffloadDevice offload_optimizer = OffloadDevice::Cpu;
  int micro_batch = 1;              // sequences per rank per micro-step
  int seq_len = 0;                  // 0: the model's
  int grad_accum = 1;               // micro-steps per optimizer step
  bool checkpointing = true;        // recompute each block in backward
  int prefetch_groups = 2;          // gathered groups ahead of the one in use (stage 3)
  uint64_t sub_group_elems = 0;     // optimizer sub-group; 0: chosen (<= 1/4 of a shard)
  uint64_t shard_align_elems = ShardRules::kDefaultAlignElems;  // the engine's shard alignment
  DType precision = DType::F32;     // working parameters and gradients: F32, BF16 or F16
  // strata.speculative_optimizer: the optimizer's sub-groups stepped during the last
  // micro-step's backward (a Next set of states for each: 12 more bytes per parameter in
  // the optimizer's tier), the groups the backward pass reaches last after it.
  bool speculative = false;
  // offload_optimizer.ratio (ShardStrategy::optimizer_ratio): below 1, the groups past that
  // fraction of the states keep them in HBM and the GPU optimizer steps them, while CPU
  // Adam steps the rest at the same time.
  double optimizer_ratio = 1.0;
  // With checkpointing, where the engine keeps the activation checkpoints between forward
  // and backward (ShardStrategy::checkpoints): None, on the device; Cpu, in pinned memory
  // (activation_checkpointing.cpu_checkpointing), becoming Nvme when pinned memory has no
  // room for them beside the states and the cluster has NVMe, as the engine decides; Nvme.
  OffloadDevice checkpoints = OffloadDevice::None;
  // Per-tensor gathers and tiles (gpt_parts, stage 3): blocks gathered in parts of at most
  // part_elems elements (zero_optimization.stage3_prefetch_bucket_size; 0: whole blocks),
  // every block linear in tile_factor tiles (strata.tile_factor), and those larger than
  // tile_size elements in tiles of at most that (strata.tile_size). Each part is an engine
  // group: gathered, released and reduce-scattered on its own (with checkpointing, twice
  // per backward: the recompute releases each part after use and the backward gathers it
  // again, as the cpu model does).
  uint64_t part_elems = 0;
  int tile_factor = 1;
  uint64_t tile_size = 0;
  // The fraction of the parameters that is frozen (a LoRA run: 0.99), in [0, 1]. Each of
  // the engine's groups is planned as a frozen group of that share of its elements
  // (rounded) beside a trained group of the rest, as a fine-tune holds a frozen base and
  // its adapters: the frozen ones hold their working parameters alone (no gradient,
  // master weights or moments; GroupLayout::frozen) and are never reduced or stepped.
  double frozen_fraction = 0.0;
  // Layouts that keep collectives inside a node (docs/multinode.md). mics_shard_size N
  // (zero_optimization.mics_shard_size): the states sharded within groups of N
  // consecutive ranks (within a node, or whole nodes), each step's gradient shards
  // all-reduced across the groups; 0: over every rank. hpz N
  // (zero_optimization.zero_hpz_partition_size, stage 3): a secondary partition of the
  // parameters over N ranks of a node, which every gather after a group's first in a
  // step reads; 1: off. At most one of the two.
  int mics_shard_size = 0;
  int hpz = 1;
  // ZeRO++'s quantized collectives (docs/multinode.md): qwz (zero_quantized_weights, stage
  // 3), the gathers from the primary shards as int8 blocks; qgz (zero_quantized_gradients,
  // stages 2 and 3), the reduce-scatters as int8 all-to-alls, in two hops (the node's
  // ranks, then one rank a node) where the world spans nodes of several ranks; blocks of
  // quantized_block elements with an fp32 scale each. The engine runs them on the cpu
  // backend only: on GPUs the plan says so in its notes. Not with MiCS (qgz).
  bool qwz = false, qgz = false;
  int quantized_block = 256;
  bool parted() const { return part_elems > 0 || tile_factor > 1 || tile_size > 0; }
  std::string describe() const;     // "stage 3, params nvme, optimizer nvme, mb 4, ckpt"
};
// Throws ConfigError naming the field and the valid values.
void validate(const Strategy& s);

// ----------------------------------------------------------------------------------------
// Output

struct TierBytes {        // bytes per rank
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0;
  double total() const { return params + grads + optimizer + activations + buffers; }
};

struct TierPlan {
  Tier tier = Tier::Device;
  TierBytes need;
  double budget = 0;      // bytes per rank
  bool fits() const { return need.total() <= budget; }
  double short_by() const { return fits() ? 0 : need.total() - budget; }
};

// One link's load in a step and what it would need to stay hidden.
struct LinkLoad {
  std::string name;       // "nvme read", "nvme write", "pcie h2d", "pcie d2h", "collectives", "cpu optimizer"
  double bytes = 0;       // per rank per step
  double bandwidth = 0;   // bytes/s available per rank
  double busy_s = 0;      // bytes / bandwidth + latencies
  double window_s = 0;    // compute time it overlaps with
  double needed = 0;      // bytes/s to fit in window_s (0: nothing to move)
};

struct Plan {
  GptShape shape;                   // with the strategy's sequence length
  Strategy strategy;
  ClusterSpec cluster;
  uint64_t params = 0;              // model parameters
  int world = 1;
  std::array<TierPlan, kTierCount> tiers;
  bool fits = true;
  std::vector<std::string> problems;  // why it does not fit or cannot run, with numbers and the fix
  // Seconds per optimizer step (all micro-steps), per rank.
  double compute_s = 0;             // kernels: forward, backward, recompute
  double forward_s = 0, backward_s = 0, optimizer_s = 0, boundary_s = 0;
  double step_s = 0;
  double exposed_s = 0;             // step_s - compute_s - optimizer compute: transfers not hidden
  double tokens_per_step = 0;       // over the whole data-parallel group
  double tokens_per_s = 0;
  double model_flops_per_token = 0; // gpt_flops_per_token (no recompute)
  // Bytes one rank sends in one step's collectives, as a ring moves them, counted as the
  // engine counts them (EngineStats::*_collective_bytes): over the ranks the states are
  // sharded over (every rank, or a MiCS group), across the MiCS groups, and within hpZ's
  // groups (the gathers from the secondary partitions). inter_node_bytes: the part of
  // those sent over collectives whose ranks span nodes.
  double shard_collective_bytes = 0, replica_collective_bytes = 0, secondary_collective_bytes = 0;
  // qgZ in two hops: the all-to-alls within the node and across the nodes
  // (EngineStats::node_collective_bytes, cross_collective_bytes).
  double node_collective_bytes = 0, cross_collective_bytes = 0;
  double inter_node_bytes = 0;
  // What the reader should know that is not a problem (the plan fits or not without it):
  // a quantized collective planned for GPUs, where the engine does not run it yet.
  std::vector<std::string> notes;
  double mfu = 0;                   // model FLOPs / (step time x world x gpu_flops)
  std::vector<LinkLoad> links;
  std::string bottleneck;           // in words
  // How the engine is set for this plan (simulate_plan uses exactly these).
  EngineOptions engine;
  EngineAblation ablation;  // all on; the planner's tests turn one off to measure it
  ResolvedLayout resolved;  // what the engine would run: resolve(engine, ablation, the groups, world)
  double model_activations = 0;     // of the device's activations, what the model holds (not the engine)
  double lookahead_bytes = 0;       // of the device's buffers, the look-ahead's (prefetch_groups gathered groups)
  SimCostModel cost;
};

// The analytic plan. Never throws for a configuration that does not fit: fits = false and
// problems say why. Throws ConfigError for invalid input.
Plan make_plan(const GptShape& model, const ClusterSpec& cluster, const Strategy& strategy);

// Activation bytes per rank for one micro-step that the model holds itself: every block's
// saved tensors, the embedding output and the final norm; or with checkpointing one block
// recomputed and the final norm (the checkpoints, each block's input and the final
// residual, are the engine's: checkpoint_bytes, counted in the layout's tiers); plus one
// chunk of logits and a block's activation gradients.
double activation_bytes(const GptShape& shape, int micro_batch, bool checkpointing, DType precision = DType::F32);
// Bytes of one activation checkpoint (a block's input, fp32), and how many a micro-step keeps.
double checkpoint_bytes(const GptShape& shape, int micro_batch);
inline int checkpoint_count(const GptShape& shape) { return shape.layers + 1; }

// --search: every strategy in the space, the fastest that fits first.
struct Candidate {
  Strategy strategy;
  Plan plan;
  bool chosen = false;
  std::string verdict;  // "chosen", "doesn't fit: device short by 3.2 GiB", "slower by 41% (2.1 s/step)"
};
struct SearchSpace {
  std::vector<int> stages{1, 2, 3};
  std::vector<OffloadDevice> param{OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme};
  std::vector<OffloadDevice> optimizer{OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme};
  std::vector<int> micro_batches{1, 2, 4, 8, 16};
  std::vector<bool> checkpointing{true, false};
  // offload_optimizer.ratio: tried where the optimizer is offloaded on GPUs (a ratio
  // below 1 needs both); 1 everywhere else.
  std::vector<double> optimizer_ratios{1.0, 0.75, 0.5, 0.25};
  // With checkpointing: on the device, or off it (cpu_checkpointing: pinned, or NVMe).
  std::vector<OffloadDevice> checkpoints{OffloadDevice::None, OffloadDevice::Cpu};
  // Stage 3: tile factors tried (1: whole blocks); those that do not divide the model's
  // linears are skipped. With tiles, parts are the tiles (part_elems from the base).
  std::vector<int> tile_factors{1, 4, 16};
  // Stage 3: shallower look-aheads (prefetch_groups) tried, deepest first, each only
  // where the base's and the deeper ones do not fit (a look-ahead costs room, not speed).
  std::vector<int> shallower_prefetch{1, 0};
  // On more than one node: the base's layout (flat unless it names one), MiCS with a node
  // a group (mics_shard_size = GPUs per node) and, at stage 3, hpZ with a node's
  // secondary partitions (hpz = GPUs per node).
  bool node_layouts = true;
  // With node_layouts: ZeRO++'s quantized collectives too, flat and with hpZ (qwZ at stage
  // 3 with qgZ; qgZ alone at stage 2).
  bool quantized = true;
};
// Ranked by tokens/s (fitting ones first). Throws nothing for an empty result: every
// candidate is there with its verdict. Each candidate's plan has its figures but not its
// resolved layout's groups (make_plan of its strategy gives the whole plan).
std::vector<Candidate> search(const GptShape& model, const ClusterSpec& cluster, const Strategy& base,
                              const SearchSpace& space = {});

// --largest: the largest model of one width that fits. The ladder keeps every field of
// `width` but the depth (d_model, heads, kv_heads, ffn, vocab, seq_len, the family) and
// grows the layers: rung k (k >= 1) has k x layer_step blocks, up to max_layers. The
// walk doubles the rung until a plan does not fit, then bisects, so the answer is a rung
// that fits whose next rung does not (each fit is make_plan's: every tier and every
// problem no budget fixes). The layer count is what the engine's memory grows with at a
// fixed width; the width ladder a paper would use changes the kernels' shapes too.
struct LadderRung {
  int rung = 0;                  // k: layers = k x layer_step
  GptShape shape;
  uint64_t params = 0;
  bool fits = false;
  std::string binding;           // the tier nearest its budget ("nvme 97%"), or what stops it
  Plan plan;
};
struct LargestFit {
  int layer_step = 1;
  int max_layers = 0;
  std::vector<LadderRung> probed;  // every rung planned, in the order planned
  int largest = -1;                // index in probed of the answer; -1: not even rung 1 fits
  int next = -1;                   // index in probed of the rung after it; -1: max_layers reached
  bool bounded() const { return largest >= 0 && next < 0; }  // every rung up to max_layers fits
};
inline constexpr int kMaxLadderLayers = 16384;  // strata.model.layers' limit
// Throws ConfigError for a layer_step below 1 or a max_layers below layer_step or above
// kMaxLadderLayers, and for anything make_plan refuses.
LargestFit largest_fit(const GptShape& width, const ClusterSpec& cluster, const Strategy& strategy,
                       int layer_step = 1, int max_layers = kMaxLadderLayers);

// --simulate: the real engine on the sim backend, rank 0 of the symmetric data-parallel
// group, with the plan's cost model, budgets (the device budget less the activations the
// plan counted, which the synthetic model does not allocate) and the GPT's acquire order.
struct SimulateReport {
  int steps = 0;
  std::vector<double> step_s;          // simulated seconds, each step
  double step_s_steady = 0;            // the last step (the first starts from an idle machine)
  double compute_s = 0, exposed_s = 0, optimizer_s = 0;  // of the last step
  // Of exposed_s: the optimizer's waits for states at step(), and the speculative
  // updates' during the backward pass (EngineStats), in the last step.
  double optimizer_wait_s = 0, speculation_wait_s = 0;
  std::array<uint64_t, kTierCount> peak{};    // bytes, per tier
  std::array<uint64_t, kTierCount> budget{};  // bytes given to the engine
  std::array<std::array<uint64_t, kTierCount>, kTierCount> bytes_moved{};  // last step [from][to]
  double device_budget_less_activations = 0;  // bytes the model's own activations took off the device budget
  // Bytes rank 0 sent in collectives per step (the engine's counters over the run / steps):
  // Plan's *_collective_bytes.
  double shard_collective_bytes = 0, replica_collective_bytes = 0, secondary_collective_bytes = 0;
  double node_collective_bytes = 0, cross_collective_bytes = 0;
  double wall_s = 0;                   // real seconds the simulation took
  double peak_rss_bytes = 0;           // the simulator's own peak host memory (getrusage)
  std::string device;
};
// Throws ConfigError / OutOfBudget as the engine does at start-up.
SimulateReport simulate_plan(const Plan& plan, int steps = 3);

}  // namespace strata::plan
