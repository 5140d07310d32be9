"""strata.torch: train any torch.nn.Module with Strata holding its parameters.

Three ways in (docs/embedding.md has a runnable example of each):

    # 1. The standard PyTorch loop
    model, optimizer = strata.torch.initialize(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, ...)   # any torch scheduler
    for batch in data:
        loss = model(**batch).loss / accumulation
        loss.backward()
        if boundary:
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

    # 2. transformers.Trainer: strata.hf.Trainer in its place (python/strata/hf.py)

    # 3. The engine API (DeepSpeed's)
    engine = strata.torch.initialize(model, config)
    loss = engine(*inputs); engine.backward(loss); engine.step()

initialize returns an Engine, which unpacks as (model, optimizer). It moves the model's
parameters into a Strata runtime, one parameter group per module (the rule is in
strata/_torch_groups.py and docs/embedding.md; groups= gives them explicitly). In the
model each parameter is replaced by a stand-in: an nn.Parameter with no elements
(.strata_shape, .strata_numel and .strata_group say what it stands for, requires_grad is
the original's), so PyTorch holds no parameter memory between uses. The configuration is
Strata's (DeepSpeed keys plus a "strata" section): ZeRO stage, offload to pinned memory or
NVMe, the optimizer (Strata runs Adam/AdamW itself), bf16 or fp16,
gradient_accumulation_steps, gradient_clipping, backend cpu or cuda.

Frozen parameters (requires_grad=False at initialize: a LoRA base) are held in the
runtime's precision in the offload_param tier, gathered like any other, with no gradient
and no optimizer state. A module with both kinds is two Strata groups bound together.

How a micro-batch runs:

  forward   the model's forward is wrapped: with gradients enabled it opens a micro-batch.
            A forward pre-hook on each group's module acquires the group and binds its
            parameters as views of the acquired buffer (torch.from_dlpack: no copy); a
            forward hook releases it when the module returns. In fp16 the outputs pass
            through a node whose backward multiplies by the loss scale, so a plain
            loss.backward() gives scaled gradients, as DeepSpeed's engine.backward does.
  saved     autograd keeps tensors for backward, among them views of acquired groups.
            Saved-tensor hooks keep such a view as (group, layout) instead, and when
            backward needs it the group is acquired again and the view rebuilt; that
            acquisition is released once the group's gradient is in (trainable) or the
            last saved view of it is gone (frozen).
  backward  the buffer of a trainable group passes through a small autograd Function on
            each use, whose backward receives the gradient of the whole group (autograd
            sums the parameters' gradients, tied ones included); the uses of one
            micro-batch are summed in Strata's gradient buffer and handed in after the
            last. The micro-batch closes at the next forward, optimizer.step() or
            engine.step(): groups the loss did not reach get zeros then.
  recompute activation checkpointing (model.gradient_checkpointing_enable(), reentrant or
            not) runs a block's forward again inside backward: its groups are acquired
            again and released once their gradient is in (frozen ones once backward has
            moved on to another module's recomputation).
  step      Strata's optimizer updates the shards wherever they live.

Gradient accumulation: with loss.backward() the gradients are summed over the
micro-batches as PyTorch's are (divide the loss by the accumulation yourself, as
transformers' Trainer does), and optimizer.step() must come after exactly
gradient_accumulation_steps micro-batches; with engine.backward() they are averaged and
engine.step() follows every backward (DeepSpeed's rules).

Clipping is Strata's (`gradient_clipping`: the norm over all ranks' shards, at the step).
The stand-ins' .grad is a tensor that refuses every use, so torch.nn.utils.clip_grad_norm_
(model.parameters(), ...) or a second optimizer over the stand-ins raises, naming the fix,
instead of silently doing nothing.

A forward with gradients disabled (torch.no_grad(): evaluation) between steps reads the
parameters with read_params (a copy) and opens no micro-batch.

Misuse (step without backward, a second forward before backward, a parameter frozen or
unfrozen after initialize, a parameter tied across explicit groups, a float64 one, a
model given to initialize twice) raises strata.StrataError whose .status is a C status
name and whose message names the fix.
"""
import enum
import functools
import json
import math
import os
import types
import weakref
from collections import OrderedDict
from contextlib import nullcontext

import torch

