// The peers of `strata bench step --peers`: what a user who needs offload would run
// instead of Strata, each a ReferenceProcess of bench/ref/peer_gpt_step.py stepping the
// same GPT (shape, tokens per step, precision) beside Strata's configurations:
//
//   DeepSpeed ZeRO-Offload   ZeRO-3, offload_optimizer cpu        <-> Strata in memory
//   DeepSpeed ZeRO-Infinity  ZeRO-3, params and optimizer on NVMe <-> Strata on NVMe
//                            (in the bench's --dir, as Strata's swap files are)
//   FSDP2                    fully_shard + CPUOffloadPolicy       <-> Strata in memory
//
// A peer that cannot start (no DeepSpeed in --python, an op that does not build, FSDP2
// refusing the device) is skipped with its reason, not fatal: it was asked for beside
// minutes of Strata's measurements, which stand without it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/bench/reference_process.hpp"
#include "strata/core/dtype.hpp"
#include "strata/model/gpt_layout.hpp"

namespace strata::bench {

enum class PeerKind { DeepSpeedOffload, DeepSpeedInfinity, Fsdp2 };

// The names --peers takes: "deepspeed" (ZeRO-Offload, and ZeRO-Infinity where the bench
// runs its NVMe configuration), "fsdp2".
const std::vector<std::string>& peer_names();
// The peers those names ask for, in a fixed order, each once.
std::vector<PeerKind> peer_kinds(const std::vector<std::string>& names, bool nvme);
// "deepspeed-offload", as peer_gpt_step.py's --peer takes it.
const char* peer_id(PeerKind k);
// "DeepSpeed ZeRO-Infinity (params+optimizer on NVMe)", for the table.
std::string peer_title(PeerKind k);
// The Strata configuration it is compared with: the NVMe one, or the in-memory one.
inline bool peer_on_nvme(PeerKind k) { return k == PeerKind::DeepSpeedInfinity; }

struct PeerRun {
  GptShape shape;
  int micro_batch = 1, accum = 1;
  unsigned threads = 1;
  DType precision = DType::F32;
  bool cuda = false;
  std::string python;                  // with torch (and DeepSpeed for its peers)
  std::string script;                  // bench/ref/peer_gpt_step.py
  std::filesystem::path nvme_dir;      // ZeRO-Infinity's swap files
};

struct Peer {
  PeerKind kind;
  std::unique_ptr<ReferenceProcess> process;  // null when skipped
  std::string skipped;                        // why, when it could not start
};

// bench/ref/peer_gpt_step.py in the source tree.
std::string default_peer_script();

// Starts the peer; a failure to start becomes Peer::skipped (the child's own reason).
Peer start_peer(PeerKind k, const PeerRun& run);

struct PeerStep {
  double seconds = 0;
  double read_bytes = 0, written_bytes = 0;  // the process's storage I/O in the step (/proc/self/io), -1 unknown
  double peak_host_bytes = 0;                // its peak resident memory (VmHWM) since it was ready
};
// One step of a started peer; a failure is Unavailable naming the peer.
PeerStep step_peer(Peer& p);

// This process's peak resident memory (VmHWM), bytes; 0 where /proc says nothing.
double process_peak_resident_bytes();

}  // namespace strata::bench
