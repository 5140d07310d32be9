#!/usr/bin/env bash
# Bit-identity of training across two builds of strata (a refactor's check): runs the
# same short trainings with both binaries at world 1, 2 and 4 (mpirun) over stages,
# offloads, precisions, speculation, accumulation and activation checkpoints, and compares
# every step's loss and gradient norm as printed to --metrics (17 significant digits).
#   bash scripts/compare-losses.sh OLD_STRATA NEW_STRATA [WORK_DIR]
# Exit 0 when every run matches, 1 otherwise (each differing run is named).
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
work=${3:-$(mktemp -d /tmp/strata-compare.XXXXXX)}
mkdir -p "$work"
cd "$work"
head -c 400000 /usr/share/games/fortunes/fortunes > data.txt 2>/dev/null || python3 -c "
import random; random.seed(1); open('data.txt','w').write(''.join(random.choice('abcdefgh ') for _ in range(400000)))"

config() {  # stage param optimizer precision speculative accum checkpointing
  local stage=$1 param=$2 opt=$3 prec=$4 spec=$5 accum=$6 ckpt=$7
  local bf16=false fp16=false s3=""
  [[ $stage == 3 ]] && s3="\"stage3_param_persistence_threshold\": 0, \"offload_param\": {\"device\": \"$param\", \"nvme_path\": \"swap\"},"

  [[ $prec == bf16 ]] && bf16=true
  [[ $prec == fp16 ]] && fp16=true
  cat <<EOF
{
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": $accum, "gradient_clipping": 3.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "bf16": {"enabled": $bf16}, "fp16": {"enabled": $fp16, "initial_scale_power": 8},
  "activation_checkpointing": {"enabled": $ckpt, "cpu_checkpointing": $ckpt},
  "zero_optimization": {"stage": $stage,
    "offload_optimizer": {"device": "$opt", "nvme_path": "swap"}, $s3 "sub_group_size": 40000},
  "strata": {"backend": "cpu", "device_budget": "64MiB", "pinned_budget": "64MiB", "seed": 7,
    "speculative_optimizer": $spec, "model": {"layers": 2, "d_model": 64, "heads": 4, "seq_len": 32, "vocab": 256},
    "data": {"path": "data.txt", "format": "text"}, "steps": 6}
}
EOF
}

fails=0 runs=0
run_case() {  # world name args...
  local world=$1 name=$2
  shift 2
  config "$@" > "$name.json"
  for which in old new; do
    local bin=$old
    [[ $which == new ]] && bin=$new
    rm -rf swap && mkdir -p swap
    local launch=()
    ((world > 1)) && launch=(mpirun --allow-run-as-root --oversubscribe -np "$world")
    if ! OMP_NUM_THREADS=1 "${launch[@]}" "$bin" train --config "$name.json" --quiet --metrics "$name.$which.jsonl" \
        > "$name.$which.log" 2>&1; then
      echo "FAILED to run ($which): $name (see $work/$name.$which.log)"
      fails=$((fails + 1))
      return
    fi
  done
  runs=$((runs + 1))
  local keep='import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(repr(r.get("loss")), repr(r.get("grad_norm")))'
  if diff <(python3 -c "$keep" "$name.old.jsonl") <(python3 -c "$keep" "$name.new.jsonl") > "$name.diff"; then
    echo "same: $name"
  else
    echo "DIFFERENT: $name ($work/$name.diff)"
    fails=$((fails + 1))
  fi
}

for world in 1 2 4; do
  for stage in 1 2 3; do
    for off in none cpu nvme; do
      param=none
      [[ $stage == 3 ]] && param=$off
      run_case "$world" "w$world-s$stage-$off-fp32" "$stage" "$param" "$off" fp32 false 1 false
    done
    run_case "$world" "w$world-s$stage-nvme-bf16-spec" "$stage" "$([[ $stage == 3 ]] && echo nvme || echo none)" nvme bf16 true 1 false
  done
  run_case "$world" "w$world-s3-cpu-fp16-accum" 3 cpu cpu fp16 false 2 false
  run_case "$world" "w$world-s3-nvme-fp32-spec-accum-ckpt" 3 nvme nvme fp32 true 2 true
  run_case "$world" "w$world-s2-cpu-bf16-spec-accum" 2 none cpu bf16 true 2 false
done
echo "$runs runs compared, $fails differ or failed (work in $work)"
((fails == 0))
