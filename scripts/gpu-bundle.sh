#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run Strata's GPU tests and benches, for machines
# that have the NVIDIA driver, CUDA 13's libraries and NCCL (a PyTorch image) but not
# Strata's other dependencies: the stripped binaries, every shared library they load that
# is neither glibc nor CUDA's, Open MPI's launcher, and the fortunes corpus. Build first (bash scripts/build.sh,
# nvcc on PATH), and the Python module for the GPU machine's Python when a Python 3.12
# is here. Output: gpu/bundle.tar.xz (gpu/ is ignored by git); on the GPU machine,
# scripts/gpu-check.sh unpacks and runs it; gpu/whl holds DeepSpeed's wheels (carry gpu/).
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu
bins=(build/strata build/tests/core/test_core build/tests/collectives/test_collectives_nccl
      build/tests/model/test_gpt_cuda build/tests/capi/test_capi_cuda build/tests/runtime/test_train
      build/tests/offload/test_cpu_adam)
for b in "${bins[@]}"; do [[ -x $b ]] || { echo "gpu-bundle.sh: $b is missing: build first" >&2; exit 2; }; done
grep -q '^STRATA_HAVE_CUDA\|Strata CUDA backend: ON' build/CMakeCache.txt 2>/dev/null || true
rm -rf "$out/stage" && mkdir -p "$out/stage/bin" "$out/stage/lib" "$out/stage/data"
# Debug information off, the symbol table kept (a megabyte): cuda-gdb's backtraces of a
# hang there name the functions.
for b in "${bins[@]}"; do strip --strip-debug -o "$out/stage/bin/$(basename "$b")" "$b"; done
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
# Open MPI's launcher, for `gpu-check.sh ranks` on a machine without mpirun (a PyTorch
# image has none): mpirun, its plugins and help texts laid out as under its prefix (Open
# MPI finds them from OPAL_PREFIX, which gpu-check.sh sets), and the libraries the
# plugins load, as above.
prefix=$(ompi_info --parsable --path prefix | cut -d: -f3)
pkglib=$(ompi_info --parsable --path pkglibdir | cut -d: -f3)
pkgdata=$(ompi_info --parsable --path pkgdatadir | cut -d: -f3)
o=$out/stage/ompi
mkdir -p "$o/bin" "$o${pkglib#"$prefix"}" "$o${pkgdata#"$prefix"}"
cp -L "$(readlink -f "$(command -v mpirun)")" "$o/bin/mpirun"
cp -L "$pkglib"/*.so "$o${pkglib#"$prefix"}/"
cp -rL "$pkgdata"/. "$o${pkgdata#"$prefix"}/"
ldd "$o/bin/mpirun" "$o${pkglib#"$prefix"}"/*.so | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libcuda.so*) ;;
    *) [[ -e $out/stage/lib/$(basename "$lib") ]] || cp -L "$lib" "$out/stage/lib/" ;;
  esac
done
# The Python module for the GPU machine's Python (3.12 there; STRATA_GPU_PYTHON names
# another), for `gpu-check.sh torch`: module.cpp compiled against that Python's headers
# and PyPI's pybind11, linked to build/'s libstrata (the cuda backend's), beside the
# package's .py files. Skipped, saying so, where no such Python is here.
# A pyenv shim is on PATH whether or not its version is selected: take the first
# candidate that runs.
gpy=${STRATA_GPU_PYTHON:-}
if [[ -z $gpy ]]; then
  for c in $(command -v python3.12) /root/.pyenv/versions/3.12*/bin/python3.12; do
    if [[ -x $c ]] && "$c" -c 'import sys' 2>/dev/null; then gpy=$c; break; fi
  done
fi
if [[ -n $gpy && -x $gpy ]]; then
  venv=$(mktemp -d)
  "$gpy" -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check 'pybind11==3.1.0'
  mkdir -p "$out/stage/python/strata"
  libdir=$(dirname "$(readlink -f build/python/strata/libstrata.so.1)")
  g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden $("$venv/bin/python" -m pybind11 --includes) -Iinclude \
    -Ipython/src python/src/module.cpp -o "$out/stage/python/strata/_strata$("$gpy-config" --extension-suffix 2>/dev/null ||
    "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" \
    -L"$libdir" -l:libstrata.so.1 -Wl,-rpath,'$ORIGIN'
  cp -L build/python/strata/libstrata.so.1 build/python/strata/*.py "$out/stage/python/strata/"
  # The same library as lib/'s, most often: a hard link, which tar stores once.
  if cmp -s "$out/stage/python/strata/libstrata.so.1" "$out/stage/lib/libstrata.so.1"; then
    ln -f "$out/stage/lib/libstrata.so.1" "$out/stage/python/strata/libstrata.so.1"
  fi
  rm -rf "$venv"
  echo "gpu-bundle.sh: the Python module for $("$gpy" --version) is in the bundle (python/strata)"
else
  echo "gpu-bundle.sh: no Python 3.12 here (STRATA_GPU_PYTHON): the bundle has no Python module, gpu-check.sh torch cannot run" >&2
fi
# DeepSpeed for the GPU machine, whose image has torch but no DeepSpeed (and no pydantic or
# hjson), for `gpu-check.sh peers` and `capacity`: DeepSpeed 0.19.8 (the version the cpu runs
# here use) built into a pure-Python wheel with no ops (it builds cpu_adam and async_io on
# first use there), and the wheels it needs that the image lacks, for CPython 3.12 on x86-64,
# in gpu/whl (carried beside the bundle; about 5 MB). Skipped, saying so, without pip or a
# network here (STRATA_WHEEL_PYTHON: a Python with torch and pip, default .venv's).
wpy=${STRATA_WHEEL_PYTHON:-.venv/bin/python}
rm -rf "$out/whl" && mkdir -p "$out/whl"
if "$wpy" -c 'import torch' 2>/dev/null &&
   "$wpy" -m pip download -q --no-deps -d "$out/whl/src" deepspeed==0.19.8 &&
   DS_BUILD_OPS=0 "$wpy" -m pip wheel -q --no-deps --no-build-isolation -w "$out/whl" "$out/whl/src"/deepspeed-0.19.8.tar.gz &&
   "$wpy" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out/whl" \
     hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
     typing-extensions==4.16.0; then
  rm -rf "$out/whl/src"
  # ZeRO-Infinity's async_io op links libaio, whose headers a PyTorch image lacks: Debian's
  # libaio-dev and libaio1 (43 kB), unpacked there into a folder of their own, not into /.
  mkdir -p "$out/whl/aio"
  (cd "$out/whl/aio" && apt-get download libaio-dev libaio1 > /dev/null 2>&1) ||
    echo "gpu-bundle.sh: apt-get download libaio-dev libaio1 failed: ZeRO-Infinity needs libaio there" >&2
  echo "gpu-bundle.sh: DeepSpeed and what it needs are in $out/whl ($(du -sh "$out/whl" | cut -f1))"
else
  rm -rf "$out/whl"
  echo "gpu-bundle.sh: could not make DeepSpeed's wheels ($wpy): gpu-check.sh peers and capacity run without it there" >&2
fi
tar -C "$out/stage" -cf - . | xz -T2 -6 > "$out/bundle.tar.xz"
rm -rf "$out/stage"
ls -la "$out/bundle.tar.xz"
