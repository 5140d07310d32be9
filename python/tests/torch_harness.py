"""What the strata.torch tests share: a configuration, the two training loops (through
strata.torch and through torch.optim.AdamW) and the comparison."""
import os

import torch

# STRATA_TEST_BACKEND=cuda runs these tests with Strata's cuda backend, the inputs and the
# PyTorch references on the GPU (scripts/gpu-check.sh torch); the default is the cpu backend.
BACKEND = os.environ.get("STRATA_TEST_BACKEND", "cpu")
if BACKEND not in ("cpu", "cuda"):
    raise SystemExit(f"STRATA_TEST_BACKEND={BACKEND!r}: expected cpu or cuda")
DEVICE = torch.device("cuda" if BACKEND == "cuda" else "cpu")

LR, BETAS, EPS, WEIGHT_DECAY = 3e-3, (0.9, 0.999), 1e-8, 0.01

# Relative tolerance on each step's loss between strata.torch and torch.optim.AdamW on a
# deep copy of the model. Both run the same fp32 operations on the same values: Strata's
# CPU AdamW follows torch's kernel operation by operation and a group's gradient holds
# exactly the parameters' gradients. What differs: Strata keeps the learning rate and
# weight decay as float32 (3e-3 becomes 3.0000000261e-3), and a parameter used twice
# (tied weights, a module called twice) has its gradients summed in another order. Both
# move single weights by an ulp now and then. Measured over 20 steps (2-core CI machine,
# one torch thread): GPT-2 0 (identical losses), Llama 1.1e-7, the user model 1.5e-7,
# with gradient accumulation 1.2e-7. 1e-6 leaves room for that to grow, and is far below
# what a broken hook gives (GPT-2, measured): one group's gradient dropped 1.6e-2, the
# lm_head's share of the tied gradient dropped 1.4e-2, noise of 1e-3 of its size in one
# block's gradient 1.8e-4, saved-tensor hooks off (backward reads released memory that
# another group reuses) 1.7e-2. Scaling a gradient is invisible to Adam (m/sqrt(v)).
LOSS_RTOL = 1e-6


def config(nvme_dir=None, accumulation=1, **sections):
    """ZeRO-3 with parameters and optimizer states on NVMe in nvme_dir (pinned memory
    when None), Strata's cpu backend, AdamW as above."""
    offload = {"device": "nvme", "nvme_path": nvme_dir} if nvme_dir else {"device": "cpu", "pin_memory": True}
    c = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                  "weight_decay": WEIGHT_DECAY}},
        "zero_optimization": {"stage": 3, "offload_param": offload, "offload_optimizer": offload,
                              "stage3_param_persistence_threshold": 0},
        "strata": {"backend": BACKEND, "device_budget": "64MiB", "pinned_budget": "64MiB", "checksums": True},
    }
    c.update(sections)
    return c


def batch(step, vocab, size=4, seq=16):
    """Sequences t_i = (a + b*i) mod vocab with a, b per sequence: predictable after two tokens."""
    g = torch.Generator().manual_seed(1000 + step)
    a = torch.randint(0, vocab, (size, 1), generator=g)
    b = torch.randint(1, 8, (size, 1), generator=g)
    return ((a + b * torch.arange(seq + 1)) % vocab).to(DEVICE)


def train_engine(engine, loss_of, batches):
    """loss_of(callable, tokens) -> loss; one micro-batch per entry of batches."""
    losses = []
    for tokens in batches:
        loss = loss_of(engine, tokens)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def train_reference(model, loss_of, batches, accumulation=1):
    """The same with torch.optim.AdamW; gradients of `accumulation` micro-batches are
    averaged, as Strata does."""
    model.to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses = []
    for i, tokens in enumerate(batches):
        loss = loss_of(model, tokens)
        (loss / accumulation).backward()
        if (i + 1) % accumulation == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def worst_relative(losses, reference):
    assert len(losses) == len(reference) > 0
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def assert_on_nvme(test, stats):
    """The parameters and optimizer states lived on NVMe and came back from it."""
    test.assertGreater(stats["tiers"]["nvme"]["used"], 0, "nothing lived on the NVMe tier")
    test.assertGreater(stats["bytes_moved"]["nvme->pinned"], 0, "nothing came back from the NVMe tier")
