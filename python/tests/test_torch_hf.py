"""strata.torch on Hugging Face models built by transformers from small configurations:
GPT2LMHeadModel (lm_head tied to the token embedding) and LlamaForCausalLM (GQA, untied
head), with parameters and optimizer states on NVMe, against torch.optim.AdamW on a deep
copy (torch_harness.LOSS_RTOL says why 1e-6): through the engine API, the standard loop,
activation checkpointing (reentrant and not), transformers.Trainer (strata.hf.Trainer
against Trainer with its own AdamW: clipping, evaluation, checkpoint and resume) and peft
LoRA over a frozen base (test_torch_peft.py). Skipped (exit 77) when transformers is not
importable beside this torch. Run by CTest with PYTHONPATH=<build>/python."""
import copy
import os
import sys
import tempfile
import unittest

import torch

try:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
except Exception as e:  # noqa: BLE001
    print(f"SKIP: transformers is not importable here ({e}); pip install transformers")
    sys.exit(77)

import strata
import strata.hf
import strata.torch
from torch_harness import (BACKEND, BETAS, DEVICE, EPS, LOSS_RTOL, LR, WEIGHT_DECAY, assert_on_nvme, batch, config,
                           train_engine, train_reference, worst_relative)

VOCAB = 128


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))


def loss_of(model, tokens):
    return model(input_ids=tokens, labels=tokens).loss  # transformers shifts the labels


