"""strata.torch with peft's LoRA: a transformers LlamaForCausalLM (GQA, untied head)
whose base is frozen, with adapters on q_proj and v_proj, trained with the base and the
adapters' optimizer states on NVMe: through the standard loop and through
strata.hf.Trainer, against the same peft model trained by PyTorch's AdamW (and by
transformers.Trainer). The adapters Strata's run saves load in peft and give its eval loss.
Skipped (exit 77) when transformers or peft is not importable. Run by CTest with
PYTHONPATH=<build>/python."""
import os
import sys
import tempfile
import unittest

import torch

try:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import Trainer
except Exception as e:  # noqa: BLE001
    print(f"SKIP: transformers or peft is not importable here ({e}); pip install transformers peft")
    sys.exit(77)

import strata
import strata.hf
import strata.torch
from test_torch_hf import VOCAB, Tokens, llama, logged_losses, standard_loop, strata_config, training_args
from torch_harness import BETAS, DEVICE, EPS, LOSS_RTOL, LR, assert_on_nvme, batch, config, worst_relative


def lora_llama():
    base = llama()  # seed 0: the same base every time
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0, init_lora_weights=False))  # B != 0: step 1 moves
    return model


class Lora(unittest.TestCase):
    def test_standard_loop_matches_peft_with_adamw(self):
        batches = [batch(s, VOCAB) for s in range(12)]
        reference = lora_llama().to(DEVICE)
        params = [p for p in reference.parameters() if p.requires_grad]
        ref = standard_loop(reference, torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0),
                            batches)
        model = lora_llama()
        n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
        n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
        with tempfile.TemporaryDirectory() as nvme:
            c = config(nvme)
            c["optimizer"]["params"]["weight_decay"] = 0.0
            with strata.torch.initialize(model, c) as engine:
                frozen = [g for g in engine.groups if g.frozen]
                self.assertEqual(sum(g.numel for g in frozen), n_frozen)
                self.assertEqual(sum(g.numel for g in engine.groups if not g.frozen), n_trainable)
                model, optimizer = engine
                losses = standard_loop(model, optimizer, batches)
                stats = engine.stats()
                weights = engine.full_state_dict()
        worst = worst_relative(losses, ref)
        print(f"peft LoRA (r 4 on q, v; {n_trainable} trainable of {n_trainable + n_frozen}): loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}, worst relative difference {worst:.2e}; nvme used {stats['tiers']['nvme']['used']} B")
        self.assertLess(worst, LOSS_RTOL)
        assert_on_nvme(self, stats)
        for n, before in base_before.items():
            self.assertTrue(torch.equal(weights[n], before), f"the frozen {n} changed")

    def test_trainer_and_the_saved_adapters_load_in_peft(self):
        with tempfile.TemporaryDirectory() as tmp:
            ref = Trainer(model=lora_llama(), args=training_args(os.path.join(tmp, "ref")), train_dataset=Tokens(96))
            ref.train()
            nvme = os.path.join(tmp, "nvme")
            os.mkdir(nvme)
            trainer = strata.hf.Trainer(model=lora_llama(), args=training_args(os.path.join(tmp, "strata")),
                                        strata_config=strata_config(nvme), train_dataset=Tokens(96),
                                        eval_dataset=Tokens(8, 100))
            trainer.train()
            evaluated = trainer.evaluate()["eval_loss"]
            saved = os.path.join(tmp, "adapters")
            trainer.save_model(saved)
            trainer.strata_engine.close()
            self.assertTrue(os.path.isfile(os.path.join(saved, "adapter_model.safetensors")), os.listdir(saved))
            loaded = PeftModel.from_pretrained(llama(), saved)
            plain = Trainer(model=loaded, args=training_args(os.path.join(tmp, "plain")), eval_dataset=Tokens(8, 100))
            reloaded = plain.evaluate()["eval_loss"]
        worst = worst_relative(logged_losses(trainer), logged_losses(ref))
        print(f"peft LoRA through strata.hf.Trainer: worst relative difference {worst:.2e} against Trainer; eval loss "
              f"{evaluated:.6f}, with the saved adapters loaded in peft {reloaded:.6f}")
        self.assertLess(worst, LOSS_RTOL)
        self.assertLess(abs(reloaded - evaluated) / evaluated, LOSS_RTOL)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
