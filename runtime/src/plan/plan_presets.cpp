// Model and cluster presets of the planner, the validation of cluster figures, and the
// measurement of this machine for the cpu backend's preset (plan.hpp).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/model/cpu_sgemm.hpp"
#include "strata/model/gpt.hpp"
#include "strata/offload/cpu_adam.hpp"
#include "strata/runtime/plan/plan.hpp"
#include "strata/runtime/plan/plan_detail.hpp"
#include "strata/runtime/train/train.hpp"
#include "strata/runtime/engine/zero_engine.hpp"

namespace strata::plan {

namespace {

constexpr double GB = 1e9, TB = 1e12, GiB = 1024.0 * 1024 * 1024;

GptShape shape(int layers, int d, int heads, int seq = 2048, int vocab = 50257) {
  GptShape s;
  s.layers = layers;
  s.d_model = d;
  s.heads = heads;
  s.seq_len = seq;
  s.vocab = vocab;
  return s;
}

GptShape llama(int layers, int d, int heads, int kv_heads, int ffn, int seq, int vocab, double theta) {
  GptShape s = shape(layers, d, heads, seq, vocab);
  s.arch = Arch::Llama;
  s.kv_heads = kv_heads;
  s.ffn = ffn;
  s.rope_theta = theta;
  return s;
}

std::string fmt(double v, const char* unit) {
  std::ostringstream os;
  os.precision(3);
  os << v;
  if (*unit) os << " " << unit;
  return os.str();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  // GPT-3 shapes: Brown et al. 2020, Table 2.1 (13B's d_model 5140 rounded to 5120 so that
  // 40 heads divide it; 1.3B with 16 heads of 128). 20B: GPT-NeoX-20B (Black et al. 2022).
  // 530B: Megatron-Turing NLG (Smith et al. 2022). 1T: Narayanan et al. 2021 (Megatron-LM
  // at scale), Table 1. 10T and 32T: Strata's own shapes at that table's aspect (the
  // ZeRO-Infinity paper's exact shapes are not reproduced here); docs/plan.md says so.
  // 1T-deep: 1T parameters in blocks whose fp32 gather and on-device activation
  // checkpoints fit a 32 GB V100 (docs/plan.md, "Where Strata disagrees").
  static const std::vector<ModelPreset> presets = {
      {"gpt-125m", shape(12, 768, 12), "GPT-3 Small, Brown et al. 2020 Table 2.1"},
      {"gpt-1.3b", shape(24, 2048, 16), "GPT-3 XL, Brown et al. 2020 Table 2.1"},
      {"gpt-2.7b", shape(32, 2560, 32), "GPT-3 2.7B, Brown et al. 2020 Table 2.1"},
      {"gpt-6.7b", shape(32, 4096, 32), "GPT-3 6.7B, Brown et al. 2020 Table 2.1"},
      {"gpt-13b", shape(40, 5120, 40), "GPT-3 13B, Brown et al. 2020 Table 2.1 (d_model 5140 -> 5120)"},
      {"gpt-20b", shape(44, 6144, 64), "GPT-NeoX-20B, Black et al. 2022"},
      {"gpt-175b", shape(96, 12288, 96), "GPT-3 175B, Brown et al. 2020 Table 2.1"},
      {"gpt-530b", shape(105, 20480, 128), "Megatron-Turing NLG 530B, Smith et al. 2022"},
      {"gpt-1t", shape(128, 25600, 160), "1T, Narayanan et al. 2021 Table 1"},
      {"gpt-1t-deep", shape(1242, 8192, 64, 256), "Strata's 1T that fits one DGX-2: narrower blocks, context 256"},
      {"gpt-10t", shape(128, 80000, 500), "Strata's 10T shape (1T's 128 layers, wider)"},
      {"gpt-32t", shape(256, 102400, 800), "Strata's 32T shape (twice the layers, wider)"},
      // Llama: the published config.json of each (Touvron et al. 2023; Meta Llama 3, 2024).
      {"llama2-7b", llama(32, 4096, 32, 32, 11008, 4096, 32000, 10000), "Llama 2 7B, meta-llama/Llama-2-7b-hf"},
      {"llama2-13b", llama(40, 5120, 40, 40, 13824, 4096, 32000, 10000), "Llama 2 13B, meta-llama/Llama-2-13b-hf"},
      {"llama2-70b", llama(80, 8192, 64, 8, 28672, 4096, 32000, 10000), "Llama 2 70B, meta-llama/Llama-2-70b-hf"},
      {"llama3-8b", llama(32, 4096, 32, 8, 14336, 8192, 128256, 500000), "Llama 3 8B, meta-llama/Meta-Llama-3-8B"},
      {"llama3-70b", llama(80, 8192, 64, 8, 28672, 8192, 128256, 500000),
       "Llama 3 70B, meta-llama/Meta-Llama-3-70B"},
  };
  return presets;
}

const ModelPreset& find_model_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name || p.name == "gpt-" + name) return p;
  std::string valid;
  for (const auto& p : model_presets()) valid += (valid.empty() ? "" : ", ") + p.name;
  throw ConfigError("unknown model preset '" + name + "'; valid presets: " + valid +
                    " (or give --layers, --d-model, --heads, --seq and --vocab)");
}

