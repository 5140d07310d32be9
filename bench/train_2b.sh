#!/usr/bin/env bash
# Trains a 2.05-billion-parameter GPT for 3 steps on this machine: 41 GB of model states
# (20 bytes per parameter), more than its RAM, with parameters and optimizer states on
# NVMe (./swap), a 2 GiB device budget and a 4 GiB pinned budget. Prints each step's
# loss and time and the bytes each tier link moved (from the metrics JSONL).
# Needs about 45 GB free on the swap directory's drive; takes several minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p data swap
[[ -s data/fortunes.txt ]] || find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' -print0 | sort -z |
  xargs -0 cat > data/fortunes.txt
metrics=${1:-swap/train-2b-metrics.jsonl}
rm -f "$metrics"
/usr/bin/time -v ./build/strata train --config configs/gpt-2b-nvme.json --metrics "$metrics" 2> swap/train-2b-time.txt
grep -E "Maximum resident|Elapsed" swap/train-2b-time.txt
/usr/bin/python3 - "$metrics" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    moved = ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in sorted(m.get("moved", {}).items()))
    print(f"step {m['step']}: loss {m['loss']:.4f}, {m['seconds']:.1f} s (optimizer {m['optimizer_s']:.1f} s, "
          f"exposed {m['exposed_s']:.1f} s); peak device {m['peak']['device'] / 2**30:.2f}/"
          f"{m['budget']['device'] / 2**30:.2f} GiB, pinned {m['peak']['pinned'] / 2**30:.2f}/"
          f"{m['budget']['pinned'] / 2**30:.2f} GiB, nvme {m['used']['nvme'] / 1e9:.1f} GB; moved: {moved}")
PY
