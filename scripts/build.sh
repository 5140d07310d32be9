#!/usr/bin/env bash
# Configures and builds Strata. STRATA_SANITIZE=1 builds an ASan+UBSan tree in
# build-asan (CPU only); otherwise build/ (with the cuda backend when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${STRATA_SANITIZE:-0}" == 1 ]]; then
  dir=build-asan
  # -O1, as AddressSanitizer's documentation advises for speed at run time; it compiles
  # about 2x longer than -O0 (bench_step.cpp: 50 s against 23 s on the 2-core VM), and
  # which of the two gives the shorter CI run is not measured. Assertions stay on.
  # -g1: line tables only, which is all a sanitizer report's stack needs (file:line of
  # every frame, inlined ones included); full -g (types, variables) is only for a
  # debugger, and made the compile, this build's largest cost in CI, slower: test_config.cpp
  # 42.6 s with -g against 30.5 s with -g1, and 56.7 s against 39.0 s in a second pair
  # (2-core VM shared with other builds, so noisy; object 27 MB against 13 MB).
  flags=(-DSTRATA_SANITIZE=ON -DSTRATA_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1"
         "-DCMAKE_C_FLAGS_DEBUG=-O1 -g1")
else
  dir=build
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
  # STRATA_RELWITHDEBINFO_FLAGS replaces RelWithDebInfo's "-O2 -g -DNDEBUG" (CI: -g1, line
  # tables only, which compile faster; a debugger wants the full -g).
  [[ -n ${STRATA_RELWITHDEBINFO_FLAGS:-} ]] &&
    flags+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$STRATA_RELWITHDEBINFO_FLAGS" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$STRATA_RELWITHDEBINFO_FLAGS")
fi
# nvcc lives outside the default PATH on CUDA toolkit installs.
[[ -d /usr/local/cuda/bin ]] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >&2
cmake --build "$dir" -j"$(nproc)" >&2
echo "$dir"  # the only line on stdout: test.sh reads it
