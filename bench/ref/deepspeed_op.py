"""DeepSpeed's CPU Adam op for `strata bench optimizer`: load it, or say in one line why not.

DeepSpeedCPUAdam runs a C++ op that torch.utils.cpp_extension builds on first use (JIT,
with ninja) against torch's C++ headers. With Debian's torch 1.13 that needs two things
DeepSpeed 0.19.8 does not arrange for itself: the headers (Debian's libtorch-dev; the
python3-torch package has none), and -std=c++17, which torch 1.13's headers require while
DeepSpeed's CPU builder passes no standard and torch adds -std=c++14. The builder below
adds the flag; scripts/setup-deepspeed-op.sh installs what is missing and builds the op
once. The build is cached under $TORCH_EXTENSIONS_DIR (default here:
~/.cache/strata/torch_extensions), so later runs load it in about a second.

load() returns (module of deepspeed.ops.adam.cpu_adam with its builder patched, None) or
(None, "one line naming what is missing and how to get it").
"""
import os
import sys

SETUP = "scripts/setup-deepspeed-op.sh"


def extensions_dir():
    return os.environ.get("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/strata/torch_extensions"))


def load(build=True):
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # only the CPU op is used; no GPU probe, no warning
    # A ninja installed by pip into this Python's venv is not on PATH unless the venv is
    # activated; torch looks for it on PATH.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    try:
        import torch
        import torch.utils.cpp_extension as cpp_extension
    except ImportError as e:
        return None, f"PyTorch is not importable by {sys.executable} ({e})"
    try:
        import deepspeed.ops.adam.cpu_adam as ds_cpu_adam
        from deepspeed.ops.op_builder import CPUAdamBuilder
    except Exception as e:  # deepspeed raises more than ImportError when half-installed
        return None, (f"DeepSpeed is not importable by {sys.executable} ({type(e).__name__}: {e}); "
                      f"scripts/install-deps.sh puts it in .venv: pass --python .venv/bin/python")
    headers = [os.path.join(p, "torch", "extension.h") for p in cpp_extension.include_paths()]
    if not any(os.path.exists(h) for h in headers):
        return None, (f"torch {torch.__version__}'s C++ headers are missing ({headers[0]}); "
                      f"Debian: apt-get install libtorch-dev, or run {SETUP}")
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return None, f"ninja is missing (torch builds the op with it): pip install ninja, or run {SETUP}"

    class Builder(CPUAdamBuilder):
        def cxx_args(self):
            return super().cxx_args() + ["-std=c++17"]  # torch 1.13's headers need C++17

    cached = os.path.exists(os.path.join(extensions_dir(), "cpu_adam", "cpu_adam.so"))
    if not cached and not build:
        return None, f"DeepSpeed's cpu_adam op is not built under {extensions_dir()}: run {SETUP}"
    if not cached:
        sys.stderr.write(f"building DeepSpeed's cpu_adam op into {extensions_dir()} (once, about a minute)\n")
    try:
        Builder().jit_load(verbose=False)
    except Exception as e:
        last = str(e).strip().splitlines()[-1:] or [type(e).__name__]
        return None, f"DeepSpeed's cpu_adam op failed to build ({last[0]}); rerun {SETUP} to see the compiler"
    ds_cpu_adam.CPUAdamBuilder = Builder  # DeepSpeedCPUAdam loads the op built above
    return ds_cpu_adam, None


if __name__ == "__main__":
    module, why = load()
    if module is None:
        print(f"DeepSpeed's CPU Adam is not available: {why}", file=sys.stderr)
        sys.exit(1)
    import deepspeed
    print(f"DeepSpeed {deepspeed.__version__} cpu_adam op ready under {extensions_dir()}")