from . import Runtime, latest_checkpoint
from ._torch_groups import ROOT_NAME, error, plan_groups

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["Engine", "Optimizer", "initialize", "ROOT_NAME"]


def initialize(model, config, groups=None):
    """An Engine training `model` with Strata; `config` is a dict, a JSON string or the
    path of a JSON file. It unpacks as (model, optimizer) for the standard loop.
    groups=None groups by the rule in _torch_groups; otherwise a list of modules, module
    names, or tuples of them (one group over several modules). On any error the model is
    left as it was."""
    plans = plan_groups(model, groups)
    rt = _runtime(config)
    try:
        dtype = _DTYPES[rt.dtype]
        ids = []
        for g in plans:
            data = torch.cat([p.detach().reshape(-1) for _, p in g.params]).to("cpu", dtype)
            if g.frozen:
                ids.append(rt.register_group(g.name, [g.numel], data=data, frozen=True))
            else:
                ids.append(rt.register_group(g.name, [g.numel], data=data))
        rt.start()  # budgets and NVMe paths fail here, before the model is touched
    except BaseException:
        rt.close()
        raise
    return Engine(model, rt, plans, ids, _optimizer_params(config))


def _config_dict(config):
    if isinstance(config, dict):
        return config
    try:
        if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
            with open(config) as f:
                return json.load(f)
        return json.loads(config)
    except (OSError, ValueError):
        return {}  # the runtime has refused it already, or reads it its own way


def _optimizer_params(config):
    """The optimizer section's hyper-parameters, for optimizer.param_groups."""
    params = _config_dict(config).get("optimizer", {}).get("params", {})
    return {"betas": tuple(params.get("betas", (0.9, 0.999))), "eps": params.get("eps", 1e-8),
            "weight_decay": params.get("weight_decay", 0.0)}


def _runtime(config):
    if isinstance(config, dict):
        return Runtime.from_config(config)
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        return Runtime.from_file(os.fspath(config))
    if isinstance(config, str):
        return Runtime.from_config(config)
    raise error("STRATA_ERR_INVALID_ARGUMENT",
                f"config: expected a dict, JSON text or a file path, got {type(config).__name__}")


class _Phase(enum.Enum):
    IDLE = "between micro-batches"
    OPEN = "micro-batch open, no forward recorded"  # after a forward that raised
    FORWARD = "forward done, waiting for backward"
    BACKWARD = "inside backward"
    BACKWARD_DONE = "backward done, waiting for step"
    FAILED = "a backward raised"


class _Group:
    """A registered group with its hooks and its state in the current micro-batch."""

    def __init__(self, plan, gid):
        # Not plan.params: holding the nn.Parameters would keep their memory alive.
        self.name, self.id, self.hooks, self.numel = plan.name, gid, plan.hooks, plan.numel
        self.frozen = plan.frozen
        self.token = torch.zeros(0, requires_grad=True)  # puts _GroupGrad in the graph
        self.reset()

    def reset(self):
        self.forward_holds = []  # storage pointer per forward acquisition held (nested uses)
        self.uses = 0            # _GroupGrad nodes whose backward has not run
        self.grad = None         # Strata's gradient buffer, while uses are being summed in it
        self.handed_in = False
        self.backward_buf = None  # the flat buffer acquired for backward
        self.saved = 0            # live saved views of this micro-batch
        self.recompute_holds = 0  # acquisitions by forwards inside backward (checkpointing)
        self.backward_bound = None  # the hook whose slots _bind_for_backward bound


class _SavedView:
    """A tensor autograd saved that is a view of an acquired group."""
    __slots__ = ("group", "size", "stride", "offset", "engine", "gen", "__weakref__")

    def __init__(self, engine, group, t):
        self.group, self.size, self.stride, self.offset = group, t.size(), t.stride(), t.storage_offset()
        self.engine, self.gen = weakref.ref(engine), engine._gen
        group.saved += 1

    def __del__(self):
        engine = self.engine()
        if engine is not None:
            engine._saved_view_gone(self.group, self.gen)