double ClusterSpec::collective_bandwidth() const {
  if (nodes <= 1) return intra_node;
  // A ring across nodes: each rank's share of the node's NICs, unless NVLink is slower.
  return std::min(intra_node, network / gpus_per_node);
}

const std::vector<ClusterPreset>& cluster_presets() {
  static const std::vector<ClusterPreset> presets = {
      {"dgx-2", "16x V100-SXM3 32 GB, 1.5 TB DDR4, 30 TB NVMe (the node of the ZeRO-Infinity and ZeRO-Offload papers)"},
      {"dgx-a100", "8x A100-SXM4 80 GB, 2 TB DDR4, 30 TB NVMe Gen4, 8x HDR 200 Gb/s"},
      {"dgx-h100", "8x H100-SXM5 80 GB, 2 TB DDR5, 30 TB NVMe Gen4, 8x NDR 400 Gb/s"},
      {"gh200", "1x GH200 Grace Hopper: H100 96 GB HBM3, 480 GB LPDDR5X over NVLink-C2C"},
      {"h200-1", "1x H200 141 GB (139 GiB usable), 128 GiB RAM, 64 GiB disk, 16 cores: the lent GPU machine (issue #39)"},
      {"cpu", "this machine, Strata's cpu backend, measured now"},
  };
  return presets;
}

namespace {

// The machine lent for GPU checks: one H200 SXM (nvidia-smi: 143771 MiB, of which 139 GiB
// usable), 128 GiB of RAM, a 64 GiB disk, 16 cores, PCIe Gen5 x16. The tier sizes decide
// what fits; the rates are the parts' data sheets (HBM3e 4.8 TB/s, 989 TFLOP/s dense bf16)
// and, for the host and the disk of a 16-core VM, estimates that shape only the predicted
// step time, not the fit.
ClusterSpec lent_h200() {
  ClusterSpec c;
  c.name = "h200-1";
  c.description = cluster_presets()[4].source;
  c.gpus_per_node = 1;
  c.hbm = 139 * GiB;
  c.device_reserve = 2 * GiB;
  c.hbm_bandwidth = 4800 * GB;
  c.gpu_flops = 989e12;
  c.matmul_efficiency = 0.5;
  c.host_ram = 128 * GiB;
  c.host_bandwidth = 100 * GB;
  c.nvme_capacity = 64 * GiB;
  c.nvme_read = 2 * GB;
  c.nvme_write = 1 * GB;
  c.pcie = 50 * GB;
  c.intra_node = 50 * GB;
  c.network = 50 * GB;
  return c;
}

}  // namespace

