"""Stage 3 between steps: what user code can read of a module whose parameters are sharded.

Between uses a stage-3 parameter holds no values and refuses every read of them in one line
(``free_parameter.py``), while its shape, dtype and ``requires_grad`` still answer. The ways to
the values, each a collective (every rank calls it):

- ``ShardedDataParallel.full_state_dict()`` (and the wrapper's own ``state_dict()``): whole
  values, gathered one unit at a time;
- ``with wrapper.summon_full_params():``: every unit gathered for the block, as FSDP's context of
  that name. Reads see the values; writes (loading weights, averaging them) are kept when the
  block ends.

The wrapped module's own ``state_dict()`` and ``copy.deepcopy`` would hand out empty tensors as if
they were the model (and its ``load_state_dict`` would find no room for the values), so outside
that block they refuse, in one line naming the ways above; inside it they work on whole values
(a deep copy without the wrapper's hooks: a plain, usable module). The wrapper's own
``load_state_dict`` loads whole values into the shards (a collective).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from shardbench.strategies.sharded.free_parameter import SHARDED, make_plain

#: where ``nn.Module`` keeps hooks, by handle id (a deep copy strips ours from them), and the
#: per-hook flags kept under the same ids
_HOOKS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_state_dict_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


class StageThreeReads:
    """Guards the wrapped module's ``state_dict`` and ``copy.deepcopy`` and counts the blocks in
    which its parameters are whole (see the module docstring)."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = weakref.ref(wrapper)
        module: nn.Module = wrapper.module
        self._module = weakref.ref(module)
        #: blocks now open in which values are whole (summon_full_params, full_state_dict)
        self.whole = 0
        # plain functions (the post-hook registration marks its hook with an attribute, which
        # a bound method cannot take), reaching this object weakly
        ref = weakref.ref(self)

        def before(module: nn.Module, prefix: str, keep_vars: bool) -> None:
            reads = ref()
            if reads is not None and not reads.whole:
                raise RuntimeError(f"state_dict(): {SHARDED}")

        def after(module: nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
            _own_storage(module, state, prefix)

        def before_load(module: nn.Module, *args: Any) -> None:
            reads = ref()
            if reads is not None and not reads.whole:
                raise RuntimeError(
                    f"load_state_dict(): {SHARDED}; load into the wrapper (wrapper.load_state_dict, "
                    "keys under 'module.') or inside that block"
                )

        self._hook_fns = (before, after, before_load)
        self._handles = [
            module.register_state_dict_pre_hook(before),
            module.register_state_dict_post_hook(after),
            module.register_load_state_dict_pre_hook(before_load),
        ]
        self._copier = self._deepcopy
        module.__dict__["__deepcopy__"] = self._copier  # copy.deepcopy looks on the instance

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        module = self._module()
        if module is not None and module.__dict__.get("__deepcopy__") is self._copier:
            del module.__dict__["__deepcopy__"]

    @contextlib.contextmanager
    def values_whole(self) -> Iterator[None]:
        """A block where state_dict and deepcopy of the module read whole values."""
        self.whole += 1
        try:
            yield
        finally:
            self.whole -= 1

    def _deepcopy(self, memo: dict[int, Any]) -> nn.Module:
        module = self._module()
        wrapper = self._wrapper()
        if module is None or wrapper is None or not self.whole:
            raise RuntimeError(f"copy.deepcopy: {SHARDED}")
        ours = {id(fn) for fn in (*wrapper.module_hooks(), *self._hook_fns)}
        del module.__dict__["__deepcopy__"]
        try:
            clone = copy.deepcopy(module, memo)
        finally:
            module.__dict__["__deepcopy__"] = self._copier
        for p in clone.parameters():
            make_plain(p)
        for m in clone.modules():
            keys = {k for attr in _HOOKS for k, fn in getattr(m, attr).items() if id(fn) in ours}
            for attr in (*_HOOKS, *_HOOK_FLAGS):
                for k in keys & getattr(m, attr).keys():
                    del getattr(m, attr)[k]
        return clone


def _own_storage(module: nn.Module, state: dict[str, Any], prefix: str) -> None:
    """Parameters in ``state`` copied into storage of their own: inside a block where they are
    whole they view gathered buffers, which are freed when the block ends."""
    for name, _ in module.named_parameters(remove_duplicate=False):
        value = state.get(prefix + name)
        if torch.is_tensor(value) and value.numel():
            state[prefix + name] = value.detach().clone()
