"""strata.torch: train any torch.nn.Module with Strata holding its parameters.

    engine = strata.torch.initialize(model, config)        # config: a dict, JSON text or a file
    for batch in data:
        loss = engine(*inputs)                             # the module's forward
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ckpt")                         # engine.load_checkpoint("ckpt")

initialize moves the model's parameters into a Strata runtime, one parameter group per
module (the rule is in strata/_torch_groups.py and docs/embedding.md; groups= gives them
explicitly), and deletes them from the model: PyTorch holds no parameters between uses.
The configuration is Strata's (DeepSpeed keys plus a "strata" section): ZeRO stage,
offload to pinned memory or NVMe, the optimizer (Strata runs Adam/AdamW itself), bf16 or
fp16, gradient_accumulation_steps, backend cpu or cuda.

How a micro-batch runs:

  forward   a forward pre-hook on each group's module acquires the group and binds its
            parameters as views of the acquired buffer (torch.from_dlpack: no copy); a
            forward hook releases it when the module returns.
  saved     autograd keeps tensors for backward, among them views of acquired groups
            (a Linear's weight); once released, Strata may reuse that memory for another
            group. Saved-tensor hooks keep such a view as (group, layout) instead, and
            when backward needs it the group is acquired again and the view rebuilt. This
            is what makes releasing after forward safe, in torch 1.13 and 2.x alike: a
            module backward pre-hook (torch >= 2.0) could acquire the group again, but
            it cannot point autograd's saved views at the new buffer.
  backward  the buffer passes through a small autograd Function on each use, whose
            backward receives the gradient of the whole group (autograd sums the
            parameters' gradients, tied ones included); the uses of one micro-batch are
            summed in Strata's gradient buffer, handed in after the last, and the backward
            acquisition released. Groups the loss did not reach get zeros.
  step      Strata's optimizer updates the shards wherever they live; with
            gradient_accumulation_steps = n, every n-th engine.step() runs it (DeepSpeed's
            rule: call step() after every backward).

A forward with gradients disabled (torch.no_grad(): evaluation) between steps reads the
parameters with read_params (a copy) and opens no micro-batch.

Misuse (step before backward, backward twice, a second forward before backward, a
parameter tied across explicit groups, a frozen parameter, a float64 one) raises
strata.StrataError whose .status is a C status name and whose message names the fix.
"""
import enum
import json
import os
from collections import OrderedDict
from contextlib import nullcontext

import torch

from . import Runtime, latest_checkpoint
from ._torch_groups import ROOT_NAME, error, plan_groups

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["Engine", "initialize", "ROOT_NAME"]


def initialize(model, config, groups=None):
    """An Engine training `model` with Strata; `config` is a dict, a JSON string or the
    path of a JSON file. groups=None groups by the rule in _torch_groups; otherwise a list
    of modules, module names, or tuples of them (one group over several modules). On any
    error the model is left as it was."""
    plans = plan_groups(model, groups)
    rt = _runtime(config)
    try:
        dtype = _DTYPES[rt.dtype]
        ids = []
        for g in plans:
            data = torch.cat([p.detach().reshape(-1) for _, p in g.params]).to("cpu", dtype)
            ids.append(rt.register_group(g.name, [g.numel], data=data))
        rt.start()  # budgets and NVMe paths fail here, before the model is touched
    except BaseException:
        rt.close()
        raise
    return Engine(model, rt, plans, ids)


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
        self.token = torch.zeros(0, requires_grad=True)  # puts _GroupGrad in the graph
        self.reset()

    def reset(self):
        self.forward_holds = []  # storage pointer per forward acquisition held (nested uses)
        self.uses = 0            # _GroupGrad nodes whose backward has not run
        self.grad = None         # Strata's gradient buffer, while uses are being summed in it
        self.handed_in = False
        self.backward_buf = None  # the flat buffer acquired for backward


class _SavedView:
    """A tensor autograd saved that is a view of an acquired group."""
    __slots__ = ("group", "size", "stride", "offset")

    def __init__(self, group, t):
        self.group, self.size, self.stride, self.offset = group, t.size(), t.stride(), t.storage_offset()


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


def _storage_ptr(t):
    # untyped_storage: torch >= 2.0 (storage() warns there); storage(): torch 1.13.
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