ClusterSpec find_cluster_preset(const std::string& name, const std::string& nvme_dir) {
  ClusterSpec c;
  c.name = name;
  if (name == "dgx-2") {
    // Peak: V100 fp16 tensor cores. PCIe 3.0 x16 per GPU (two GPUs share a switch uplink
    // to the CPUs: about 12 GB/s each when both move data). NVMe: 8 x 3.84 TB, about 25 GB/s
    // aggregate read as used in the ZeRO-Infinity paper. NVSwitch: ~120 GB/s NCCL bus
    // bandwidth per GPU. 8 x 100 Gb/s InfiniBand. Two Xeon 8168: ~150 GB/s streamed.
    c.description = cluster_presets()[0].source;
    c.gpus_per_node = 16;
    c.hbm = 32 * GiB;
    c.device_reserve = 1.5 * GiB;
    c.hbm_bandwidth = 900 * GB;
    c.gpu_flops = 125e12;
    c.matmul_efficiency = 0.5;
    c.host_ram = 1.5 * TB;
    c.host_bandwidth = 150 * GB;
    c.nvme_capacity = 30 * TB;
    c.nvme_read = 25 * GB;
    c.nvme_write = 20 * GB;
    c.pcie = 12 * GB;
    c.intra_node = 120 * GB;
    c.network = 100 * GB;
  } else if (name == "dgx-a100") {
    c.description = cluster_presets()[1].source;
    c.gpus_per_node = 8;
    c.hbm = 80 * GiB;
    c.device_reserve = 2 * GiB;
    c.hbm_bandwidth = 2000 * GB;
    c.gpu_flops = 312e12;
    c.matmul_efficiency = 0.5;
    c.host_ram = 2 * TB;
    c.host_bandwidth = 300 * GB;
    c.nvme_capacity = 30 * TB;
    c.nvme_read = 50 * GB;
    c.nvme_write = 25 * GB;
    c.pcie = 24 * GB;
    c.intra_node = 230 * GB;
    c.network = 200 * GB;
  } else if (name == "dgx-h100") {
    c.description = cluster_presets()[2].source;
    c.gpus_per_node = 8;
    c.hbm = 80 * GiB;
    c.device_reserve = 2 * GiB;
    c.hbm_bandwidth = 3350 * GB;
    c.gpu_flops = 989e12;
    c.matmul_efficiency = 0.5;
    c.host_ram = 2 * TB;
    c.host_bandwidth = 500 * GB;
    c.nvme_capacity = 30 * TB;
    c.nvme_read = 50 * GB;
    c.nvme_write = 25 * GB;
    c.pcie = 50 * GB;
    c.intra_node = 360 * GB;
    c.network = 400 * GB;
  } else if (name == "gh200") {
    // NVLink-C2C: 900 GB/s both directions, 450 each way. One superchip per node.
    c.description = cluster_presets()[3].source;
    c.gpus_per_node = 1;
    c.hbm = 96 * GiB;
    c.device_reserve = 2 * GiB;
    c.hbm_bandwidth = 4000 * GB;
    c.gpu_flops = 989e12;
    c.matmul_efficiency = 0.5;
    c.host_ram = 480 * GB;
    c.host_bandwidth = 450 * GB;
    c.nvme_capacity = 8 * TB;
    c.nvme_read = 14 * GB;
    c.nvme_write = 10 * GB;
    c.pcie = 450 * GB;
    c.intra_node = 50 * GB;
    c.network = 50 * GB;
  } else if (name == "h200-1") {
    return lent_h200();
  } else if (name == "cpu") {
    GptShape s = find_model_preset("gpt-125m").shape;
    return measure_cpu(s, nvme_dir);
  } else {
    std::string valid;
    for (const auto& p : cluster_presets()) valid += (valid.empty() ? "" : ", ") + p.name;
    throw ConfigError("unknown cluster preset '" + name + "'; valid presets: " + valid +
                      " (or give every figure: --gpus-per-node, --nodes, --hbm, --host-ram, ...)");
  }
  return c;
}

