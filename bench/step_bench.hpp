// The state of one run of `strata bench step` (bench/bench_step.cpp), shared by the file
// that measures (bench_step.cpp: the machine, the configurations, their steps) and the one
// that reports (step_report.cpp: the table, its notes and ratios). Internal to bench/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/bench/reference_process.hpp"
#include "strata/bench/report.hpp"
#include "strata/bench/step_peers.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/core/convert.hpp"
#include "strata/core/device.hpp"
#include "strata/model/gpt.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

#ifndef STRATA_TORCH_GPT_STEP_SCRIPT
#define STRATA_TORCH_GPT_STEP_SCRIPT "bench/ref/torch_gpt_step.py"
#endif

namespace strata::bench::step {

struct StepArgs {
  GptShape shape{12, 768, 12, 256, 50257};  // GPT-2 small's shape, 124M parameters
  int micro_batch = 4;   // 1024-row matmuls: sgemm near its peak
  int accum = 4;         // 4096 tokens per optimizer step
  int reps = 3;
  int warmup = 1;
  int lead_in = 1;       // untimed steps of a configuration right before each of its timed ones
  bool checkpointing = false;
  bool cpu_checkpointing = false;  // each engine configuration also with the checkpoints in pinned memory
  std::string dir = ".";
  std::string memory_budget = "6G";      // device budget of the in-memory run
  std::string device_budget = "1G";      // of the offloaded run
  std::string pinned_budget = "1G";      // of the offloaded run
  std::string backend = "cpu";
  std::string cuda_kernels = "reference";  // --cuda-kernels: the cuda model's kernels (strata.cuda_kernels)
  std::string precision = "f32";  // 16 bits: beside fp32, and beside PyTorch autocast
  bool f32_beside = true;         // with 16 bits: the fp32 configurations too
  bool nvme = true;               // the NVMe configuration too
  bool checksums = false;         // xxHash of every NVMe extent, verified on read (strata.checksums)
  bool speculative = false;       // each engine configuration also with the speculative optimizer
  bool speculation_inline = false;  // its updates on the model's thread, not the optimizer lane
  bool no_state_prefetch = false;   // EngineAblation::plain_state_prefetch off
  bool no_in_place = false;         // EngineAblation::params_in_place and grads_in_place off
  bool gpu_optimizer = false;     // cuda: also parameters and optimizer states on the GPU (the GPU optimizer)
  unsigned optimizer_threads = 0;  // CPU Adam's threads (EngineOptions::optimizer_threads); 0: every core
  double ratio = 0.5;             // with gpu_optimizer: also offload_optimizer.ratio this (CPU share), concurrently
  bool torch = true;              // the PyTorch reference (cpu backend, 16 bits)
  bool layout = false;            // print each configuration's resolved layout; time nothing
  std::string python = "/usr/bin/python3";
  std::string torch_script = STRATA_TORCH_GPT_STEP_SCRIPT;
  std::vector<std::string> peers;  // --peers: DeepSpeed ZeRO-Offload/-Infinity, FSDP2 beside (step_peers.hpp)
  std::string peer_script = default_peer_script();
  std::string trace;  // Chrome trace of one configuration's engine (see the options lambda)
  std::vector<std::string> cuda_profile;  // --cuda-profile: labels whose last warm-up step a CUDA profiler records
  OutputOptions out;
};

struct Setup {
  std::string label;
  DType precision = DType::F32;
  bool nvme = false;
  bool speculative = false;            // strata.speculative_optimizer
  bool gpu_optimizer = false;          // states on the GPU, stepped there (offload_optimizer none)
  double ratio = 1.0;                  // offload_optimizer.ratio: below 1, that share on the CPU, the rest on the GPU
  bool cpu_checkpointing = false;      // activation_checkpointing.cpu_checkpointing
  bool torch = false;                  // the PyTorch reference: no engine, it times its own step
  int peer = -1;                       // index in Bench::peers: a peer's process, which times its own step
  bool traced = false;                 // its engine writes --trace
  bool profiled = false;               // --cuda-profile: its last warm-up step inside CUDA's profiler capture
  std::unique_ptr<ZeroEngine> engine;
  GptModel* model = nullptr;
  std::vector<double> seconds, exposed, optimizer, nvme_read, nvme_written, cpu;
  std::vector<double> peak_host;       // a peer's peak resident bytes
};

inline uint64_t nvme_bytes(const StoreStats& st, bool read) {
  uint64_t b = 0;
  for (int t = 0; t < kTierCount; ++t)
    b += read ? st.bytes_moved[static_cast<int>(Tier::Nvme)][t] : st.bytes_moved[t][static_cast<int>(Tier::Nvme)];
  return b;
}

// What a run of bench step holds beside the arguments: the machine, the precisions and
// their peaks, the configurations. Members are destroyed in the reverse of this order: the
// models after the engines that drive them, the device after everything on it.
struct Bench {
  explicit Bench(const StepArgs& args) : a(args) {}
  const StepArgs& a;
  std::filesystem::path swap;  // the NVMe configurations' swap files
  Backend backend = Backend::Cpu;
  bool cuda = false;
  DType precision = DType::F32;  // --precision
  bool sixteen = false;          // 16 bits asked for
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> comm;
  std::unique_ptr<coll::Communicator> nccl;  // device buffers on cuda are GPU memory
  Progress progress{"bench step"};
  std::unique_ptr<ReferenceProcess> torch;
  std::vector<Peer> peers;  // --peers, started or skipped with the reason
  unsigned threads = 1;
  std::vector<DType> precisions;  // fp32, and the 16-bit precision beside it when asked for
  std::vector<double> peaks;      // matmul peak of each precision, FLOP/s
  uint64_t params = 0;
  std::vector<GroupSpec> specs;
  std::vector<GroupSize> sizes;
  std::string memory_label;
  std::vector<Setup> setups;
  std::vector<std::unique_ptr<GptModel>> models;  // one per precision
  trace::Recorder* recorder = nullptr;            // the traced engine's
  uint64_t tokens = 0;                            // per optimizer step

  coll::Communicator& dev_comm() { return nccl ? *nccl : *comm; }
  double peak_of(DType p) const { return peaks[p == precisions.front() ? 0 : 1]; }
  // The setup a row is compared with: same configuration in memory (offload cost), and
  // the same configuration in fp32 (what the precision buys).
  const Setup* find(bool nvme, DType p, bool speculative = false, bool gpu_optimizer = false, double ratio = 1.0,
                    bool cpu_ckpt = false) const {
    for (const Setup& s : setups)
      if (s.engine && s.nvme == nvme && s.precision == p && s.speculative == speculative &&
          s.gpu_optimizer == gpu_optimizer && s.ratio == ratio && s.cpu_checkpointing == cpu_ckpt)
        return &s;
    return nullptr;
  }
};

// The report of a finished run: title and configuration, a row per configuration, and
// the notes (what is measured against what, the options' comparisons, PyTorch's and the
// peers' ratios).
Report step_report(const Bench& b);

}  // namespace strata::bench::step