class Engine:
    """A model whose parameters Strata holds; made by initialize(). Call it as the model."""

    def __init__(self, model, rt, plans, ids):
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
        self._held = {}           # storage pointer of a forward acquisition -> _Group
        self._reading = None      # group -> flat copy, in a no-grad forward between steps
        self._handles = []
        for g in self.groups:
            for h in g.hooks:
                for s in h.slots:
                    if s.attr in s.owner._parameters:
                        del s.owner._parameters[s.attr]  # PyTorch no longer holds it
                    setattr(s.owner, s.attr, None)       # read outside its module's forward: fails
                self._handles.append(h.module.register_forward_pre_hook(
                    lambda m, args, g=g, h=h: self._bind(g, h)))
                self._handles.append(h.module.register_forward_hook(
                    lambda m, args, out, g=g, h=h: self._unbind(g, h)))
        model.to(self.device)  # buffers only now
        if self.dtype != torch.float32:  # as DeepSpeed casts the module to its precision
            for m in model.modules():
                for k, b in m._buffers.items():
                    if b is not None and b.is_floating_point():
                        m._buffers[k] = b.to(self.dtype)

    # ---- the training loop ------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """The module's forward. With gradients enabled it opens a micro-batch."""
        grad = torch.is_grad_enabled()
        if grad:
            self._open_micro_batch()
        elif self._phase not in (_Phase.OPEN, _Phase.FORWARD):
            self._reading = {}  # between steps: no micro-batch to acquire in
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack) if grad else nullcontext():
                out = self.module(*args, **kwargs)
        except BaseException:
            if grad:
                self._abandon_forward()
            raise
        finally:
            self._reading = None
        if grad:
            self._phase = _Phase.FORWARD
        return out

    def backward(self, loss):
        """loss.backward() (times the fp16 loss scale), then every group's gradient is
        handed in: zeros for groups the loss did not reach."""
        if self._phase is not _Phase.FORWARD:
            raise self._misuse("engine.backward(loss)")
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        "engine.backward: the loss does not require grad; compute it from engine(...)'s output "
                        "with gradients enabled (not under torch.no_grad())")
        scale = self.runtime.loss_scale()
        self._phase = _Phase.BACKWARD
        try:
            (loss * scale if scale != 1.0 else loss).backward()
        except BaseException:
            self._finish_backward()
            self._phase = _Phase.FAILED
            raise
        self._finish_backward()
        self._micro += 1
        self._phase = _Phase.BACKWARD_DONE

    def step(self):
        """After each backward. At an accumulation boundary runs the optimizer and returns
        whether it stepped (False: an fp16 overflow skipped it); else returns False."""
        if self._phase is not _Phase.BACKWARD_DONE:
            raise self._misuse("engine.step()")
        self._phase = _Phase.IDLE
        if self._micro < self.gradient_accumulation_steps:
            return False
        self._micro = 0
        self.global_steps += 1
        return self.runtime.step()

    def is_gradient_accumulation_boundary(self):
        """Whether the engine.step() after this micro-batch's backward runs the optimizer
        (DeepSpeed's name)."""
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
        return path, extra.get("client_state")

    def full_state_dict(self):
        """The model's state_dict as it was before initialize, with today's values: the
        parameters read from Strata (float32 copies; tied names share one tensor) and the
        module's buffers. model.load_state_dict() of a fresh model takes it."""
        out = dict(self.module.state_dict())
        for g in self.groups:
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
        """Removes the hooks and closes the runtime; the module has no parameters after."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- state checks -----------------------------------------------------------------

    def _open_micro_batch(self):
        if self._phase is _Phase.IDLE:
            self.runtime.begin_micro_step()
            self._phase = _Phase.OPEN
        elif self._phase is not _Phase.OPEN:
            raise self._misuse("engine(...) (a forward with gradients)")

    def _between_steps(self, call):
        if self._phase is not _Phase.IDLE or self._micro:
            raise error("STRATA_ERR_STATE",
                        f"{call} in the middle of a step ({self._phase.value}, {self._micro} of "
                        f"{self.gradient_accumulation_steps} micro-batches done); call it before a forward or "
                        f"after the engine.step() that ran the optimizer")

    def _misuse(self, call):
        fix = {
            _Phase.IDLE: "run a forward with gradients enabled (not under torch.no_grad()) first: "
                         "loss = engine(...), engine.backward(loss), engine.step()",
            _Phase.OPEN: "the last forward raised; run a forward again, then engine.backward(loss)",
            _Phase.FORWARD: "call engine.backward(loss) for the last forward first (one forward per backward)",
            _Phase.BACKWARD: "activation checkpointing and forwards inside backward are not supported",
            _Phase.BACKWARD_DONE: "call engine.step() after each engine.backward(loss)",
            _Phase.FAILED: "an earlier engine.backward raised and its gradients are incomplete; make a new engine "
                           "and load a checkpoint",
        }[self._phase]
        return error("STRATA_ERR_STATE", f"{call} now ({self._phase.value}): {fix}")

    # ---- hooks ------------------------------------------------------------------------

    def _bind(self, g, hook):
        if self._reading is None and self._phase not in (_Phase.OPEN, _Phase.FORWARD):
            if self._phase in (_Phase.BACKWARD, _Phase.FAILED):
                raise self._misuse(f"forward of '{hook.name}'")
            raise error("STRATA_ERR_STATE",
                        f"'{hook.name}' ran outside engine(...): its parameters are in Strata; call the engine "
                        f"(loss = engine(...)), not the module, so that they can be acquired")
        if self._reading is not None:
            flat = self._reading.get(g)
            if flat is None:
                flat = torch.from_numpy(self.runtime.read_params(g.id)).to(self.device, self.dtype)
                self._reading[g] = flat
        else:
            flat = torch.from_dlpack(self.runtime.acquire(g.id))
            ptr = _storage_ptr(flat)
            g.forward_holds.append(ptr)
            self._held[ptr] = g
            if torch.is_grad_enabled():
                flat = _GroupGrad.apply(g.token, flat, self, g)
                g.uses += 1
        for s in hook.slots:
            setattr(s.owner, s.attr, flat[s.offset: s.offset + s.shape.numel()].view(s.shape))

    def _unbind(self, g, hook):
        for s in hook.slots:
            setattr(s.owner, s.attr, None)
        if self._reading is None:
            self._release_forward(g)

    def _release_forward(self, g):
        ptr = g.forward_holds.pop()
        if not g.forward_holds:
            del self._held[ptr]
        self._sync()
        self.runtime.release(g.id)

    def _abandon_forward(self):
        """After a forward raised: nothing held, no uses; the micro-batch stays open."""
        for g in self.groups:
            while g.forward_holds:
                self._release_forward(g)
            for h in g.hooks:
                for s in h.slots:
                    setattr(s.owner, s.attr, None)
            g.reset()
        self._phase = _Phase.OPEN

    def _pack(self, t):
        if t.layout is not torch.strided or t.device.type != self.device.type:
            return t
        g = self._held.get(_storage_ptr(t))
        return t if g is None else _SavedView(g, t)

    def _unpack(self, saved):
        if not isinstance(saved, _SavedView):
            return saved
        self._check_in_backward()
        g = saved.group
        if g.backward_buf is None:  # the first use of this group in backward
            g.backward_buf = torch.from_dlpack(self.runtime.acquire(g.id))
        return g.backward_buf.as_strided(saved.size, saved.stride, saved.offset)

    def _gradient(self, g, grad):
        """One use's gradient of group g; the last use hands the sum in."""
        self._check_in_backward()
        with torch.no_grad():
            if g.grad is None:
                g.grad = torch.from_dlpack(self.runtime.grad_buffer(g.id))
                g.grad.copy_(grad)
            else:
                g.grad.add_(grad)
        g.uses -= 1
        if g.uses == 0:
            self._hand_in(g)

    def _hand_in(self, g):
        self._sync()
        self.runtime.grad_ready(g.id)
        g.grad, g.handed_in = None, True
        self._release_backward(g)

    def _release_backward(self, g):
        if g.backward_buf is not None:
            g.backward_buf = None
            self._sync()
            self.runtime.release(g.id)

    def _finish_backward(self):
        """Every group's gradient in (zeros where the loss did not reach), nothing held."""
        for g in self.groups:
            if not g.handed_in:
                if g.grad is None:
                    g.grad = torch.from_dlpack(self.runtime.grad_buffer(g.id))
                    g.grad.zero_()
                self._hand_in(g)
            self._release_backward(g)  # acquired again after its hand-in
            g.reset()

    def _check_in_backward(self):
        if self._phase is not _Phase.BACKWARD:
            raise error("STRATA_ERR_STATE",
                        "a backward through the engine's parameters outside engine.backward(loss) (loss.backward() or "
                        "torch.autograd.grad); call engine.backward(loss), which hands the gradients to Strata")

    def _sync(self):
        # cuda: torch's kernels on the acquired or gradient buffer are queued on its
        # stream; they must be done before Strata reuses the memory or reads the gradient.
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