void validate(const ClusterSpec& c) {
  std::vector<std::string> bad;
  auto positive = [&](double v, const char* flag, const char* what) {
    if (!(v > 0) || !std::isfinite(v))
      bad.push_back(std::string(flag) + " is " + fmt(v, "") + ": " + what + " must be a positive number");
  };
  if (c.gpus_per_node < 1) bad.push_back("--gpus-per-node is " + std::to_string(c.gpus_per_node) + ": give at least 1");
  if (c.nodes < 1) bad.push_back("--nodes is " + std::to_string(c.nodes) + ": give at least 1");
  // Bounded before anything multiplies them: the rank count is an int.
  if (c.gpus_per_node > kMaxGpusPerNode)
    bad.push_back("--gpus-per-node is " + std::to_string(c.gpus_per_node) + ": give at most " +
                  std::to_string(kMaxGpusPerNode));
  if (c.nodes > kMaxNodes)
    bad.push_back("--nodes is " + std::to_string(c.nodes) + ": give at most " + std::to_string(kMaxNodes));
  if (c.gpus_per_node >= 1 && c.nodes >= 1 && int64_t{c.gpus_per_node} * c.nodes > kMaxWorld)
    bad.push_back("--nodes x --gpus-per-node is " + std::to_string(c.nodes) + " x " + std::to_string(c.gpus_per_node) +
                  " = " + std::to_string(int64_t{c.gpus_per_node} * c.nodes) + " ranks: plan at most " +
                  std::to_string(kMaxWorld));
  positive(c.hbm, "--hbm", "device memory per GPU");
  positive(c.hbm_bandwidth, "--hbm-bw", "device memory bandwidth");
  positive(c.gpu_flops, "--gpu-flops", "peak FLOP/s per GPU");
  positive(c.host_ram, "--host-ram", "host RAM per node");
  positive(c.host_bandwidth, "--host-bw", "host memory bandwidth per node");
  positive(c.pcie, "--pcie-bw", "PCIe bandwidth per GPU");
  positive(c.intra_node, "--intra-node-bw", "collective bandwidth inside a node");
  if (c.nodes > 1) positive(c.network, "--network-bw", "network bandwidth per node");
  if (!(c.matmul_efficiency > 0 && c.matmul_efficiency <= 1))
    bad.push_back("--matmul-efficiency is " + fmt(c.matmul_efficiency, "") + ": give a fraction in (0, 1]");
  if (!(c.host_ram_usable > 0 && c.host_ram_usable <= 1))
    bad.push_back("host RAM usable fraction is " + fmt(c.host_ram_usable, "") + ": give a fraction in (0, 1]");
  if (c.device_reserve < 0 || c.device_reserve >= c.hbm)
    bad.push_back("--device-reserve is " + fmt(c.device_reserve / GiB, "GiB") +
                  ": it must be at least 0 and less than --hbm");
  if (c.nvme_capacity < 0) bad.push_back("--nvme-capacity is negative: give 0 (no NVMe) or the bytes per node");
  if (c.nvme_capacity > 0) {
    positive(c.nvme_read, "--nvme-read-bw", "NVMe read bandwidth per node (with --nvme-capacity > 0)");
    positive(c.nvme_write, "--nvme-write-bw", "NVMe write bandwidth per node (with --nvme-capacity > 0)");
  } else if (c.nvme_read < 0 || c.nvme_write < 0) {
    bad.push_back("NVMe bandwidth is negative: give 0 or a positive number");
  }
  for (double lat : {c.pcie_latency, c.nvme_latency, c.collective_latency})
    if (lat < 0 || !std::isfinite(lat)) bad.push_back("a latency is negative: give 0 or more seconds");
  if (bad.empty()) return;
  std::string msg = "impossible cluster figures for '" + c.name + "':";
  for (const auto& b : bad) msg += "\n  " + b;
  throw ConfigError(msg);
}

