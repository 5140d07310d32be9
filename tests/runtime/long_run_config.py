"""The config of a small `strata train` run that goes on until it is stopped (100,000
steps, parameters and optimizer on NVMe in `tmp`, data `tmp/corpus.txt`), for the tests
that stop or race a real process (test_train_signal.py, test_train_lock.py)."""


def long_run_config(tmp, checkpoint_dir=None, checkpoint_every=None):
    strata = {
        "device_budget": "8MiB", "pinned_budget": "8MiB",
        "model": {"layers": 2, "d_model": 64, "heads": 2, "seq_len": 64, "vocab": 256},
        "data": {"path": str(tmp / "corpus.txt"), "format": "text"},
        "steps": 100000,
    }
    if checkpoint_dir is not None:
        strata["checkpoint_dir"] = str(checkpoint_dir)
    if checkpoint_every is not None:
        strata["checkpoint_every"] = checkpoint_every
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3,
                              "offload_param": {"device": "nvme", "nvme_path": str(tmp)},
                              "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp)}},
        "strata": strata,
    }
