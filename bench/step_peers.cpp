#include "strata/bench/step_peers.hpp"

#include <cstdio>

#include "strata/core/convert.hpp"
#include "strata/core/error.hpp"

#ifndef STRATA_PEER_GPT_STEP_SCRIPT
#define STRATA_PEER_GPT_STEP_SCRIPT "bench/ref/peer_gpt_step.py"
#endif

namespace strata::bench {

const std::vector<std::string>& peer_names() {
  static const std::vector<std::string> names{"deepspeed", "fsdp2"};
  return names;
}

std::vector<PeerKind> peer_kinds(const std::vector<std::string>& names, bool nvme) {
  auto asked = [&names](const char* n) {
    for (const std::string& s : names)
      if (s == n) return true;
    return false;
  };
  std::vector<PeerKind> kinds;
  if (asked("deepspeed")) {
    kinds.push_back(PeerKind::DeepSpeedOffload);
    if (nvme) kinds.push_back(PeerKind::DeepSpeedInfinity);
  }
  if (asked("fsdp2")) kinds.push_back(PeerKind::Fsdp2);
  return kinds;
}

const char* peer_id(PeerKind k) {
  switch (k) {
    case PeerKind::DeepSpeedOffload: return "deepspeed-offload";
    case PeerKind::DeepSpeedInfinity: return "deepspeed-infinity";
    case PeerKind::Fsdp2: return "fsdp2";
  }
  STRATA_CHECK(false, "unknown PeerKind");
  return "";
}

std::string peer_title(PeerKind k) {
  switch (k) {
    case PeerKind::DeepSpeedOffload: return "DeepSpeed ZeRO-Offload (optimizer on cpu)";
    case PeerKind::DeepSpeedInfinity: return "DeepSpeed ZeRO-Infinity (params+optimizer on NVMe)";
    case PeerKind::Fsdp2: return "FSDP2 CPUOffloadPolicy";
  }
  return "";
}

std::string default_peer_script() { return STRATA_PEER_GPT_STEP_SCRIPT; }

Peer start_peer(PeerKind k, const PeerRun& run) {
  Peer p{k, nullptr, ""};
  std::vector<std::string> argv{run.python, run.script, "--peer", peer_id(k),
                                "--layers", std::to_string(run.shape.layers), "--d-model", std::to_string(run.shape.d_model),
                                "--heads", std::to_string(run.shape.heads), "--seq", std::to_string(run.shape.seq_len),
                                "--vocab", std::to_string(run.shape.vocab), "--micro-batch", std::to_string(run.micro_batch),
                                "--accum", std::to_string(run.accum), "--threads", std::to_string(run.threads),
                                "--precision", precision_name(run.precision), "--device", run.cuda ? "cuda" : "cpu"};
  if (peer_on_nvme(k)) {
    std::error_code ec;
    std::filesystem::create_directories(run.nvme_dir, ec);
    if (ec) {
      p.skipped = "cannot make its swap directory " + run.nvme_dir.string() + ": " + ec.message();
      return p;
    }
    argv.insert(argv.end(), {"--nvme-dir", run.nvme_dir.string()});
  }
  try {
    p.process = std::make_unique<ReferenceProcess>(argv, std::string(peer_id(k)),
                                                   "--python names a Python with torch and DeepSpeed");
  } catch (const Unavailable& e) {
    p.skipped = e.what();
  }
  return p;
}

PeerStep step_peer(Peer& p) {
  STRATA_CHECK(p.process != nullptr, "a skipped peer is not stepped");
  const nlohmann::json got = p.process->command("step");
  if (!got.contains("seconds")) throw Unavailable(std::string("bench step: peer ") + peer_id(p.kind) + " failed: " + got.dump());
  PeerStep s;
  s.seconds = got["seconds"].get<double>();
  s.read_bytes = got.contains("read_bytes") ? got["read_bytes"].get<double>() : -1;
  s.written_bytes = got.contains("written_bytes") ? got["written_bytes"].get<double>() : -1;
  s.peak_host_bytes = got.value("peak_host_bytes", 0.0);
  return s;
}

double process_peak_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}

}  // namespace strata::bench
