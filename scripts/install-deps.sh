#!/usr/bin/env bash
# Installs Strata's build and test dependencies from Debian packages.
# Used by the README's setup command and by .ci/run. Safe to run again.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libnuma-dev libhwloc-dev libmimalloc-dev
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev opencl-c-headers libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libgtest-dev libgmock-dev
  clang libclang-rt-14-dev
  fio fortunes
  python3 python3-numpy python3-matplotlib python3-torch python3-venv python3-pip
  pybind11-dev python3-pybind11 python3-dev
  # libaio's header and libaio.so: DeepSpeed builds its async_io op (ZeRO-Infinity's NVMe
  # swapping, `strata bench step --peers deepspeed`) against them; libaio1 alone has neither.
  libaio-dev
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# PyPI packages Debian lacks (safetensors), in a venv beside the repository that also
# sees Debian's PyTorch and numpy. Tests use it through CMake's STRATA_PYTHON.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -c 'import safetensors' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check 'safetensors>=0.4'
# Hugging Face tokenizers, for strata.tokenize (python/strata/tokenize.py) and its test.
"$venv/bin/python" -c 'import tokenizers' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check 'tokenizers>=0.15'
# transformers, the outside reference for Hugging Face import and export
# (tests/runtime/test_hf_transformers.py); 4.46 is the newest that runs on Debian's torch 1.13.
"$venv/bin/python" -c 'import transformers' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check 'transformers==4.46.3'

# DeepSpeed, the reference for the learning-rate schedules (tests/runtime/test_lr_schedule.py
# runs its scheduler classes). --no-deps: its torch>=2 requirement would install a second,
# CUDA-sized PyTorch over Debian's; importing deepspeed.runtime.lr_schedules needs only
# these small packages, and works with Debian's torch on a machine without a GPU.
"$venv/bin/python" -c 'import deepspeed.runtime.lr_schedules' 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps 'deepspeed==0.19.8' hjson py-cpuinfo msgpack \
    einops tqdm ninja 'pydantic==2.14.3' 'pydantic-core==2.50.4' annotated-types typing-inspection 'typing-extensions>=4.16'
