"""`strata export` end to end: the safetensors file loads with the safetensors package,
holds GPT-2's tensor names and shapes, and every value equals what the engine held
(dumped by test_export_fixture through gather_full_params, not through the checkpoint
reader); bad input gives a clear error and writes nothing.

The layout below (offsets inside a block, which weights GPT-2 stores transposed) is
written out again here from GPT-2's definition, independently of gpt_layout.cpp, so a
wrong offset or a missing transpose on either side fails the test.

usage: test_export.py --strata BIN --fixture BIN --workdir DIR
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:  # a Python without them cannot check the export
    sys.exit(f"test_export.py needs torch and safetensors ({e}); set STRATA_PYTHON to a Python that has them "
             "(scripts/install-deps.sh makes .venv)")

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def expected_tensors(shape, ref):
    """GPT-2 name -> numpy array in GPT-2's layout, from the engine's flat groups."""
    d, V, T, L = shape["d_model"], shape["vocab"], shape["seq_len"], shape["layers"]
    out = {}
    emb = ref[0]
    out["wte.weight"] = emb[: V * d].reshape(V, d)
    out["wpe.weight"] = emb[V * d: V * d + T * d].reshape(T, d)
    # One block, Strata's order; Linear weights stored [out, in] (torch.nn.Linear).
    parts = [("ln_1.weight", (d,), False), ("ln_1.bias", (d,), False),
             ("attn.c_attn.weight", (3 * d, d), True), ("attn.c_attn.bias", (3 * d,), False),
             ("attn.c_proj.weight", (d, d), True), ("attn.c_proj.bias", (d,), False),
             ("ln_2.weight", (d,), False), ("ln_2.bias", (d,), False),
             ("mlp.c_fc.weight", (4 * d, d), True), ("mlp.c_fc.bias", (4 * d,), False),
             ("mlp.c_proj.weight", (d, 4 * d), True), ("mlp.c_proj.bias", (d,), False)]
    for l in range(L):
        flat, o = ref[1 + l], 0
        for name, shp, conv1d in parts:
            n = int(np.prod(shp))
            a = flat[o: o + n].reshape(shp)
            out[f"h.{l}.{name}"] = a.T.copy() if conv1d else a  # GPT-2's Conv1D: [in, out]
            o += n
        check(o == flat.size, f"block {l}: layout covers {o} of {flat.size} elements")
    fin = ref[L + 1]
    out["ln_f.weight"], out["ln_f.bias"] = fin[:d], fin[d: 2 * d]
    return out


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    work = a.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rc, out = run([a.fixture, work])
    if rc != 0:
        sys.exit(f"fixture failed ({rc}):\n{out}")
    ckpt = out.strip().splitlines()[-1]
    shape = json.load(open(os.path.join(work, "ref", "shape.json")))
    ref = []
    for g in range(shape["layers"] + 2):
        ref.append(np.fromfile(os.path.join(work, "ref", f"group-{g}.f32"), dtype="<f4"))
    want = expected_tensors(shape, ref)

    # Export from the checkpoint_dir (its latest checkpoint).
    model = os.path.join(work, "model.safetensors")
    rc, out = run([a.strata, "export", "--checkpoint", os.path.join(work, "ckpt"), "--out", model])
    check(rc == 0, f"export exits 0 (got {rc}): {out}")
    check(f"{len(want)} f32 tensors" in out, f"export prints a summary with {len(want)} f32 tensors: {out}")

    got = load_file(model)
    check(set(got) == set(want), f"names: extra {sorted(set(got) - set(want))}, missing {sorted(set(want) - set(got))}")
    check(not any(k.startswith("lm_head") for k in got), "the tied head is not written")
    for name, w in want.items():
        if name not in got:
            continue
        t = got[name]
        check(t.dtype == torch.float32, f"{name}: dtype {t.dtype}")
        check(tuple(t.shape) == w.shape, f"{name}: shape {tuple(t.shape)}, want {w.shape}")
        if tuple(t.shape) == w.shape:
            check(np.array_equal(t.numpy(), w), f"{name}: values differ (max {np.abs(t.numpy() - w).max()})")
    d = shape["d_model"]
    check(tuple(got["h.0.attn.c_attn.weight"].shape) == (d, 3 * d), "c_attn.weight is GPT-2's [d, 3d]")
    check(tuple(got["h.1.mlp.c_proj.weight"].shape) == (4 * d, d), "mlp.c_proj.weight is GPT-2's [4d, d]")
    check(not np.array_equal(ref[1][:d], np.ones(d, np.float32)), "the fixture's values are not trivial")

    # --dtype bf16 / fp16: the same values rounded to nearest even, as torch rounds them.
    for flag, tdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        half = os.path.join(work, f"model-{flag}.safetensors")
        rc, out = run([a.strata, "export", "--checkpoint", ckpt, "--out", half, "--dtype", flag])
        check(rc == 0 and f"{len(want)} {flag} tensors" in out, f"export --dtype {flag} (rc {rc}): {out}")
        if rc == 0:
            for name, t in load_file(half).items():
                check(t.dtype == tdt, f"{flag} {name}: dtype {t.dtype}")
                check(torch.equal(t, torch.from_numpy(want[name]).to(tdt)), f"{flag} {name}: not torch's rounding")
    rc, out = run([a.strata, "export", "--checkpoint", ckpt, "--out", os.path.join(work, "x.safetensors"),
                   "--dtype", "int8"])
    check(rc == 2 and "unknown precision 'int8'" in out, f"--dtype int8 refused (rc {rc}): {out}")

    # The header as the spec says: u64 length, JSON padded with spaces, data 8-aligned.
    raw = open(model, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    check((8 + n) % 8 == 0, f"header length {n}: data start {8 + n} is not 8-byte aligned")
    header = json.loads(raw[8: 8 + n].decode("utf-8"))
    ends = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    check(ends[0][0] == 0 and all(x[1] == y[0] for x, y in zip(ends, ends[1:])) and 8 + n + ends[-1][1] == len(raw),
          "tensors tile the data exactly")
    with safe_open(model, framework="pt") as f:
        meta = f.metadata()
    check(meta.get("format") == "pt", f"metadata format: {meta.get('format')}")
    check(meta.get("strata_step") == "2", f"metadata strata_step: {meta.get('strata_step')}")
    check(json.loads(meta.get("strata_shape", "{}")) == shape, f"metadata strata_shape: {meta.get('strata_shape')}")
    check("strata_config" in meta, "metadata carries the config")

    # An existing --out is not replaced without --force.
    before = sha(model)
    rc, out = run([a.strata, "export", "--checkpoint", ckpt, "--out", model])
    check(rc == 2 and "exists already: pass --force" in out, f"existing --out refused (rc {rc}): {out}")
    check(sha(model) == before, "the refused export left the file as it was")
    rc, out = run([a.strata, "export", "--checkpoint", ckpt, "--out", model, "--force"])
    check(rc == 0 and sha(model) == before, f"--force replaces it with the same bytes (rc {rc}): {out}")

    # A missing checkpoint, and a corrupt one: clear errors, nothing written.
    other = os.path.join(work, "other.safetensors")
    rc, out = run([a.strata, "export", "--checkpoint", os.path.join(work, "nowhere"), "--out", other])
    check(rc == 2 and "is not a directory" in out and not os.path.exists(other), f"missing checkpoint (rc {rc}): {out}")
    bad = os.path.join(work, "bad")
    shutil.copytree(ckpt, bad)
    with open(os.path.join(bad, "rank-0.bin"), "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 0x01]))
    rc, out = run([a.strata, "export", "--checkpoint", bad, "--out", other])
    check(rc == 1 and "rank-0.bin' is corrupt" in out and "master of group 'embeddings'" in out,
          f"corrupt checkpoint (rc {rc}): {out}")
    check(not os.path.exists(other) and not any(x.startswith(".other") for x in os.listdir(work)),
          "a failed export leaves no file, temporary or final")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"export: {len(want)} tensors match the engine's weights; header, metadata and errors as specified")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