// ----------------------------------------------------------------------------------------
// This machine, for the cpu backend.

namespace {

double meminfo_bytes(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string k;
  double kb = 0;
  std::string unit;
  while (f >> k >> kb >> unit)
    if (k == key) return kb * 1024;
  return 0;
}

// Best of `reps` sgemm C[M,N] = A[M,K] B[K,N]^T, FLOP/s.
double measure_sgemm(int M, int N, int K, int reps) {
  std::vector<float> a(size_t(M) * K, 0.01f), b(size_t(N) * K, 0.02f), c(size_t(M) * N, 0.0f);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cpu_sgemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    const double t = seconds_since(t0);
    best = std::max(best, 2.0 * M * N * K / t);
  }
  if (c[0] == 0.0f) throw Error("sgemm measurement produced no result (" + cpu_sgemm_choice().name + " did not run)");
  return best;
}

// Best of `reps` memcpy of `bytes`, bytes copied per second.
double measure_memcpy(size_t bytes, int reps) {
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.get(), src.get(), bytes);
    best = std::max(best, bytes / seconds_since(t0));
  }
  if (dst[bytes - 1] != 1) throw Error("memcpy measurement copied nothing");
  return best;
}

// The CPU Adam's streamed bytes per second, counted as the engine's cost model counts
// them: 28 bytes per parameter (read weight, gradient and both moments, write three).
double measure_adam(uint64_t n, int reps) {
  std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  AdamConfig cfg;
  CpuAdam adam(cfg, CpuAdamOptions{});
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    adam.step(r + 1, p.data(), g.data(), m.data(), v.data(), n);
    best = std::max(best, 28.0 * double(n) / seconds_since(t0));
  }
  return best;
}

struct DiskFigures {
  double read = 0, write = 0, free = 0;
};

// O_DIRECT, 4 MiB requests, one at a time, through a 256 MiB file that is removed after.
DiskFigures measure_disk(const std::string& dir) {
  DiskFigures d;
  struct statvfs sv {};
  if (statvfs(dir.c_str(), &sv) != 0)
    throw ConfigError("--nvme-dir '" + dir + "': " + std::strerror(errno) + "; give an existing directory");
  d.free = double(sv.f_bavail) * double(sv.f_frsize);
  const std::string path = dir + "/strata-plan-probe-" + std::to_string(::getpid());
  constexpr size_t kBlock = 4u << 20, kTotal = 256u << 20;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0)
    throw ConfigError("--nvme-dir '" + dir + "': cannot open a file with O_DIRECT there (" + std::strerror(errno) +
                      "); give a directory on a local disk");
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, kBlock) != 0) {
    ::close(fd);
    throw Error("out of memory for the disk probe buffer");
  }
  std::memset(buf, 7, kBlock);
  auto fail = [&](const char* op, ssize_t got) {
    const int e = errno;
    std::free(buf);
    ::close(fd);
    ::unlink(path.c_str());
    throw IoError(std::string("disk probe ") + op + " returned " + std::to_string(got), path, 0, kTotal, e);
  };
  auto t0 = std::chrono::steady_clock::now();
  for (size_t off = 0; off < kTotal; off += kBlock) {
    ssize_t w = ::pwrite(fd, buf, kBlock, static_cast<off_t>(off));
    if (w != static_cast<ssize_t>(kBlock)) fail("write", w);
  }
  if (::fdatasync(fd) != 0) fail("fdatasync", -1);
  d.write = kTotal / seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (size_t off = 0; off < kTotal; off += kBlock) {
    ssize_t r = ::pread(fd, buf, kBlock, static_cast<off_t>(off));
    if (r != static_cast<ssize_t>(kBlock)) fail("read", r);
  }
  d.read = kTotal / seconds_since(t0);
  std::free(buf);
  ::close(fd);
  ::unlink(path.c_str());
  return d;
}

