"""strata.torch on Hugging Face models built by transformers from small configurations:
GPT2LMHeadModel (lm_head tied to the token embedding) and LlamaForCausalLM, each trained
20 steps with parameters and optimizer states on NVMe, against torch.optim.AdamW on a
deep copy (torch_harness.LOSS_RTOL says why 1e-6). Skipped (exit 77) when transformers
is not importable beside this torch. Run by CTest with PYTHONPATH=<build>/python."""
import copy
import sys
import tempfile
import unittest

import torch

try:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except Exception as e:  # noqa: BLE001
    print(f"SKIP: transformers is not importable here ({e}); pip install transformers")
    sys.exit(77)

import strata
import strata.torch
from torch_harness import LOSS_RTOL, assert_on_nvme, batch, config, train_engine, train_reference, worst_relative

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
            self.assertEqual(list(model.parameters()), [], "PyTorch still holds parameters")
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

    def test_activation_checkpointing_is_refused(self):
        for reentrant in (True, False):
            model = gpt2()
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            with strata.torch.initialize(model, config()) as engine:
                loss = loss_of(engine, batch(0, VOCAB))
                # The recomputation runs a block's forward inside backward; torch re-raises
                # the hook's StrataError as a RuntimeError with its message in one variant.
                with self.assertRaisesRegex(RuntimeError, "activation checkpointing .* not supported"):
                    engine.backward(loss)


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models; OpenMP's spinning threads only slow a busy machine
    unittest.main()
