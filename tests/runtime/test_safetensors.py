#!/usr/bin/env python3
"""Strata's safetensors header reader (runtime/safetensors.hpp) against the safetensors
package, the format's reference.

Good files, written by the package (torch: f32, bf16, f16, i64, bool, a scalar, an empty
tensor, metadata; numpy: f64, u8): every tensor Strata lists has the dtype and shape the
package reports, and the bytes at Strata's offset are the tensor the package loads.
Damaged files (truncated header, a length beyond the file, overlapping or gapped
offsets, a byte length that disagrees with dtype x shape, trailing bytes, an unknown
dtype, no '{', a non-object header, a negative dimension): the package refuses each, and
Strata refuses each with a CorruptionError naming the problem.

Usage: test_safetensors.py SAFETENSORS_DUMP
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save as np_save
from safetensors.torch import save as torch_save


def dump(tool, path):
    r = subprocess.run([tool, str(path)], capture_output=True, text=True, timeout=60)
    # Exit 0 or 1 with one JSON object and nothing on stderr; anything else (a sanitizer's
    # report, a crash) is shown whole.
    try:
        out = json.loads(r.stdout)
    except json.JSONDecodeError:
        out = None
    if r.returncode not in (0, 1) or out is None or r.stderr.strip():
        sys.exit(f"{tool} {path}: exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r.returncode, out


def raw_file(header, data=b""):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(h)) + h + data


def package_refuses(path):
    try:
        with safe_open(str(path), framework="np") as f:
            for k in f.keys():
                f.get_tensor(k)
    except Exception:  # noqa: BLE001 (any refusal counts)
        return True
    return False


def main():
    tool = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-safetensors-") as d:
        tmp = pathlib.Path(d)
        g = torch.Generator().manual_seed(0)
        tensors = {
            "wte.weight": torch.randn(50, 16, generator=g),
            "h.0.ln_1.weight": torch.randn(16, generator=g).to(torch.bfloat16),
            "h.0.attn.c_attn.weight": torch.randn(16, 48, generator=g).half(),
            "position_ids": torch.arange(7, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "scale": torch.tensor(2.5),
            "empty": torch.zeros(0, 4),
        }
        good = tmp / "model.safetensors"
        good.write_bytes(torch_save(tensors, metadata={"format": "pt", "note": "test"}))
        npfile = tmp / "numpy.safetensors"
        np_arrays = {"a": np.linspace(0, 1, 9, dtype=np.float64).reshape(3, 3), "b": np.arange(5, dtype=np.uint8)}
        npfile.write_bytes(np_save(np_arrays))

        for path, framework in ((good, "pt"), (npfile, "np")):
            rc, out = dump(tool, path)
            if rc != 0:
                failures.append(f"{path.name}: refused: {out}")
                continue
            blob = path.read_bytes()
            with safe_open(str(path), framework=framework) as f:
                names = sorted(f.keys())
                if sorted(t["name"] for t in out["tensors"]) != names:
                    failures.append(f"{path.name}: tensors {[t['name'] for t in out['tensors']]}, package {names}")
                if framework == "pt" and out["metadata"] != f.metadata():
                    failures.append(f"{path.name}: metadata {out['metadata']}, package {f.metadata()}")
                for t in out["tensors"]:
                    ref = f.get_tensor(t["name"])
                    if framework == "pt":
                        shape = list(ref.shape)
                        ref_bytes = ref.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if ref.numel() else b""
                        dtype = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                                 torch.int64: "I64", torch.bool: "BOOL"}[ref.dtype]
                    else:
                        shape = list(ref.shape)
                        ref_bytes = ref.tobytes()
                        dtype = {np.dtype("float64"): "F64", np.dtype("uint8"): "U8"}[ref.dtype]
                    got = blob[t["offset"]:t["offset"] + t["bytes"]]
                    if t["shape"] != shape or t["dtype"] != dtype or got != ref_bytes:
                        failures.append(f"{path.name}: '{t['name']}' is {t['dtype']} {t['shape']} "
                                        f"({len(got)} bytes at {t['offset']}); the package: {dtype} {shape} "
                                        f"({len(ref_bytes)} bytes){'' if got == ref_bytes else ', bytes differ'}")
            print(f"{path.name}: {len(out['tensors'])} tensors agree with the safetensors package")

        two = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}
        data12 = bytes(range(12))
        bad = {
            "short": (b"\x10\x00\x00", "shorter than the 8 bytes"),
            "truncated-header": (raw_file(two, data12)[:30], "(truncated)"),
            "length-beyond-file": (struct.pack("<Q", 1 << 20) + b"{}", "(truncated)"),
            "huge-length": (struct.pack("<Q", 1 << 40) + b"{}", "more than the format's"),
            "no-brace": (raw_file(b' {"a": 1}'), "does not begin with '{'"),
            "not-object": (raw_file(b"[1, 2]"), "does not begin with '{'"),
            "not-json": (raw_file(b"{\"a\": "), "not valid JSON"),
            "overlap": (raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, data12),
                        "inside the tensor before it"),
            "gap": (raw_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, data12),
                    "leaving a gap"),
            "length-mismatch": (raw_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, data12[:8]),
                                "but spans 8 bytes"),
            "trailing-bytes": (raw_file(two, data12 + b"xx"), "but the file has"),
            "beyond-data": (raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, data12),
                            "outside the file's"),
            "unknown-dtype": (raw_file({"a": {"dtype": "F17", "shape": [1], "data_offsets": [0, 4]}}, data12[:4]),
                              "dtype 'F17'"),
            "negative-dim": (raw_file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, data12[:4]),
                             "not a non-negative integer"),
        }
        for name, (blob, phrase) in bad.items():
            p = tmp / f"{name}.safetensors"
            p.write_bytes(blob)
            rc, out = dump(tool, p)
            if rc != 1 or out.get("kind") != "corruption" or phrase not in out.get("error", ""):
                failures.append(f"{name}: expected a CorruptionError with '{phrase}', got exit {rc}: {out}")
            elif not package_refuses(p):
                failures.append(f"{name}: Strata refuses it but the safetensors package reads it: {out['error']}")
            else:
                print(f"{name}: refused by both: {out['error']}")
        rc, out = dump(tool, tmp / "missing.safetensors")
        if rc != 1 or out.get("kind") != "config":
            failures.append(f"missing file: expected a ConfigError, got {out}")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("safetensors headers: every check passed")


if __name__ == "__main__":
    main()
