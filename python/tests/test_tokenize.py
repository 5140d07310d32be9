#!/usr/bin/env python3
"""strata.tokenize: text to llm.c token files with a Hugging Face tokenizer.

A BPE tokenizer trained here with the `tokenizers` package (a vocabulary of under 300:
the gpt-2 layout, uint16) and a word-level one of 70,000 entries (the llama-3 layout, uint32): the
file's header is llm.c's, its ids are the tokenizer's encode() of each text with --eot
after each, and `strata train` trains 3 steps on each with the loss of a uniform guess
at the start (ln V) and `strata eval` reads it back. An existing --out is kept without
--force; an --eot outside the vocabulary is refused.

Usage: test_tokenize.py STRATA_BINARY   (PYTHONPATH holding the built strata package)
"""
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from strata.tokenize import main as tokenize_main

TEXT = ("the cat sat on the mat. the dog ran to the big red house and saw the cat. " * 200,
        "a small bird sang in the old tree while the sun rose over the quiet town. " * 200)


def read_llmc(path):
    b = pathlib.Path(path).read_bytes()
    magic, version, n = struct.unpack("<3i", b[:12])
    width = {20240520: 2, 20240801: 4}[magic]
    ids = list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", b[1024:]))
    return magic, version, ids


def train_config(tmp, data, vocab):
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3},
        "strata": {"device_budget": "512MiB", "pinned_budget": "512MiB", "steps": 3, "checkpoint_every": 3,
                   "checkpoint_dir": str(tmp / f"ckpt-{vocab}"),
                   "model": {"layers": 1, "d_model": 32, "heads": 2, "seq_len": 16, "vocab": vocab},
                   "data": {"path": str(data), "format": "auto"}},
    }


def main():
    strata = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="strata-tokenize-") as d:
        tmp = pathlib.Path(d)
        texts = []
        for i, t in enumerate(TEXT):
            p = tmp / f"doc{i}.txt"
            p.write_text(t)
            texts.append(str(p))

        bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
        bpe.pre_tokenizer = pre_tokenizers.Whitespace()
        bpe.train(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"]))
        bpe_path = tmp / "bpe" / "tokenizer.json"
        bpe_path.parent.mkdir()
        bpe.save(str(bpe_path))
        words = {"[UNK]": 0, "<|endoftext|>": 1}
        for w in " ".join(TEXT).replace(".", " .").split():
            words.setdefault(w, len(words))
        while len(words) < 70000:
            words[f"filler{len(words)}"] = len(words)
        wl = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
        wl.pre_tokenizer = pre_tokenizers.Whitespace()
        wl_path = tmp / "wordlevel.json"
        wl.save(str(wl_path))

        for tok, where, magic, version in ((bpe, bpe_path.parent, 20240520, 1), (wl, wl_path, 20240801, 7)):
            vocab = tok.get_vocab_size(with_added_tokens=True)
            out = tmp / f"tokens-{vocab}.bin"
            tokenize_main(["--tokenizer", str(where), "--out", str(out), "--eot", "<|endoftext|>"] + texts)
            want = []
            for t in TEXT:
                want += tok.encode(t, add_special_tokens=False).ids + [tok.token_to_id("<|endoftext|>")]
            got_magic, got_version, ids = read_llmc(out)
            if (got_magic, got_version) != (magic, version) or ids != want:
                failures.append(f"vocab {vocab}: magic {got_magic} version {got_version}, {len(ids)} ids; "
                                f"expected {magic} {version}, {len(want)} ids (equal: {ids == want})")
                continue
            print(f"vocab {vocab}: {len(ids)} ids in the llm.c layout of magic {magic}, as the tokenizer encodes")

            cfg = tmp / f"cfg-{vocab}.json"
            cfg.write_text(json.dumps(train_config(tmp, out, vocab)))
            m = tmp / f"m-{vocab}.jsonl"
            r = subprocess.run([strata, "train", "--config", str(cfg), "--metrics", str(m), "--quiet"],
                               capture_output=True, text=True, timeout=600)
            losses = [json.loads(l)["loss"] for l in m.read_text().splitlines()] if m.exists() else []
            if r.returncode != 0 or len(losses) != 3 or abs(losses[0] - math.log(vocab)) > 0.5:
                failures.append(f"vocab {vocab}: strata train exit {r.returncode}, losses {losses} "
                                f"(ln V = {math.log(vocab):.3f})\n{r.stdout}{r.stderr}")
                continue
            r = subprocess.run([strata, "eval", "--checkpoint", str(tmp / f"ckpt-{vocab}"), "--data", str(out),
                                "--json", "--max-windows", "20"], capture_output=True, text=True, timeout=600)
            if r.returncode != 0 or json.loads(r.stdout)["tokens"] != 20 * 16:
                failures.append(f"vocab {vocab}: strata eval exit {r.returncode}: {r.stdout}{r.stderr}")
            print(f"vocab {vocab}: strata train losses {[round(x, 3) for x in losses]} (ln V {math.log(vocab):.3f}), "
                  f"eval {r.stdout.strip()}")

        out = tmp / f"tokens-{bpe.get_vocab_size(with_added_tokens=True)}.bin"
        before = out.read_bytes()
        for args, why in ((["--out", str(out)], "exists: give another name, or --force"),
                          (["--out", str(tmp / "x.bin"), "--eot", "<|nope|>"], "is not a token")):
            try:
                tokenize_main(["--tokenizer", str(bpe_path)] + args + texts)
                failures.append(f"{args}: accepted")
            except SystemExit as e:
                if why not in str(e):
                    failures.append(f"{args}: '{e}' lacks '{why}'")
        if out.read_bytes() != before:
            failures.append("the existing --out was changed without --force")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("strata.tokenize: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