class _GroupGrad(torch.autograd.Function):
    """Identity on the group's flat buffer whose backward receives the gradient of the
    whole group for this use."""

    @staticmethod
    def forward(ctx, token, flat, engine, group):
        ctx.engine, ctx.group = engine, group
        return flat.view(-1)

    @staticmethod
    def backward(ctx, grad):
        ctx.engine._gradient(ctx.group, grad)
        return None, None, None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity whose backward multiplies by the fp16 loss scale."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class _Refused(torch.Tensor):
    """A stand-in's .grad: every use raises (clip_grad_norm_, another optimizer)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise error("STRATA_ERR_STATE",
                    "the model's parameters are stand-ins: Strata holds the gradients and steps them. Clip with "
                    "the config's gradient_clipping (strata.hf.Trainer moves TrainingArguments.max_grad_norm "
                    "there), and step with the optimizer strata.torch.initialize returned, not another one")


def _refused_grad(standin):
    return torch.Tensor._make_subclass(_Refused, torch.empty(0, dtype=standin.dtype, device=standin.device))


def _storage_ptr(t):
    # untyped_storage: torch >= 2.0 (storage() warns there); storage(): torch 1.13.
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


def _in_backward():
    """Whether this thread runs inside autograd's backward (a recomputation)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _map_outputs(out, fn):
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # namedtuple
        return type(out)(*(_map_outputs(x, fn) for x in out))
    if isinstance(out, (tuple, list)):
        return type(out)(_map_outputs(x, fn) for x in out)
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict
        for k in list(out.keys()):
            out[k] = _map_outputs(out[k], fn)
        return out
    return out


class Optimizer(torch.optim.Optimizer):
    """Strata's optimizer seen as a torch.optim.Optimizer, for the standard loop and for
    torch's and transformers' schedulers: step() runs Strata's step; param_groups[0]['lr']
    is the learning rate of the next step (set it, or let a scheduler set it, before the
    step's first forward); betas, eps and weight_decay come from the config and are read
    only; zero_grad() is accepted (Strata's gradient buffers start each step at zero)."""

    def __init__(self, engine, standins, hyper):
        self._engine_ref = engine
        lr = engine.runtime.learning_rate()
        super().__init__(standins, dict(lr=lr, **hyper))
        self._published = lr  # the lr the runtime has
        self._hyper = dict(hyper)

    def step(self, closure=None):
        if closure is not None:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "optimizer.step(closure): Strata's optimizer takes no closure (LBFGS-style re-evaluation); "
                        "run forward and backward before optimizer.step()")
        return self._engine_ref._optimizer_step()

    def zero_grad(self, set_to_none=True):
        self._engine_ref._zero_grad()

    def add_param_group(self, param_group):
        if self.param_groups:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "optimizer.add_param_group: the Strata optimizer steps every trainable parameter the "
                        "engine holds, with the config's hyper-parameters; it takes no other parameters")
        super().add_param_group(param_group)

    def _check_groups(self):
        """The lr the next step takes from param_groups; the rest must not change."""
        g = self.param_groups[0]
        for k, v in self._hyper.items():
            now = tuple(g[k]) if k == "betas" else g[k]
            if now != v:
                raise error("STRATA_ERR_INVALID_ARGUMENT",
                            f"optimizer.param_groups[0]['{k}'] changed from {v} to {now}; Strata's optimizer takes "
                            f"{k} from the config's optimizer.params (only the lr may be set from Python)")
        lr = g["lr"]
        if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"optimizer.param_groups[0]['lr'] is {lr!r}; set a finite number >= 0")
        return float(lr)

    def _publish_lr(self):
        lr = self._check_groups()
        if lr != self._published:
            self._engine_ref.runtime.set_learning_rate(lr)
            self._published = lr


