"""bench/ref/lora_step.py (the LoRA step beside peft and FSDP2, run by gpu-check.sh lora7b)
on a tiny shape on the cpu: it reports a row per system, peft and Strata start from the
same loss (the same random model, LoRA's B at zero), FSDP2 says why it cannot run without a
GPU, and bad arguments are refused. Asserts no speed. argv: the script's path."""
import json
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "rows.json")
    r = subprocess.run([sys.executable, script, "--shape", "tiny", "--systems", "strata-pinned,strata-nvme,peft,fsdp2",
                        "--steps", "1", "--batch", "1", "--seq", "16", "--nvme", d, "--device-budget", "64MiB",
                        "--pinned-budget", "64MiB", "--json", out], capture_output=True, text=True, timeout=240)
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0, r.returncode
    rows = {row["system"]: row for row in json.load(open(out))["rows"]}
    for s in ("strata-pinned", "strata-nvme", "peft"):
        assert rows[s].get("tokens_per_s", 0) > 0, rows[s]
        assert abs(rows[s]["first_loss"] - rows["peft"]["first_loss"]) < 1e-3, (s, rows[s], rows["peft"])
    assert rows["strata-nvme"]["nvme_bytes_read_per_step"] > 0, rows["strata-nvme"]
    assert "no" in rows["fsdp2"].get("skipped", "") or "tokens_per_s" in rows["fsdp2"], rows["fsdp2"]
    bad = subprocess.run([sys.executable, script, "--systems", "deepspeed"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown ['deepspeed']" in bad.stderr, bad.stderr
print("1 passed, 0 failed")
