#!/usr/bin/env bash
# Optional: makes DeepSpeed's CPU Adam op available to `strata bench optimizer`, which then
# times DeepSpeedCPUAdam beside Strata's CpuAdam (docs/bench-optimizer.md). Not part of
# scripts/install-deps.sh or CI: it installs torch's C++ headers (Debian's libtorch-dev,
# a large package) and compiles the op (about a minute). Safe to run again; a built op is
# kept under $TORCH_EXTENSIONS_DIR (default ~/.cache/strata/torch_extensions) and reused.
#
# Needs the .venv made by scripts/install-deps.sh (DeepSpeed 0.19.8 over PyPI's torch 2.15,
# whose wheel has its C++ headers, so the libtorch-dev step below is skipped; the op has
# not been built against torch 2.x yet).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
export DS_ACCELERATOR=cpu  # only the CPU op is wanted; no GPU probe
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import deepspeed' >/dev/null 2>&1; then
  echo "setup-deepspeed-op: $venv has no DeepSpeed; run scripts/install-deps.sh first" >&2
  exit 1
fi

# torch's C++ headers: Debian's python3-torch ships none; libtorch-dev matches its version.
if ! "$venv/bin/python" -c '
import os, sys, torch.utils.cpp_extension as e
sys.exit(0 if any(os.path.exists(os.path.join(p, "torch", "extension.h")) for p in e.include_paths()) else 1)'; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libtorch-dev
fi

# ninja, which torch.utils.cpp_extension builds with (pip's, into the venv, if none).
command -v ninja >/dev/null || [[ -x "$venv/bin/ninja" ]] ||
  "$venv/bin/pip" install -q --disable-pip-version-check ninja

# Build (or find) the op, with the -std=c++17 that torch 1.13's headers need.
exec "$venv/bin/python" "$root/bench/ref/deepspeed_op.py"
