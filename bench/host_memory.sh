#!/usr/bin/env bash
# Strata's NVMe configuration of `strata bench step` (GPT-2 small's shape, bf16, 4096 tokens a
# step: micro-batch 4 x 256 tokens x 4 micro-steps; ZeRO-3 with parameters and optimizer states
# on NVMe, device budget 1 GiB, sub-groups of 16M elements, prefetches of 60M) trained by
# `strata train` in a process of its own, once per pinned budget, for its peak resident memory
# (GNU time's maximum resident set size): what `bench step` cannot give for one of its
# configurations (they share its process), to set beside a peer's peak host MiB.
#   bash bench/host_memory.sh STRATA DIR [PINNED_BUDGET...]     (default budgets: 1GiB 2GiB)
# Everything goes into a new folder inside DIR (created; on the NVMe drive), which the script
# names: the token file, the configurations, the logs and the swap files (removed after each
# run); nothing else in DIR is touched. Prints a table: budget, steps' median seconds, peak MiB.
set -euo pipefail
usage="usage: bash bench/host_memory.sh STRATA DIR [PINNED_BUDGET...]"
[[ $# -ge 2 ]] || { echo "host_memory.sh: $usage" >&2; exit 2; }
[[ -x $1 && -f $1 ]] || { echo "host_memory.sh: '$1' is not an executable strata: build it (bash scripts/build.sh)" >&2; exit 2; }
strata=$(realpath "$1")
shift
mkdir -p "$1"
dir=$(mktemp -d "$(realpath "$1")/host-memory.XXXXXX")
shift
budgets=("$@")
[[ ${#budgets[@]} -gt 0 ]] || budgets=(1GiB 2GiB)
[[ -x /usr/bin/time ]] || { echo "host_memory.sh: needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 2; }
echo "host_memory.sh: working in $dir" >&2
# An llm.c token file of 2M random GPT-2 token ids (the header's magic 20240520, version 1, the
# count; then uint16 tokens): the step's cost does not depend on which tokens.
python3 - "$dir/train.bin" <<'PY'
import random, struct, sys
n = 2_000_000
r = random.Random(0)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(r.randrange(50257) for _ in range(n))))
PY
echo "| pinned budget | steps 2-4: median s | peak resident MiB |"
echo "|---|---:|---:|"
for b in "${budgets[@]}"; do
  rm -rf "$dir/swap" && mkdir -p "$dir/swap"
  cat > "$dir/nvme-$b.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "$dir/swap"},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/swap"}, "stage3_prefetch_bucket_size": 60000000,
    "stage3_param_persistence_threshold": 0, "sub_group_size": 16000000},
  "strata": {"backend": "cpu", "device_budget": "1GiB", "pinned_budget": "$b", "steps": 4,
    "model": {"layers": 12, "d_model": 768, "heads": 12, "seq_len": 256, "vocab": 50257},
    "data": {"path": "$dir/train.bin", "format": "tokens"}}
}
EOF
  /usr/bin/time -f 'peak_kib %M' "$strata" train --config "$dir/nvme-$b.json" > "$dir/train-$b.log" 2>&1 ||
    { echo "host_memory.sh: strata train failed at pinned budget $b ($dir/train-$b.log):" >&2
      grep -v '^peak_kib' "$dir/train-$b.log" | tail -n 5 >&2; rm -rf "$dir/swap"; exit 1; }
  med=$(grep -oE 'step +[0-9.]+s$' "$dir/train-$b.log" | tail -n 3 | awk '{print $2+0}' | sort -n | sed -n 2p)
  kib=$(grep -oE '^peak_kib [0-9]+' "$dir/train-$b.log" | awk '{print $2}')
  echo "| $b | $med | $((kib / 1024)) |"
  rm -rf "$dir/swap"
done