class HuggingFace(unittest.TestCase):
    def train_and_compare(self, make, groups):
        model = make()
        reference = copy.deepcopy(model)
        batches = [batch(s, VOCAB) for s in range(20)]
        with tempfile.TemporaryDirectory() as nvme, strata.torch.initialize(model, config(nvme)) as engine:
            self.assertEqual([g.name for g in engine.groups], groups)
            self.assertEqual(sum(p.numel() for p in model.parameters()), 0, "PyTorch still holds parameters")
            losses = train_engine(engine, loss_of, batches)
            stats = engine.stats()
        ref = train_reference(reference, loss_of, batches)
        worst = worst_relative(losses, ref)
        print(f"{type(model).__name__}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, worst relative difference "
              f"{worst:.2e} (tolerance {LOSS_RTOL:.0e}); nvme used {stats['tiers']['nvme']['used']} bytes, "
              f"{stats['bytes_moved']['nvme->pinned']} bytes nvme->pinned")
        self.assertLess(worst, LOSS_RTOL)
        self.assertLess(losses[-1], 0.95 * losses[0], "the loss did not fall")
        assert_on_nvme(self, stats)
        self.assertEqual(stats["optimizer_steps"], 20)

    def test_gpt2(self):
        # lm_head.weight is transformer.wte.weight: the two modules are one group.
        self.train_and_compare(gpt2, ["transformer.wte+lm_head", "transformer.wpe", "transformer.h.0",
                                      "transformer.h.1", "transformer.ln_f"])

    def test_llama(self):
        self.train_and_compare(llama, ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
                                       "lm_head"])

    def test_gpt2_tie_across_explicit_groups_is_refused(self):
        model = gpt2()
        blocks = [f"transformer.h.{i}" for i in range(2)]
        with self.assertRaises(strata.StrataError) as e:
            strata.torch.initialize(model, config(), ["transformer.wte", "transformer.wpe", *blocks,
                                                      "transformer.ln_f", "lm_head"])
        self.assertEqual(e.exception.status, "STRATA_ERR_INVALID_ARGUMENT")
        self.assertIn("'transformer.wte.weight' is in two groups, 'transformer.wte' and 'lm_head' (tied: "
                      "'lm_head.weight' is the same tensor)", str(e.exception))
        self.assertIs(model.lm_head.weight, model.transformer.wte.weight, "the refused model was changed")
        # Given together, they are one group.
        with strata.torch.initialize(model, config(), [("transformer.wte", "lm_head"), "transformer.wpe", *blocks,
                                                       "transformer.ln_f"]) as engine:
            self.assertEqual(len(engine.groups), 5)
            train_engine(engine, loss_of, [batch(0, VOCAB)])

    def test_llama_standard_loop_and_activation_checkpointing(self):
        # The standard loop; then transformers' checkpointing, which recomputes a block by
        # calling its forward (no module hooks): Strata binds the block's parameters when
        # the gradient reaches its output. Both kinds give the plain run's losses.
        batches = [batch(s, VOCAB) for s in range(12)]
        reference = llama().to(DEVICE)
        opt = torch.optim.AdamW(reference.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        ref = standard_loop(reference, opt, batches)
        for reentrant in (None, True, False):
            model = llama()
            if reentrant is not None:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            model.train()
            with tempfile.TemporaryDirectory() as nvme, strata.torch.initialize(model, config(nvme)) as engine:
                model, optimizer = engine
                losses = standard_loop(model, optimizer, batches)
                stats = engine.stats()
            worst = worst_relative(losses, ref)
            print(f"Llama, standard loop, checkpointing {reentrant}: worst relative difference {worst:.2e}")
            self.assertLess(worst, LOSS_RTOL)
            assert_on_nvme(self, stats)


def standard_loop(model, optimizer, batches):
    losses = []
    for tokens in batches:
        loss = loss_of(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, start=0):
        self.items = [batch(start + i, VOCAB, size=1)[0].cpu() for i in range(n)]  # Trainer moves them

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def training_args(out, **kw):
    a = dict(output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=3e-3,
             max_steps=12, logging_steps=1, save_strategy="no", report_to=[], seed=0, dataloader_drop_last=True,
             max_grad_norm=0.3, use_cpu=BACKEND == "cpu", disable_tqdm=True, lr_scheduler_type="linear")
    a.update(kw)
    return TrainingArguments(**a)


def logged_losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def strata_config(nvme):
    offload = {"device": "nvme", "nvme_path": nvme}
    return {"zero_optimization": {"stage": 3, "offload_param": offload, "offload_optimizer": offload},
            "strata": {"backend": BACKEND, "device_budget": "64MiB", "pinned_budget": "64MiB"}}


class HuggingFaceTrainer(unittest.TestCase):
    def test_trainer_matches_trainer_with_adamw(self):
        # 6 steps of 2 micro-batches, linear decay, max_grad_norm 0.3 (engaged: the norms
        # are about 0.8), evaluation; then a resume from checkpoint-6 repeats steps 7-12.
        with tempfile.TemporaryDirectory() as tmp:
            ref = Trainer(model=llama(), args=training_args(os.path.join(tmp, "ref")), train_dataset=Tokens(96),
                          eval_dataset=Tokens(8, 100))
            ref.train()
            ref_eval = ref.evaluate()["eval_loss"]
            nvme = os.path.join(tmp, "nvme")
            os.mkdir(nvme)
            out = os.path.join(tmp, "strata")
            trainer = strata.hf.Trainer(model=llama(), args=training_args(out, save_strategy="steps", save_steps=6),
                                        strata_config=strata_config(nvme), train_dataset=Tokens(96),
                                        eval_dataset=Tokens(8, 100))
            trainer.train()
            losses, evaluated = logged_losses(trainer), trainer.evaluate()["eval_loss"]
            norm = trainer.strata_engine.stats()["last_grad_norm"]
            trainer.strata_engine.close()
            self.assertTrue(os.path.isdir(os.path.join(out, "checkpoint-6", "strata")))
            # Another output directory: this run's checkpoint-6 exists, and Strata never overwrites one.
            resumed = strata.hf.Trainer(model=llama(), args=training_args(os.path.join(tmp, "resumed")),
                                        strata_config=strata_config(nvme), train_dataset=Tokens(96))
            resumed.train(resume_from_checkpoint=os.path.join(out, "checkpoint-6"))
            after_resume = logged_losses(resumed)[6:]  # its log history starts with checkpoint-6's
            resumed.strata_engine.close()
        worst = worst_relative(losses, logged_losses(ref))
        print(f"strata.hf.Trainer: losses {losses[0]:.4f} -> {losses[-1]:.4f}, worst relative difference {worst:.2e}, "
              f"eval loss {evaluated:.6f} (Trainer's {ref_eval:.6f}); last gradient norm {norm:.3f} (clipped to 0.3); "
              f"resumed at step 6: {after_resume}")
        self.assertEqual(len(losses), 12)
        self.assertLess(worst, LOSS_RTOL)
        self.assertLess(abs(evaluated - ref_eval) / ref_eval, LOSS_RTOL)
        self.assertGreater(norm, 0.3, "clipping never engaged: the test proves nothing")
        self.assertEqual(after_resume, losses[6:], "the resumed run differs")

    def test_arguments_strata_cannot_honour_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            for kw, words in (({"weight_decay": 0.1}, "decays every parameter it holds"),
                              ({"bf16": True}, "Strata's precision is its config's")):
                with self.assertRaises(strata.StrataError) as e:
                    strata.hf.Trainer(model=llama(), args=training_args(tmp, **kw), strata_config=strata_config(tmp),
                                      train_dataset=Tokens(8))
                self.assertIn(words, str(e.exception))
            c = dict(strata_config(tmp), gradient_accumulation_steps=4)
            with self.assertRaises(strata.StrataError) as e:
                strata.hf.Trainer(model=llama(), args=training_args(tmp), strata_config=c, train_dataset=Tokens(8))
            self.assertIn("gradient_accumulation_steps is 4 and TrainingArguments' is 2", str(e.exception))


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models; OpenMP's spinning threads only slow a busy machine
    unittest.main()