// Best of `reps` micro-steps (forward + backward of one sequence) of the real GPT
// (model/gpt.hpp) under the ZeRO engine on the cpu backend, everything in memory, as
// `strata bench step` runs it: the model's kernels and the engine's own work on the same
// cores (gathers, gradient reduction and accumulation are memcpys and adds here).
double time_gpt(const GptShape& s, int micro_batch, int reps) {
  auto device = make_device({});
  auto comm = coll::make_host_communicator(coll::HostBackend::Self);
  EngineOptions o;
  o.stage = 3;
  o.persistence_threshold_elems = 0;
  o.gradient_accumulation_steps = reps + 1;
  o.store.device_budget = (256ull << 20) + gpt_param_count(s) * 4 * 8;  // states (20 B/param) and buffers
  o.store.pinned_budget = (64ull << 20) + gpt_param_count(s) * 4 * 2;  // the engine's staging
  ZeroEngine engine(*device, *comm, *comm, o, gpt_group_specs(s));
  engine.set_schedule(gpt_schedule(s));
  Gpt net(s, GptOptions{micro_batch, ActivationCheckpointing::None});
  const int n = micro_batch * s.seq_len;
  std::vector<int32_t> in(n), tgt(n);
  for (int i = 0; i < n; ++i) {
    in[i] = (7 * i) % s.vocab;
    tgt[i] = (7 * i + 1) % s.vocab;
  }
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    auto t0 = std::chrono::steady_clock::now();
    engine.begin_micro_step();
    const double loss = net.forward_backward(engine, in.data(), tgt.data());
    if (!std::isfinite(loss)) throw Error("GPT calibration run gave a non-finite loss");
    if (r > 0) best = std::min(best, seconds_since(t0));
  }
  engine.step();
  return best;
}

// The fraction of the sgemm rate the real GPT's kernels reach at this shape: one
// sequence through two of its blocks, against what group_times() would say at full
// rate (its matmul part scales with the fraction; its element-wise part does not).
// Returns 0 (and says why in `note`) when the shape is too large to run here quickly.
double calibrate_gpt(const GptShape& model, int micro_batch, ClusterSpec c, std::string& note, double& peak_scale) {
  GptShape s = model;
  s.layers = 2;
  const double flops_per_token = gpt_flops_per_token(s);
  while (s.seq_len > 64 && flops_per_token * s.seq_len * micro_batch > 4e11) s.seq_len /= 2;
  if (double(gpt_param_count(s)) * 8 > 1.5 * GiB || flops_per_token * s.seq_len * micro_batch > 1.6e12) {
    note = "GPT kernels: not calibrated (two blocks of this width are too large to run here quickly); the plan "
           "assumes the sgemm rate";
    return 0;
  }
  const double measured = time_gpt(s, micro_batch, 3);
  Strategy st;
  st.micro_batch = micro_batch;
  st.checkpointing = false;
  auto modeled = [&](double eff) {
    c.matmul_efficiency = eff;
    double t = 0;
    for (const GroupTimes& g : group_times(s, c, st)) t += g.forward_s + g.backward_s + g.head_s;
    return t;
  };
  const double full = modeled(1.0), half = modeled(0.5);
  const double matmul = half - full, elementwise = 2 * full - half;
  double eff = measured > elementwise ? matmul / (measured - elementwise) : 1.0;
  std::ostringstream os;
  os.precision(3);
  os << "GPT micro-step under the engine, 2 blocks of d_model " << s.d_model << " at " << s.seq_len
     << " tokens x " << micro_batch << " sequences: " << measured << " s (best of 3), " << 100 * std::min(eff, 1.0)
     << "% of the sgemm rate: the kernels' efficiency the plan uses";
  if (eff > 1) {
    // Faster than the sgemm sample allows: the sample met a busier machine. The GPT's
    // own rate is then the better measure of the peak.
    os << " (the GPT ran faster than the sgemm sample: the peak is raised to " << c.gpu_flops * eff / 1e9
       << " GFLOP/s)";
    peak_scale = eff;
    eff = 1;
  }
  note = os.str();
  return eff;
}

}  // namespace

