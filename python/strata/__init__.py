"""Strata from Python: the tiered store and ZeRO-3 partitioner under another trainer.

A thin layer over libstrata's C API (include/strata/strata.h); docs/embedding.md has
the guide. strata.torch (import it: it needs PyTorch) trains any torch.nn.Module on top,
DeepSpeed-style: engine = strata.torch.initialize(model, config); loss = engine(...);
engine.backward(loss); engine.step(). examples/torch_transformer.py uses it.

    rt = strata.Runtime.from_config({"zero_optimization": {"stage": 3}, ...})
    g = rt.register_group("block.0", [1024, 1024], data=torch_tensor)
    rt.begin_micro_step()
    w = torch.from_dlpack(rt.acquire(g))   # no copy; valid until rt.release(g)
    ...
    rt.release(g)
    rt.submit_grad(g, grad_tensor)
    rt.step()

In a bf16 or fp16 configuration the views are torch.bfloat16 / torch.float16 (rt.dtype),
gradients must be of that dtype, and in fp16 the loss is multiplied by rt.loss_scale().

Errors raise strata.StrataError, whose .status is the C status name
("STRATA_ERR_STATE", ...) and whose message names the problem and the fix.
"""
import json as _json

from ._strata import API_VERSION, Buffer, StrataError, api_version, latest_checkpoint, version
from ._strata import Runtime as _Runtime


class Runtime(_Runtime):
    """One Strata engine. Also a context manager: leaving the block closes it (the C
    runtime is destroyed once no buffer view made from it is alive)."""

    @classmethod
    def from_config(cls, config):
        """A runtime from a configuration given as a dict (or a JSON string)."""
        return cls(config if isinstance(config, str) else _json.dumps(config))

    @classmethod
    def from_file(cls, path):
        """A runtime from a JSON configuration file (strata_runtime_create_from_file)."""
        return cls(path=path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


__all__ = ["API_VERSION", "Buffer", "Runtime", "StrataError", "api_version", "latest_checkpoint", "version"]
