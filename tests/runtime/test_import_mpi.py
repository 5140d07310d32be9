#!/usr/bin/env python3
"""`strata import --hf` under `mpirun -np 2`: each rank reads only the byte ranges of its
own shard, and the two ranks' checkpoint is the one-process import's.

For a GPT2LMHeadModel directory (Conv1D weights stored [in, out]: a shard of the
transposed matrix is one run per file row) and a LlamaForCausalLM one (grouped-query
attention, untied head; contiguous ranges), both sharded in two bf16 files:

- every read each rank made (STRATA_IMPORT_READ_LOG) is counted: within a file, no byte
  is read by both ranks or twice by one; together the reads cover exactly the bytes of
  every tensor the model has (GPT-2's tied lm_head and attention-mask buffers unread);
  each rank read about half (at most 60%);
- a missing shard under mpirun: every rank stops with it named, no checkpoint written;
- the checkpoint says world size 2 and has two rank files; `strata eval` of it gives the
  one-process import's loss to the last digit (re-sharded to one reader).

usage: test_import_mpi.py STRATA_BINARY MPIRUN
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_import_hf import L, T, V, d, gpt2_tensors, write_hf  # noqa: E402

H, KV, FFN = 4, 2, 96
# As tests/CMakeLists.txt's STRATA_MPIEXEC_FLAGS (containers: no CMA, running as root).
MPI_FLAGS = ["--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", "self,vader",
             "--mca", "btl_vader_single_copy_mechanism", "none"]


def write_llama(path, gen):
    path.mkdir(parents=True)
    hd = d // H
    w = {"model.embed_tokens.weight": torch.randn(V, d, generator=gen) * 0.1, "model.norm.weight": 1 + 0.1 * torch.randn(d, generator=gen),
         "lm_head.weight": torch.randn(V, d, generator=gen) * 0.1}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        for n, rows in (("q_proj", d), ("k_proj", KV * hd), ("v_proj", KV * hd), ("o_proj", d)):
            w[p + "self_attn." + n + ".weight"] = torch.randn(rows, d, generator=gen) * 0.1
        w[p + "mlp.gate_proj.weight"] = torch.randn(FFN, d, generator=gen) * 0.1
        w[p + "mlp.up_proj.weight"] = torch.randn(FFN, d, generator=gen) * 0.1
        w[p + "mlp.down_proj.weight"] = torch.randn(d, FFN, generator=gen) * 0.1
    w = {k: v.to(torch.bfloat16) for k, v in w.items()}
    names = sorted(w)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for f, ns in shards.items():
        save_file({n: w[n].contiguous() for n in ns}, str(path / f), metadata={"format": "pt"})
        weight_map.update({n: f for n in ns})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": L, "hidden_size": d,
        "num_attention_heads": H, "num_key_value_heads": KV, "intermediate_size": FFN,
        "max_position_embeddings": T, "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}))


def tensor_ranges(hf, skip):
    """{file: [(begin, end)]} of the bytes of every tensor that is read."""
    out = {}
    for f in sorted(hf.glob("*.safetensors")):
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8: 8 + n])
        out[str(f)] = sorted((8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
                             for k, v in header.items() if k != "__metadata__" and not skip(k))
    return out


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def check(name, strata, mpirun, hf, skip, tmp, corpus, failures):
    log = tmp / f"{name}-reads"
    env = dict(os.environ, STRATA_IMPORT_READ_LOG=str(log))
    r = run([mpirun] + MPI_FLAGS + ["-np", "2", strata, "import", "--hf", str(hf), "--out", str(tmp / f"{name}-np2")],
            env=env)
    if r.returncode != 0:
        failures.append(f"{name}: mpirun -np 2 strata import failed ({r.returncode}): {r.stdout}{r.stderr}")
        return
    print(r.stdout.strip())
    per_rank = []
    for rank in (0, 1):
        reads = {}
        for line in pathlib.Path(f"{log}.{rank}").read_text().splitlines():
            f, off, n = line.rsplit(" ", 2)
            reads.setdefault(f, []).append((int(off), int(off) + int(n)))
        per_rank.append(reads)
    want = tensor_ranges(hf, skip)
    total = sum(e - b for rs in want.values() for b, e in rs)
    counts = [sum(e - b for rs in reads.values() for b, e in rs) for reads in per_rank]
    for f in set(want) | set(per_rank[0]) | set(per_rank[1]):
        got = sorted(per_rank[0].get(f, []) + per_rank[1].get(f, []))
        for (b0, e0), (b1, e1) in zip(got, got[1:]):
            if b1 < e0:
                failures.append(f"{name}: bytes {b1}..{min(e0, e1)} of {f} were read twice")
                break
        # Merged, the reads are exactly the tensors' bytes.
        merged = []
        for b, e in got:
            if merged and merged[-1][1] == b:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((b, e))
        spans = []
        for b, e in want.get(f, []):
            if spans and spans[-1][1] == b:
                spans[-1] = (spans[-1][0], e)
            else:
                spans.append((b, e))
        if merged != spans:
            failures.append(f"{name}: the reads of {f} do not cover exactly its tensors' bytes")
    print(f"{name}: rank 0 read {counts[0]} bytes in {sum(len(v) for v in per_rank[0].values())} reads, rank 1 "
          f"{counts[1]} in {sum(len(v) for v in per_rank[1].values())}; the tensors hold {total}")
    if sum(counts) != total or max(counts) > 0.6 * total:
        failures.append(f"{name}: ranks read {counts} bytes of {total}: not each about half")

    manifest = json.loads((tmp / f"{name}-np2" / "step-00000000" / "manifest.json").read_text())
    files = sorted(p.name for p in (tmp / f"{name}-np2" / "step-00000000").glob("rank-*.bin"))
    if manifest.get("world_size") != 2 or files != ["rank-0.bin", "rank-1.bin"]:
        failures.append(f"{name}: the checkpoint has world_size {manifest.get('world_size')}, files {files}")
    r = run([strata, "import", "--hf", str(hf), "--out", str(tmp / f"{name}-np1")])
    if r.returncode != 0:
        failures.append(f"{name}: one-process import failed: {r.stderr}")
        return
    losses = []
    for ck in (f"{name}-np1", f"{name}-np2"):
        r = run([strata, "eval", "--checkpoint", str(tmp / ck), "--data", str(corpus), "--max-windows", "40",
                 "--precision", "f32", "--json"])
        losses.append(json.loads(r.stdout)["loss"] if r.returncode == 0 else f"exit {r.returncode}: {r.stderr}")
    print(f"{name}: strata eval of the one-process import {losses[0]}, of the two-rank import {losses[1]}")
    if losses[0] != losses[1]:
        failures.append(f"{name}: eval {losses[1]} of the two-rank import, {losses[0]} of the one-process one")


def main():
    strata, mpirun = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-import-mpi-") as dd:
        tmp = pathlib.Path(dd)
        corpus = tmp / "corpus.txt"
        corpus.write_text("the cat sat on the mat and saw a red dog. " * 100)
        gen = torch.Generator().manual_seed(3)
        write_hf(tmp / "gpt2", gpt2_tensors(gen))
        check("gpt2", strata, mpirun, tmp / "gpt2",
              lambda k: k == "lm_head.weight" or k.endswith(".attn.bias"), tmp, corpus, failures)
        write_llama(tmp / "llama", gen)
        check("llama", strata, mpirun, tmp / "llama", lambda k: False, tmp, corpus, failures)
        # Bad input under mpirun: every rank stops with the problem named, nothing is written.
        shutil.copytree(tmp / "llama", tmp / "noshard")
        (tmp / "noshard" / "model-00002-of-00002.safetensors").unlink()
        r = run([mpirun] + MPI_FLAGS + ["-np", "2", strata, "import", "--hf", str(tmp / "noshard"), "--out",
                                        str(tmp / "bad")])
        if r.returncode == 0 or "is missing" not in r.stderr or (tmp / "bad" / "step-00000000").exists() \
                or any((tmp / "bad").glob(".step-*")):
            failures.append(f"a missing shard under mpirun: exit {r.returncode}: {r.stderr.strip()}")
        else:
            said = next(line for line in r.stderr.splitlines() if "is missing" in line)
            print(f"a missing shard under mpirun: exit {r.returncode}: {said}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("strata import under mpirun: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
