#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run Strata's GPU tests and benches, for machines
# that have the NVIDIA driver, CUDA 13's libraries and NCCL (a PyTorch image) but not
# Strata's other dependencies: the stripped binaries, every shared library they load that
# is neither glibc nor CUDA's, and the fortunes corpus. Build first (bash scripts/build.sh,
# nvcc on PATH). Output: gpu/bundle.tar.xz (gpu/ is ignored by git); on the GPU machine,
# scripts/gpu-check.sh unpacks and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu
bins=(build/strata build/tests/core/test_core build/tests/collectives/test_collectives_nccl
      build/tests/model/test_gpt_cuda build/tests/capi/test_capi_cuda build/tests/runtime/test_train
      build/tests/offload/test_cpu_adam)
for b in "${bins[@]}"; do [[ -x $b ]] || { echo "gpu-bundle.sh: $b is missing: build first" >&2; exit 2; }; done
grep -q '^STRATA_HAVE_CUDA\|Strata CUDA backend: ON' build/CMakeCache.txt 2>/dev/null || true
rm -rf "$out/stage" && mkdir -p "$out/stage/bin" "$out/stage/lib" "$out/stage/data"
for b in "${bins[@]}"; do strip -o "$out/stage/bin/$(basename "$b")" "$b"; done
# Libraries: everything ldd resolves except glibc's, the C++ runtime's and CUDA's (cudart,
# cuBLAS, NCCL: the GPU machine's own match its driver).
ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libcuda.so*) ;;
    *) cp -L "$lib" "$out/stage/lib/" ;;
  esac
done
[[ -s data/fortunes.txt ]] && cp data/fortunes.txt "$out/stage/data/"
tar -C "$out/stage" -cf - . | xz -T2 -6 > "$out/bundle.tar.xz"
rm -rf "$out/stage"
ls -la "$out/bundle.tar.xz"
