"""Text to token files that `strata train` and `strata eval` read (strata.data.format
"tokens"), with a Hugging Face tokenizer (its tokenizer.json, through the `tokenizers`
package from PyPI).

The files are llm.c's (dev/data/data_common.py, write_datafile): 256 little-endian int32
(magic, version, token count), then the tokens, uint16 in the gpt-2 layout (magic
20240520, version 1) when every id fits, uint32 in the llama-3 layout (magic 20240801,
version 7) for vocabularies beyond 65536. Set strata.model.vocab to the tokenizer's
vocabulary size (printed).

    python -m strata.tokenize --tokenizer path/to/tokenizer.json --out train.bin a.txt b.txt
    python -m strata.tokenize --tokenizer hf-model-dir --out train.bin --eot "<|endoftext|>" *.txt

Each text file is encoded whole (not line by line), optionally followed by the id of
--eot (a token of the tokenizer's vocabulary, e.g. GPT-2's <|endoftext|>), which marks
the documents' ends as GPT-2's training data does. The output is written to a temporary
name and renamed into place: an existing --out is replaced only with --force, and only
when it is a regular file.
"""
import argparse
import os
import sys
from array import array

GPT2_MAGIC, GPT2_VERSION = 20240520, 1
LLAMA3_MAGIC, LLAMA3_VERSION = 20240801, 7
MAX_TOKENS = 2**31 - 1  # the header's count is an int32


def write_token_file(path, tokens, vocab_size, force=False):
    """Writes `tokens` (ints in [0, vocab_size)) as an llm.c token file: uint16 when
    vocab_size <= 65536, else uint32. Returns the layout's name ("gpt-2" or "llama-3")."""
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"{len(tokens)} tokens: an llm.c token file holds at most {MAX_TOKENS}; split the text")
    if os.path.lexists(path):
        if not force:
            raise FileExistsError(f"--out '{path}' exists: give another name, or --force to replace it")
        if not os.path.isfile(path) or os.path.islink(path):
            raise ValueError(f"--out '{path}' is not a regular file: give a file path")
    wide = vocab_size > 65536
    ids = array("I" if wide else "H")
    if ids.itemsize != (4 if wide else 2):
        raise RuntimeError("this Python's array sizes are not 2 and 4 bytes")
    bad = next((t for t in tokens if t < 0 or t >= vocab_size), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    ids.extend(tokens)
    if sys.byteorder != "little":
        ids.byteswap()
    header = array("i", [0] * 256)
    header[0], header[1], header[2] = (LLAMA3_MAGIC, LLAMA3_VERSION, len(tokens)) if wide else \
        (GPT2_MAGIC, GPT2_VERSION, len(tokens))
    if sys.byteorder != "little":
        header.byteswap()
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(ids.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return "llama-3" if wide else "gpt-2"


def load_tokenizer(where):
    """A tokenizers.Tokenizer from a tokenizer.json, or from a directory holding one."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise SystemExit("strata.tokenize needs the `tokenizers` package: pip install tokenizers") from e
    path = os.path.join(where, "tokenizer.json") if os.path.isdir(where) else where
    if not os.path.isfile(path):
        raise SystemExit(f"--tokenizer '{where}': no tokenizer.json there; give the file or the model directory")
    return Tokenizer.from_file(path)


def tokenize_texts(tokenizer, paths, eot=None):
    """The ids of every file's text, each followed by `eot`'s id when given."""
    eot_id = None
    if eot is not None:
        eot_id = tokenizer.token_to_id(eot)
        if eot_id is None:
            raise SystemExit(f"--eot '{eot}' is not a token of this tokenizer's vocabulary")
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        out.extend(tokenizer.encode(text, add_special_tokens=False).ids)
        if eot_id is not None:
            out.append(eot_id)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m strata.tokenize", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json, or a Hugging Face model directory")
    ap.add_argument("--out", required=True, help="the token file to write")
    ap.add_argument("--eot", help="a token appended after each file (e.g. '<|endoftext|>')")
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    ap.add_argument("texts", nargs="+", help="UTF-8 text files")
    a = ap.parse_args(argv)
    tok = load_tokenizer(a.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids = tokenize_texts(tok, a.texts, a.eot)
    try:
        layout = write_token_file(a.out, ids, vocab, a.force)
    except (OSError, ValueError) as e:
        raise SystemExit(f"strata.tokenize: {e}") from e
    print(f"{a.out}: {len(ids)} tokens, llm.c {layout} layout; set strata.model.vocab to {vocab} "
          f"and strata.data.format to \"tokens\" (or \"auto\")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
