#!/usr/bin/env bash
# The README's main job: trains a byte-level GPT in bf16 on Debian's `fortunes` corpus with ZeRO-3,
# parameters and optimizer states on NVMe (swap files in ./swap) and a device budget far
# below the model states, then prints a sample from the last checkpoint.
# A second run continues from the last complete checkpoint (nothing saved is replaced).
set -euo pipefail
cd "$(dirname "$0")/.."
strata=./build/strata
[[ -x $strata ]] || { echo "fortunes.sh: $strata is missing: run 'bash scripts/build.sh' first" >&2; exit 2; }
src=/usr/share/games/fortunes
[[ -d $src ]] || { echo "fortunes.sh: $src is missing: install the Debian package 'fortunes' (scripts/install-deps.sh does)" >&2; exit 2; }
mkdir -p data swap checkpoints
# Every fortune file (not the .dat indexes, not the .u8 links) as one text corpus.
if [[ ! -s data/fortunes.txt ]]; then
  find "$src" -maxdepth 1 -type f ! -name '*.dat' -print0 | sort -z | xargs -0 cat > data/fortunes.txt
fi
resume=()
ls -d checkpoints/fortunes/step-* >/dev/null 2>&1 && resume=(--resume)
"$strata" train --config configs/fortunes.json --metrics checkpoints/fortunes-metrics.jsonl --eval-batches 8 "${resume[@]}" "$@"
echo "--- sample from the last checkpoint:"
"$strata" sample --checkpoint checkpoints/fortunes --prompt "Q: " --tokens 300 --temperature 0.8 --top-k 40
