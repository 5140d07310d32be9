"""strata.hf: transformers.Trainer with Strata holding the model's parameters.

    import strata.hf
    trainer = strata.hf.Trainer(model=model, args=args, strata_config=config,   # the one line
                                train_dataset=..., eval_dataset=...)
    trainer.train()                                  # trainer.train(resume_from_checkpoint=True)

strata.hf.Trainer is transformers.Trainer with the model given to
strata.torch.initialize and the optimizer that returns. From TrainingArguments it takes
into the Strata configuration (strata_config: a dict, or a JSON file's path; Strata's keys
with a "strata" section):

  gradient_accumulation_steps   the config's, set to the arguments' (a different value in
                                the config is refused);
  per_device_train_batch_size   train_micro_batch_size_per_gpu, likewise;
  max_grad_norm                 gradient_clipping: Strata clips at its step, over every
                                rank's shard, and the Trainer's own clipping is skipped;
  learning_rate, adam_beta1/2,  the optimizer section (AdamW) when the config has none;
  adam_epsilon, weight_decay    the Trainer's scheduler drives the lr from there.

Trainer decays every parameter but biases and norm weights; Strata's AdamW decays every
parameter it holds, so weight_decay > 0 without an optimizer section in the config is
refused rather than run differently.

Checkpoints: each checkpoint-<N>/ gets the model's weights from Strata (save_pretrained of
the full state dict: a peft model saves its adapters, which peft loads) and Strata's
sharded checkpoint in checkpoint-<N>/strata/; resume_from_checkpoint loads the latter.
Evaluation runs the model under torch.no_grad(), reading the parameters between steps.
"""
import copy
import json
import os

import torch
import transformers

import strata.torch as strata_torch

from ._torch_groups import error

STRATA_DIR = "strata"  # inside each checkpoint-<N>/


def _strata_config(config, args):
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    f"strata_config: expected a dict or a JSON file's path, got {type(config).__name__}")
    config = copy.deepcopy(config)
    for key, value in (("gradient_accumulation_steps", args.gradient_accumulation_steps),
                       ("train_micro_batch_size_per_gpu", args.per_device_train_batch_size)):
        if key in config and config[key] != value:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"strata_config's {key} is {config[key]} and TrainingArguments' is {value}; the Trainer "
                        f"drives the loop: leave {key} out of strata_config (it is taken from the arguments)")
        config[key] = value
    if "gradient_clipping" in config and args.max_grad_norm and config["gradient_clipping"] != args.max_grad_norm:
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    f"strata_config's gradient_clipping is {config['gradient_clipping']} and TrainingArguments' "
                    f"max_grad_norm is {args.max_grad_norm}; set one of them")
    if args.max_grad_norm and args.max_grad_norm > 0:
        config["gradient_clipping"] = args.max_grad_norm
    if "scheduler" in config:
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    "strata_config has a scheduler section; under transformers.Trainer its own scheduler "
                    "(lr_scheduler_type, warmup_steps) drives the learning rate: leave the section out")
    if "optimizer" not in config:
        if args.weight_decay:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"TrainingArguments.weight_decay is {args.weight_decay}: Trainer decays all parameters but "
                        f"biases and norm weights, Strata's AdamW decays every parameter it holds. Set "
                        f"weight_decay=0, or give strata_config an optimizer section (which decays every parameter)")
        config["optimizer"] = {"type": "AdamW", "params": {
            "lr": args.learning_rate, "betas": [args.adam_beta1, args.adam_beta2], "eps": args.adam_epsilon,
            "weight_decay": 0.0}}
    return config


class Trainer(transformers.Trainer):
    """transformers.Trainer training with Strata (see the module's text)."""

    def __init__(self, model=None, args=None, strata_config=None, **kwargs):
        if model is None or args is None or strata_config is None:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "strata.hf.Trainer needs model=, args= (TrainingArguments) and strata_config=")
        if kwargs.get("optimizers", (None, None))[0] is not None or kwargs.get("optimizer_cls_and_kwargs"):
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "strata.hf.Trainer: Strata's optimizer steps the model; pass no optimizers= "
                        "(a scheduler alone is fine: optimizers=(None, scheduler) is not, the Trainer builds it)")
        if args.bf16 or args.fp16:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "TrainingArguments bf16/fp16 (autocast) with strata.hf.Trainer: Strata's precision is its "
                        "config's bf16/fp16 section; set it there and leave the arguments' off")
        self.strata_engine = strata_torch.initialize(model, _strata_config(strata_config, args))
        model, optimizer = self.strata_engine
        super().__init__(model=model, args=args, optimizers=(optimizer, None), **kwargs)

    # Strata clips at its step (gradient_clipping); the norm it clipped by is in
    # strata_engine.stats()["last_grad_norm"] after the step.
    def _clip_grad_norm(self, model):
        return None

    def _get_grad_norm(self, model, grad_norm=None):
        return grad_norm

    def _save(self, output_dir=None, state_dict=None):
        if state_dict is None:
            state_dict = self.strata_engine.full_state_dict()
        super()._save(output_dir, state_dict=state_dict)

    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        self.strata_engine.save_checkpoint(os.path.join(output_dir, STRATA_DIR),
                                           client_state={"global_step": self.state.global_step})

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        root = os.path.join(resume_from_checkpoint, STRATA_DIR)
        if not os.path.isdir(root):
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"{resume_from_checkpoint} has no Strata checkpoint ({STRATA_DIR}/): resume from a "
                        f"checkpoint strata.hf.Trainer saved")
        self.strata_engine.load_checkpoint(root)

    def _load_best_model(self):
        self._load_from_checkpoint(self.state.best_model_checkpoint)
