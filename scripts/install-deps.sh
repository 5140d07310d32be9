#!/usr/bin/env bash
# Installs Strata's build and test dependencies from Debian packages.
# Used by the README's setup command and by .ci/run. Safe to run again.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libnuma-dev libhwloc-dev libmimalloc-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libgtest-dev libgmock-dev
  fio fortunes
  python3 python3-numpy python3-matplotlib python3-torch
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