ClusterSpec measure_cpu(const GptShape& model, const std::string& nvme_dir, int micro_batch) {
  ClusterSpec c;
  c.name = "cpu";
  c.cpu_backend = true;
  c.gpus_per_node = 1;
  c.nodes = 1;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // The model's MLP matmul at one sequence's tokens: the shape most of the FLOPs run at.
  const int M = std::clamp(model.seq_len, 64, 1024);
  const int K = std::clamp(model.d_model, 64, 2048);
  const int N = std::clamp(4 * model.d_model, 64, 4096);
  measure_sgemm(M, N, K, 1);  // warm up threads and caches
  c.gpu_flops = measure_sgemm(M, N, K, 5);
  c.matmul_efficiency = 1.0;  // measured: the matmuls reach what was measured
  const double copy = measure_memcpy(256u << 20, 3);
  c.pcie = copy;                    // "device" <-> pinned copies are memcpys
  c.hbm_bandwidth = 2 * copy;       // element-wise kernels: read and write traffic
  c.intra_node = copy;              // one rank: no collective moves anything
  c.host_bandwidth = measure_adam(uint64_t{4} << 20, 3);
  c.pcie_latency = 5e-6;
  c.collective_latency = 0;
  std::string gpt_note;
  double peak_scale = 1;
  const double eff = calibrate_gpt(model, micro_batch, c, gpt_note, peak_scale);
  if (eff > 0) c.matmul_efficiency = eff;
  c.gpu_flops *= peak_scale;
  const double avail = meminfo_bytes("MemAvailable:");
  if (!(avail > 0)) throw Error("cannot read MemAvailable from /proc/meminfo");
  // Both memory tiers come out of the same RAM: the device arena and the pinned pool get
  // 45% each, the rest is the process's own (activations are in the device arena).
  c.host_ram = avail;
  c.host_ram_usable = 0.45;
  c.hbm = 0.45 * avail;
  c.device_reserve = 0;
  std::ostringstream d;
  d << "this machine, cpu backend: " << cores << " cores, " << fmt(avail / GiB, "GiB") << " RAM available";
  c.description = d.str();
  c.measured.push_back("sgemm [" + std::to_string(M) + "x" + std::to_string(K) + "] x [" + std::to_string(K) + "x" +
                       std::to_string(N) + "]: " + fmt(c.gpu_flops / 1e9, "GFLOP/s") + " (best of 5)");
  c.measured.push_back("memcpy 256 MiB: " + fmt(copy / GB, "GB/s") + " (best of 3)");
  c.measured.push_back("CPU Adam, 4 Mi parameters: " + fmt(c.host_bandwidth / GB, "GB/s") +
                       " at 28 bytes per parameter (best of 3)");
  c.measured.push_back(gpt_note);
  c.measured.push_back("RAM: MemAvailable " + fmt(avail / GiB, "GiB") + ", 45% to the device arena, 45% pinned");
  if (!nvme_dir.empty()) {
    DiskFigures disk = measure_disk(nvme_dir);
    c.nvme_capacity = disk.free;
    c.nvme_read = disk.read;
    c.nvme_write = disk.write;
    c.nvme_latency = 100e-6;
    c.measured.push_back("disk " + nvme_dir + ": O_DIRECT 4 MiB requests, queue depth 1: write " +
                         fmt(disk.write / GB, "GB/s") + ", read " + fmt(disk.read / GB, "GB/s") + ", " +
                         fmt(disk.free / GiB, "GiB") + " free");
  } else {
    c.measured.push_back("disk: not measured (no --nvme-dir): no NVMe tier");
  }
  return c;
}

}  // namespace strata::plan
