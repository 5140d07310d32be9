"""Which parameters of a torch.nn.Module become which Strata group (strata.torch).

The rule, when the caller gives no groups:

1. Each child of a container (nn.ModuleList, nn.Sequential, nn.ModuleDict) that holds
   parameters is one group with its whole subtree: a transformer's repeated blocks become
   one group each.
2. Any other module that owns parameters directly (in its own _parameters: an
   nn.Embedding, an nn.Linear head, a final LayerNorm, a user module's nn.Parameter) is
   one group of those parameters; its children are grouped by the same rule.
3. Groups that share a parameter (tied weights: GPT-2's lm_head.weight is
   transformer.wte.weight) are merged into one group, named by both ("transformer.wte+lm_head").

Explicit groups are a list whose entries are a module, a module's name ("" is the root),
or a tuple/list of those (one group over several modules: tied ones). A group holds the
parameters in its modules' subtrees, except those under a module of another group
nested inside (groups=["", "blocks.0", "blocks.1"]: the blocks are groups, the root's
group has the rest). Every parameter must be in exactly one group: a parameter outside
all of them, or one in two of them (a module listed twice, weights tied across groups),
is refused with its name.

A group's hook modules are where its parameters are bound: a module's forward pre-hook
binds the parameters of its slots as views of the acquired group, its forward hook
releases them. The layout (offsets) is the unique parameters in order of first
appearance; a tied parameter has one offset and a slot in every module that owns it.
"""
from dataclasses import dataclass, field
from typing import List, Tuple

import torch
import torch.nn as nn

from ._strata import StrataError

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
# Parameter dtypes Strata holds: fp32 master weights, converted to the runtime's dtype.
_HELD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROOT_NAME = "(root)"


def error(status, message):
    """A strata.StrataError like the C API's: .status is the C status name."""
    e = StrataError(message)
    e.status = status
    return e


@dataclass
class Slot:
    """One place a parameter lives: owner.<attr>, at offset in its group's flat buffer."""
    name: str        # qualified name, as model.named_parameters() gives it
    owner: nn.Module
    attr: str
    offset: int      # elements
    shape: torch.Size


@dataclass
class Hook:
    """A module whose forward binds the slots below it."""
    name: str
    module: nn.Module
    slots: List[Slot] = field(default_factory=list)


@dataclass
class GroupPlan:
    name: str
    hooks: List[Hook]
    params: List[Tuple[str, nn.Parameter]]  # unique, in layout order
    numel: int = 0
    frozen: bool = False  # its parameters do not require grad: no gradient, no optimizer state


@dataclass
class _Unit:
    """Parameters bound by one module's forward."""
    name: str
    module: nn.Module
    slots: list  # [(qualified name, owner, attr, parameter)]


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _direct(module, prefix):
    """[(qualified name, owner, attr, parameter)] owned by module itself."""
    return [(_join(prefix, a), module, a, p) for a, p in module._parameters.items() if p is not None]


# The walks below are plain recursive functions, not closures: a closure that calls
# itself is a reference cycle, which would keep the parameters in `out` alive until the
# garbage collector runs.

def _subtree(module, prefix, stop=frozenset(), out=None, seen=None):
    """_direct of module and its descendants, not descending into modules in stop (ids)."""
    out, seen = ([], set()) if out is None else (out, seen)
    if id(module) not in seen:
        seen.add(id(module))
        out.extend(_direct(module, prefix))
        for child_name, child in module.named_children():
            if id(child) not in stop:
                _subtree(child, _join(prefix, child_name), stop, out, seen)
    return out


def _auto_units(module, name="", units=None):
    """[_Unit] per the rule above, before merging ties."""
    units = [] if units is None else units
    if _direct(module, name):
        units.append(_Unit(name or ROOT_NAME, module, _direct(module, name)))
    for child_name, child in module.named_children():
        full = _join(name, child_name)
        if not isinstance(module, _CONTAINERS):
            _auto_units(child, full, units)
        elif _subtree(child, full):
            units.append(_Unit(full, child, _subtree(child, full)))
    return units


