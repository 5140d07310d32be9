#!/usr/bin/env bash
# Installs Strata's build and test dependencies: Debian packages, and a .venv of PyPI ones.
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
  # GNU time: bench/host_memory.sh's peak resident memory of a run (its tests in CI too).
  time
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

# The Python the tests run (CMake's STRATA_PYTHON): a venv beside the repository with
# PyTorch 2.x, transformers, DeepSpeed and the rest from PyPI at the exact versions of
# scripts/venv-requirements.txt (what they pull in pinned by scripts/venv-constraints.txt).
# It does not see Debian's site-packages, whose torch 1.13 and numpy 1.24 would otherwise
# mix with PyPI's. Debian's python3-torch stays for /usr/bin/python3, which runs the bench
# references (bench/ref/*.py) that the published measurements in docs/ were made with.
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
# A venv made before this script pinned PyPI's torch (with --system-site-packages, over
# Debian's torch 1.13 and transformers 4.46.3) is made again rather than patched.
if [[ -f "$venv/pyvenv.cfg" ]] && grep -q '^include-system-site-packages *= *true' "$venv/pyvenv.cfg"; then
  echo "install-deps: $venv sees Debian's site-packages; making it again" >&2
  rm -rf "$venv"
fi
[[ -x "$venv/bin/python" ]] || /usr/bin/python3 -m venv "$venv"
# pip leaves a requirement that is already met by the installed version alone (no index
# query), so this is quick when nothing changed and upgrades or downgrades what differs.
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/venv-requirements.txt" \
  -c "$root/scripts/venv-constraints.txt"