class Engine:
    """A model whose parameters Strata holds; made by initialize(). Call it as the model,
    or unpack it: model, optimizer = initialize(...)."""

    def __init__(self, model, rt, plans, ids, hyper):
        self.module, self.runtime = model, rt
        info = rt.info()
        self.device = torch.device(info["device"])
        self.dtype = _DTYPES[info["dtype"]]
        self.gradient_accumulation_steps = info["gradient_accumulation_steps"]
        self.global_steps = 0  # optimizer steps (engine.step() at accumulation boundaries)
        self.groups = [_Group(p, i) for p, i in zip(plans, ids)]
        self._names = list(model.state_dict().keys())  # for full_state_dict's order
        self._phase = _Phase.IDLE
        self._micro = 0           # micro-batches since the last optimizer step
        self._gen = 0             # micro-batches begun: saved views of older ones count no more
        self._gen_of_hooks = 0    # the micro-batch whose forward registered the gradient hooks
        self._held = {}           # storage pointer of a forward acquisition -> _Group
        self._reading = None      # group -> flat copy, in a no-grad forward between steps
        self._engine_backward = False  # this micro-batch's backward is engine.backward's
        self._recompute_module = None  # the module whose forward last ran inside backward
        self._handles = []
        self._standins = {}       # id(original parameter) -> its stand-in
        for plan, g in zip(plans, self.groups):
            for pname, p in plan.params:
                s = self._standins.get(id(p))
                if s is None:
                    s = torch.nn.Parameter(torch.empty(0, dtype=self.dtype, device=self.device),
                                           requires_grad=p.requires_grad)
                    s.strata_shape, s.strata_numel, s.strata_group, s.strata_name = p.shape, p.numel(), g.name, pname
                    self._standins[id(p)] = s
            for h in g.hooks:
                for slot in h.slots:
                    # A tied name (not in plan.params) finds the stand-in through its owner's parameter.
                    slot.standin = self._standins[id(slot.owner._parameters[slot.attr])]
        self._root_hooks = []  # (group, hook) bound by the model's own forward: hooks on it would run first
        for g in self.groups:
            for h in g.hooks:
                for s in h.slots:
                    s.owner._parameters[s.attr] = s.standin  # PyTorch no longer holds the original
                if h.module is model:
                    self._root_hooks.append((g, h))
                    continue
                self._handles.append(h.module.register_forward_pre_hook(
                    lambda m, args, g=g, h=h: self._bind(g, h)))
                self._handles.append(h.module.register_forward_hook(
                    lambda m, args, out, g=g, h=h: self._unbind(g, h, out)))
        del plans
        model.to(self.device)  # buffers only now (and the stand-ins)
        if self.dtype != torch.float32:  # as DeepSpeed casts the module to its precision
            for m in model.modules():
                for k, b in m._buffers.items():
                    if b is not None and b.is_floating_point():
                        m._buffers[k] = b.to(self.dtype)
        self._wrap_forward(model)
        trainable = [s for g in self.groups if not g.frozen for s in self._standins_of(g)]
        self.optimizer = Optimizer(self, list(dict.fromkeys(trainable)), hyper)

    def __iter__(self):
        """model, optimizer = strata.torch.initialize(model, config)"""
        return iter((self.module, self.optimizer))

    def _standins_of(self, g):
        return [s.standin for h in g.hooks for s in h.slots]

    def _wrap_forward(self, model):
        original = type(model).forward
        engine = self  # the model keeps its engine alive: a loop holds only model and optimizer

        @functools.wraps(original)
        def forward(module, *args, **kwargs):
            return engine._run_forward(original.__get__(module), args, kwargs)

        # A bound method on the instance: model(...) calls it, inspect.signature and
        # transformers see the original's parameters, accelerate can rewrap __func__.
        model.forward = types.MethodType(forward, model)

    # ---- the training loop ------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _run_forward(self, forward, args, kwargs):
        """The model's forward. With gradients enabled it opens a micro-batch."""
        self._settle_backward()
        grad = torch.is_grad_enabled()
        if grad:
            self._check_frozen_unchanged()
            self._open_micro_batch()
        elif self._phase not in (_Phase.OPEN, _Phase.FORWARD):
            self._reading = {}  # between steps: no micro-batch to acquire in
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack) if grad else nullcontext():
                bound = []
                try:
                    for g, h in self._root_hooks:
                        self._bind(g, h)
                        bound.append((g, h))
                    out = forward(*args, **kwargs)
                finally:
                    for g, h in reversed(bound):
                        self._unbind(g, h)
        except BaseException:
            if grad:
                self._abandon_forward()
            raise
        finally:
            self._reading = None
        if grad:
            self._phase = _Phase.FORWARD
            scale = self.runtime.loss_scale()
            if scale != 1.0:
                out = _map_outputs(out, lambda t: _ScaleGrad.apply(t, scale)
                                   if t.requires_grad and t.is_floating_point() else t)
        return out

    def backward(self, loss):
        """The engine API's backward: loss.backward() (the fp16 loss scale is in the
        forward's outputs already), then every group's gradient is handed in: zeros for
        groups the loss did not reach. Gradients of the micro-batches of one step are
        averaged (DeepSpeed's rule)."""
        if self._phase is not _Phase.FORWARD:
            raise self._misuse("engine.backward(loss)")
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "engine.backward: the loss does not require grad; compute it from engine(...)'s output "
                        "with gradients enabled (not under torch.no_grad())")
        self._phase = _Phase.BACKWARD
        self._engine_backward = True
        try:
            loss.backward()
        except BaseException:
            self._finish_backward()
            self._phase = _Phase.FAILED
            raise
        self._settle_backward()

    def step(self):
        """The engine API's step, after each backward. At an accumulation boundary runs
        the optimizer and returns whether it stepped (False: an fp16 overflow skipped
        it); else returns False."""
        self._settle_backward()
        if self._phase is not _Phase.BACKWARD_DONE:
            raise self._misuse("engine.step()")
        self._phase = _Phase.IDLE
        if self._micro < self.gradient_accumulation_steps:
            return False
        return self._run_step()

    def _optimizer_step(self):
        """optimizer.step(): after gradient_accumulation_steps micro-batches."""
        self._settle_backward()
        if self._phase is not _Phase.BACKWARD_DONE:
            raise self._misuse("optimizer.step()")
        if self._micro != self.gradient_accumulation_steps:
            raise error("STRATA_ERR_STATE",
                        f"optimizer.step() after {self._micro} micro-batch(es); the config's "
                        f"gradient_accumulation_steps is {self.gradient_accumulation_steps}: make the two equal "
                        f"(step after every {self.gradient_accumulation_steps} backward passes, or set "
                        f"gradient_accumulation_steps to your loop's; strata.hf.Trainer takes the TrainingArguments')")
        if self.optimizer._check_groups() != self.optimizer._published:
            raise error("STRATA_ERR_STATE",
                        "optimizer.param_groups[0]['lr'] changed after this step's first forward; Strata's "
                        "optimizer starts a step's updates during its backward pass, so set the lr before the "
                        "forward (schedulers do: scheduler.step() after optimizer.step())")
        self._phase = _Phase.IDLE
        return self._run_step()

    def _run_step(self):
        self._micro = 0
        self.global_steps += 1
        return self.runtime.step()

    def _zero_grad(self):
        # Strata's gradient buffers start every step at zero; between backward and step a
        # zero_grad would drop the micro-batches so far, which Strata cannot.
        self._settle_backward()
        if self._micro:
            raise error("STRATA_ERR_STATE",
                        f"optimizer.zero_grad() after {self._micro} micro-batch(es) of a step; their gradients are "
                        f"in Strata's shards already and cannot be dropped: call zero_grad() after "
                        f"optimizer.step() (or before the step's first forward)")

    def is_gradient_accumulation_boundary(self):
        """Whether the engine.step() after this micro-batch's backward runs the optimizer
        (DeepSpeed's name)."""
        self._settle_backward()
        done = self._micro if self._phase is _Phase.BACKWARD_DONE else self._micro + 1
        return done >= self.gradient_accumulation_steps

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # ---- checkpoints and parameters ---------------------------------------------------

    def save_checkpoint(self, save_dir, client_state=None):
        """Saves under save_dir/step-<N>/ (sharded, atomic) and returns that directory.
        client_state: anything JSON can hold, returned by load_checkpoint."""
        self._between_steps("engine.save_checkpoint")
        extra = {"strata.torch": {"global_steps": self.global_steps}, "client_state": client_state}
        try:
            text = json.dumps(extra)
        except TypeError as e:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"save_checkpoint: client_state must be JSON-serialisable ({e})") from None
        return self.runtime.save_checkpoint(os.fspath(save_dir), text)

    def load_checkpoint(self, load_dir):
        """Loads load_dir (a step-<N> directory, or a root: its latest); returns
        (the directory loaded, client_state)."""
        self._between_steps("engine.load_checkpoint")
        load_dir = os.fspath(load_dir)
        path = latest_checkpoint(load_dir) or load_dir
        text = self.runtime.load_checkpoint(load_dir)
        extra = json.loads(text) if text else {}
        self.global_steps = extra.get("strata.torch", {}).get("global_steps", 0)
        self.optimizer._published = self.runtime.learning_rate()
        return path, extra.get("client_state")

    def full_state_dict(self, trainable_only=False):
        """The model's state_dict as it was before initialize, with today's values: the
        parameters read from Strata (float32 copies; tied names share one tensor) and the
        module's buffers. model.load_state_dict() of a fresh model takes it.
        trainable_only: the trainable parameters alone (a LoRA model's adapters)."""
        self._settle_backward()
        out = {} if trainable_only else dict(self.module.state_dict())
        for g in self.groups:
            if trainable_only and g.frozen:
                continue
            flat = torch.from_numpy(self.runtime.read_params(g.id))
            views = {}  # (offset, shape) -> tensor: a tied parameter's names share one, as in the model
            for h in g.hooks:
                for s in h.slots:
                    key = (s.offset, tuple(s.shape))
                    if key not in views:
                        views[key] = flat[s.offset: s.offset + s.shape.numel()].view(s.shape)
                    out[s.name] = views[key]
        return OrderedDict((k, out[k]) for k in self._names if k in out)

    def stats(self):
        return self.runtime.stats()

    def close(self):
        """Removes the hooks and closes the runtime; the module's parameters stay stand-ins."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.module.__dict__.pop("forward", None)
        self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- state checks -----------------------------------------------------------------

    def _open_micro_batch(self):
        if self._phase in (_Phase.IDLE, _Phase.BACKWARD_DONE):
            if self._phase is _Phase.BACKWARD_DONE and self._micro >= self.gradient_accumulation_steps:
                raise error("STRATA_ERR_STATE",
                            f"a forward after {self._micro} micro-batches without an optimizer step; the config's "
                            f"gradient_accumulation_steps is {self.gradient_accumulation_steps}: call "
                            f"optimizer.step() (or engine.step()) after that many backward passes")
            if self._micro == 0:
                self.optimizer._publish_lr()
            self.runtime.begin_micro_step()
            self._gen += 1
            self._gen_of_hooks = self._gen
            self._engine_backward = False
            self._phase = _Phase.OPEN
        elif self._phase is not _Phase.OPEN:
            raise self._misuse("a forward with gradients")

    def _check_frozen_unchanged(self):
        for g in self.groups:
            for s in self._standins_of(g):
                if s.requires_grad == g.frozen:
                    was, now = ("frozen", "requires grad") if g.frozen else ("trainable", "is frozen")
                    raise error("STRATA_ERR_STATE",
                                f"parameter '{s.strata_name}' was {was} at strata.torch.initialize and now {now}; "
                                f"Strata planned its memory (gradient, optimizer state) then: set requires_grad "
                                f"before initialize, and initialize again (load a checkpoint into a fresh model)")

    def _between_steps(self, call):
        self._settle_backward()
        if self._phase not in (_Phase.IDLE, _Phase.BACKWARD_DONE) or self._micro:
            raise error("STRATA_ERR_STATE",
                        f"{call} in the middle of a step ({self._phase.value}, {self._micro} of "
                        f"{self.gradient_accumulation_steps} micro-batches done); call it before a forward or "
                        f"after the optimizer step")

    def _misuse(self, call):
        fix = {
            _Phase.IDLE: "run a forward with gradients enabled (not under torch.no_grad()) and loss.backward() "
                         "first",
            _Phase.OPEN: "the last forward raised; run a forward again, then loss.backward()",
            _Phase.FORWARD: "call loss.backward() for the last forward first (one forward per backward)",
            _Phase.BACKWARD: "forwards of the whole model inside backward are not supported",
            _Phase.BACKWARD_DONE: "call engine.step() after each engine.backward(loss), optimizer.step() after "
                                  "gradient_accumulation_steps backward passes",
            _Phase.FAILED: "an earlier backward raised and its gradients are incomplete; make a new engine "
                           "and load a checkpoint",
        }[self._phase]
        return error("STRATA_ERR_STATE", f"{call} now ({self._phase.value}): {fix}")

    # ---- hooks ------------------------------------------------------------------------

    def _bind(self, g, hook):
        if _in_backward():
            flat = self._bind_recompute(g, hook)
        elif self._reading is None and self._phase not in (_Phase.OPEN, _Phase.FORWARD):
            if self._phase in (_Phase.BACKWARD, _Phase.FAILED):
                raise self._misuse(f"forward of '{hook.name}'")
            raise error("STRATA_ERR_STATE",
                        f"'{hook.name}' ran outside the model's forward: its parameters are in Strata; call the "
                        f"model (or the engine) that strata.torch.initialize returned, so that they can be acquired")
        elif self._reading is not None:
            flat = self._reading.get(g)
            if flat is None:
                flat = torch.from_numpy(self.runtime.read_params(g.id)).to(self.device, self.dtype)
                self._reading[g] = flat
        else:
            flat = torch.from_dlpack(self.runtime.acquire(g.id))
            ptr = _storage_ptr(flat)
            counted = torch.is_grad_enabled() and not g.frozen
            g.forward_holds.append((ptr, counted))
            self._held[ptr] = g
            if counted:
                flat = _GroupGrad.apply(g.token, flat, self, g)
                g.uses += 1
        for s in hook.slots:
            s.owner._parameters[s.attr] = flat[s.offset: s.offset + s.shape.numel()].view(s.shape)

    def _bind_recompute(self, g, hook):
        """A forward inside backward: activation checkpointing recomputes a block."""
        self._enter_backward()
        if hook.module is not self._recompute_module:
            # Backward has moved on to another block: the last one's frozen groups are done.
            for other in self.groups:
                if other.frozen and other.recompute_holds and all(h.module is not hook.module for h in other.hooks):
                    self._release_recompute(other)
            self._recompute_module = hook.module
        flat = torch.from_dlpack(self.runtime.acquire(g.id))
        g.recompute_holds += 1
        # Reentrant checkpointing ran the first forward without gradients (no use was
        # counted) and takes the gradient from this graph; non-reentrant counted the use
        # then and takes it from that graph, this one only gives saved values.
        if torch.is_grad_enabled() and not g.frozen:
            if g.uses == 0 and not g.handed_in:
                flat = _GroupGrad.apply(g.token, flat, self, g)
                g.uses += 1
            else:  # what the recomputation saves must be what the first forward saved
                flat = flat.detach().requires_grad_()
        return flat

    def _unbind(self, g, hook, out=None):
        for s in hook.slots:
            s.owner._parameters[s.attr] = s.standin
        if self._reading is not None or _in_backward():
            return
        counted = self._release_forward(g)
        if torch.is_grad_enabled() and getattr(hook.module, "gradient_checkpointing", False) and hook.module.training:
            self._before_backward_of(g, hook, out, counted)

    def _before_backward_of(self, g, hook, out, counted):
        """transformers' checkpointing (GradientCheckpointingLayer) recomputes a block by
        calling its forward, not the module, so no pre-hook binds the parameters then:
        bind them when the gradient reaches the block's output, before its backward."""
        outputs = []
        _map_outputs(out, lambda t: outputs.append(t) or t)
        first = next((t for t in outputs if t.requires_grad), None)
        if first is None:
            return
        if counted and "CheckpointFunction" in type(first.grad_fn).__name__:
            # Reentrant: the block's forward ran without gradients, so this bind's use is
            # never reached; the recomputation's is (_bind_recompute counts it).
            g.uses -= 1
        first.register_hook(lambda grad, g=g, hook=hook: self._bind_for_backward(g, hook))

    def _bind_for_backward(self, g, hook):
        if g.backward_bound is None and self._gen == self._gen_of_hooks:
            with torch.enable_grad():  # autograd runs hooks without; the recomputation has it
                flat = self._bind_recompute(g, hook)
                for s in hook.slots:
                    s.owner._parameters[s.attr] = flat[s.offset: s.offset + s.shape.numel()].view(s.shape)
            g.backward_bound = hook

    def _release_forward(self, g):
        ptr, counted = g.forward_holds.pop()
        if not any(p == ptr for p, _ in g.forward_holds):
            del self._held[ptr]
        self._sync()
        self.runtime.release(g.id)
        return counted

    def _release_recompute(self, g):
        if g.backward_bound is not None:
            for s in g.backward_bound.slots:
                s.owner._parameters[s.attr] = s.standin
            g.backward_bound = None
        self._sync()
        while g.recompute_holds:
            g.recompute_holds -= 1
            self.runtime.release(g.id)

    def _abandon_forward(self):
        """After a forward raised: nothing held, no uses; the micro-batch stays open."""
        for g in self.groups:
            while g.forward_holds:
                self._release_forward(g)
            for h in g.hooks:
                for s in h.slots:
                    s.owner._parameters[s.attr] = s.standin
            g.reset()
        self._held.clear()
        self._gen += 1  # saved views of the abandoned graph count no more
        self._phase = _Phase.OPEN

    def _pack(self, t):
        if t.layout is not torch.strided or t.device.type != self.device.type:
            return t
        g = self._held.get(_storage_ptr(t))
        return t if g is None else _SavedView(self, g, t)

    def _unpack(self, saved):
        if not isinstance(saved, _SavedView):
            return saved
        self._enter_backward(saved.gen)
        g = saved.group
        if g.backward_buf is None:  # the first use of this group in backward
            g.backward_buf = torch.from_dlpack(self.runtime.acquire(g.id))
        return g.backward_buf.as_strided(saved.size, saved.stride, saved.offset)

    def _saved_view_gone(self, g, gen):
        if gen != self._gen:
            return
        g.saved -= 1
        # A frozen group gets no gradient to say its backward is over: its last saved
        # view going (autograd frees them once their node has run) does.
        if g.saved == 0 and g.frozen and g.backward_buf is not None and self._phase is _Phase.BACKWARD:
            self._release_backward(g)

    def _gradient(self, g, grad):
        """One use's gradient of group g; the last use hands the sum in."""
        self._enter_backward()
        if g.handed_in:
            raise error("STRATA_ERR_STATE",
                        f"a second gradient for group '{g.name}' in this micro-batch, after its gradient was handed "
                        f"in: a second backward through one forward (retain_graph), or a parameter used both inside "
                        f"and outside an activation-checkpointed block; run the forward again for each backward")
        with torch.no_grad():
            if g.grad is None:
                g.grad = torch.from_dlpack(self.runtime.grad_buffer(g.id))
                g.grad.copy_(grad)
            else:
                g.grad.add_(grad)
        g.uses -= 1
        if g.uses == 0:
            self._hand_in(g)

    def _enter_backward(self, gen=None):
        if self._phase is _Phase.FORWARD and (gen is None or gen == self._gen):
            self._phase = _Phase.BACKWARD  # loss.backward(): the standard loop
        elif self._phase is not _Phase.BACKWARD or (gen is not None and gen != self._gen):
            raise error("STRATA_ERR_STATE",
                        "a backward through the model's parameters outside its micro-batch (a graph kept from an "
                        "earlier step with retain_graph, a second backward, or one after the step); run the "
                        "forward again and call loss.backward() once per forward")

    def _hand_in(self, g):
        if not self._engine_backward and self.gradient_accumulation_steps > 1 and g.grad is not None:
            # loss.backward(): gradients are sums over micro-batches, as PyTorch's; Strata
            # averages what it is handed (DeepSpeed's rule), so hand in the sum times n.
            g.grad.mul_(self.gradient_accumulation_steps)
        self._sync()
        self.runtime.grad_ready(g.id)
        g.grad, g.handed_in = None, True
        for s in self._standins_of(g):
            s.grad = _refused_grad(s)
        self._release_backward(g)
        self._release_recompute(g)

    def _release_backward(self, g):
        if g.backward_buf is not None:
            g.backward_buf = None
            self._sync()
            self.runtime.release(g.id)

    def _settle_backward(self):
        """Closes the micro-batch whose loss.backward() has run, if one has."""
        if self._phase is _Phase.BACKWARD:
            self._finish_backward()
            self._micro += 1
            self._phase = _Phase.BACKWARD_DONE

    def _finish_backward(self):
        """Every group's gradient in (zeros where the loss did not reach), nothing held."""
        for g in self.groups:
            if not g.handed_in and not g.frozen:
                if g.grad is None:
                    g.grad = torch.from_dlpack(self.runtime.grad_buffer(g.id))
                    g.grad.zero_()
                self._hand_in(g)
            self._release_backward(g)  # acquired again after its hand-in
            self._release_recompute(g)
            g.reset()
        self._gen += 1
        self._recompute_module = None

    def _sync(self):
        # cuda: torch's kernels on the acquired or gradient buffer are queued on its
        # stream; they must be done before Strata reuses the memory or reads the gradient.
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