def _merge_ties(units):
    """[[_Unit]]: units that share a parameter end up in one list (union-find)."""
    parent = list(range(len(units)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first = {}  # id(parameter) -> the first unit holding it
    for i, u in enumerate(units):
        for _, _, _, p in u.slots:
            parent[root(i)] = root(first.setdefault(id(p), i))
    merged = {}
    for i, u in enumerate(units):
        merged.setdefault(root(i), []).append(u)
    return list(merged.values())


def _resolve(model, entry):
    """[(name, module)] of one explicit group entry."""
    by_name = dict(model.named_modules())
    name_of = {id(m): n for n, m in by_name.items()}
    members = list(entry) if isinstance(entry, (tuple, list)) else [entry]
    if not members:
        raise error("STRATA_ERR_INVALID_ARGUMENT", "groups: an empty group; give each group a module or a name")
    out = []
    for x in members:
        if isinstance(x, str):
            if x not in by_name:
                raise error("STRATA_ERR_INVALID_ARGUMENT",
                            f"groups: '{x}' is not a submodule of the model; names are as model.named_modules() "
                            f"gives them (e.g. {sorted(by_name)[1:4]}), '' for the model itself")
            out.append((x, by_name[x]))
        elif isinstance(x, nn.Module):
            if id(x) not in name_of:
                raise error("STRATA_ERR_INVALID_ARGUMENT",
                            f"groups: a {type(x).__name__} that is not a submodule of the model")
            out.append((name_of[id(x)], x))
        else:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"groups: expected modules, module names or tuples of them, got {type(x).__name__}")
    return out


def _explicit_units(model, groups):
    """[[_Unit]], one list per explicit group, each module's subtree without the modules
    of the other groups."""
    resolved = [_resolve(model, entry) for entry in groups]
    grouped = []
    for gi, members in enumerate(resolved):
        stop = frozenset(id(m) for gj, other in enumerate(resolved) if gj != gi for _, m in other)
        grouped.append([_Unit(n or ROOT_NAME, m, _subtree(m, n, stop - {id(m)})) for n, m in members])
    _check_cover(model, grouped)
    return grouped


def _check_cover(model, grouped):
    """Every parameter in exactly one explicit group."""
    owner = {}  # id(parameter) -> (group index, its name there)
    for gi, units in enumerate(grouped):
        for u in units:
            for pname, _, _, p in u.slots:
                other = owner.setdefault(id(p), (gi, pname))
                if other[0] != gi:
                    a = "+".join(x.name for x in grouped[other[0]])
                    b = "+".join(x.name for x in units)
                    tied = "" if other[1] == pname else f" (tied: '{pname}' is the same tensor)"
                    raise error("STRATA_ERR_INVALID_ARGUMENT",
                                f"parameter '{other[1]}' is in two groups, '{a}' and '{b}'{tied}; a parameter "
                                f"belongs to one group: list a module once, and put modules that share a "
                                f"parameter in one group, e.g. groups=[..., ('{a}', '{b}'), ...]")
    missing = [n for n, p in model.named_parameters() if id(p) not in owner]
    if missing:
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    f"parameters outside every group: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}; "
                    f"add groups for them, e.g. '' (the model itself: whatever no other group holds), or pass "
                    f"groups=None for the automatic grouping")


def _check_param(name, p):
    if getattr(p, "strata_group", None) is not None:
        raise error("STRATA_ERR_STATE",
                    f"parameter '{name}' is held by a Strata engine already (strata.torch.initialize ran on this "
                    f"model); use the model and optimizer that call returned, or close it (engine.close()) and "
                    f"load the weights into a fresh model")
    if p.dtype not in _HELD_DTYPES:
        raise error("STRATA_ERR_DTYPE",
                    f"parameter '{name}' is {p.dtype}; Strata holds float32 master weights (with bfloat16 or "
                    f"float16 working copies in a bf16/fp16 configuration): convert the model first "
                    f"(model.float()), or keep non-float values in buffers (register_buffer)")
    if p.device.type == "meta":
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    f"parameter '{name}' is on the meta device (no values); materialise the model first "
                    f"(model.to_empty(device='cpu') and initialise it)")


def _plan(units):
    """The GroupPlans of one group: the layout and the hooks' slots. Trainable parameters
    and frozen ones (requires_grad=False) are separate Strata groups bound by the same
    hooks: a frozen group has no gradient and no optimizer state. A group with both is
    two, the frozen one named '<name> (frozen)'."""
    parts = {False: ([], [], {}, [0]), True: ([], [], {}, [0])}  # frozen -> (hooks, params, offsets, numel)
    bound = set()
    # A member inside another member's subtree goes after it, and binds only what that
    # one does not (nothing, usually: then it gets no hook).
    def nested(u):
        return any(o.module is not u.module and any(m is u.module for m in o.module.modules()) for o in units)

    done = []
    for u in sorted(units, key=nested):
        if any(m is u.module for m in done):
            continue
        done.append(u.module)
        made = {}
        for pname, owner, attr, p in u.slots:
            if (id(owner), attr) in bound:
                continue
            bound.add((id(owner), attr))
            hooks, params, offsets, numel = parts[not p.requires_grad]
            if id(p) not in offsets:
                _check_param(pname, p)
                offsets[id(p)] = numel[0]
                params.append((pname, p))
                numel[0] += p.numel()
            hook = made.get(not p.requires_grad)
            if hook is None:
                hook = made[not p.requires_grad] = Hook(u.name, u.module)
                hooks.append(hook)
            hook.slots.append(Slot(pname, owner, attr, offsets[id(p)], p.shape))
    if not parts[False][0] and not parts[True][0]:
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    f"group '{'+'.join(u.name for u in units)}' holds no parameters (its modules own none, or "
                    f"other groups hold them all); leave it out")
    plans = []
    for frozen in (False, True):
        hooks, params, _, numel = parts[frozen]
        if hooks:
            plans.append(GroupPlan("+".join(dict.fromkeys(h.name for h in hooks)), hooks, params, numel[0], frozen))
    if len(plans) == 2:
        plans[1].name += " (frozen)"
    return plans


def plan_groups(model, groups=None):
    """[GroupPlan] for model: by the rule above, or by `groups`. Changes nothing."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Embedding) and m.sparse:
            raise error("STRATA_ERR_INVALID_ARGUMENT",
                        f"'{name}' is an nn.Embedding with sparse=True; Strata takes dense gradients: "
                        f"build it with sparse=False")
    grouped = _merge_ties(_auto_units(model)) if groups is None else _explicit_units(model, groups)
    plans = [plan for units in grouped for plan in _plan(units)]
    if not plans:
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    "the model has no parameters (was it given to strata.torch.initialize already?)")
    if all(g.frozen for g in plans):
        raise error("STRATA_ERR_INVALID_ARGUMENT",
                    "every parameter of the model is frozen (requires_grad=False): there is nothing to train; "
                    "unfreeze some (with peft: get_peft_model adds trainable adapters)")
    names = [g.name for g in plans]
    assert len(set(names)) == len(names), f"group names repeat: {names}"
    unique = {id(p): p.numel() for p in model.parameters()}
    assert sum(g.numel for g in plans) == sum(unique.values()), "the layout lost or repeated elements"
    return plans
