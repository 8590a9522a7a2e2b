"""DDP's memory without DDP, for ``--fake`` planning.

``DistributedDataParallel``'s constructor reads parameter values (it verifies shapes across ranks
and broadcasts the initial state), which fake tensors do not have, so under FakeTensorMode it
cannot be built (measured: ``_verify_param_shape_across_processes`` fails with "data is not
allocated"). What DDP adds to a model's memory is its gradient buckets, so this wrapper keeps the
model unwrapped and allocates those buckets explicitly, reproducing the reducer's behaviour:

* buckets hold the gradients in reverse parameter order, capped at ``bucket_cap_mb`` (the first
  bucket at 1 MiB), one dtype per bucket;
* with ``gradient_as_bucket_view`` each parameter's gradient becomes a view of its bucket (after
  ``zero_grad(set_to_none=True)`` autograd makes a fresh gradient, which the reducer copies into
  the bucket and replaces by the view, as here): one gradient-sized buffer in all;
* without it the gradients stay separate and the buckets are a second gradient-sized buffer.

Communication: like the reducer, each bucket is all-reduced once all of its gradients are in
(on the fake process group, which moves no data: the collective is issued, so it is counted,
``bench/metrics/comm.py``). Records say the model was planned this way
(``strategy_settings["planned"]``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardbench.strategies.sharded.layout import FIRST_BUCKET_BYTES  # DDP's, which ours shares

PLANNED_NOTE = (
    "ddp planned: unwrapped model + explicit gradient buckets (DDP cannot be built on fake tensors)"
)


class PlannedDDP(nn.Module):
    """The model plus DDP's gradient buckets; see the module docstring."""

    #: recorded in the cell's strategy settings (the worker reads it off the wrapped model)
    planned_note = PLANNED_NOTE

    def __init__(self, module: nn.Module, *, bucket_cap_mb: float, gradient_as_bucket_view: bool) -> None:
        super().__init__()
        self.module = module
        self.gradient_as_bucket_view = gradient_as_bucket_view
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets: list[torch.Tensor] = []
        self._view: dict[nn.Parameter, torch.Tensor] = {}
        self._bucket_of: dict[nn.Parameter, int] = {}
        self._sizes: list[int] = []  # parameters per bucket
        self._pending: list[int] = []  # of this backward, per bucket
        cap = FIRST_BUCKET_BYTES
        group: list[nn.Parameter] = []
        for p in reversed(params):
            if group and (group[0].dtype != p.dtype or _nbytes(group) + _nbytes([p]) > cap):
                self._allocate(group)
                group, cap = [], int(bucket_cap_mb * 1024 * 1024)
            group.append(p)
        if group:
            self._allocate(group)
        for p in params:
            p.register_post_accumulate_grad_hook(self._into_bucket)

    def _allocate(self, group: list[nn.Parameter]) -> None:
        first = group[0]
        buf = torch.zeros(sum(p.numel() for p in group), dtype=first.dtype, device=first.device)
        for p in group:
            self._bucket_of[p] = len(self.buckets)
        self.buckets.append(buf)
        self._sizes.append(len(group))
        self._pending.append(len(group))
        offset = 0
        for p in group:
            self._view[p] = buf[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            if self.gradient_as_bucket_view:
                p.grad = self._view[p]

    def _into_bucket(self, p: torch.Tensor) -> None:
        view = self._view[p]  # type: ignore[index]
        if p.grad is not None and p.grad is not view:
            view.copy_(p.grad)
            if self.gradient_as_bucket_view:
                p.grad = view
        b = self._bucket_of[p]  # type: ignore[index]
        self._pending[b] -= 1
        if self._pending[b] == 0 and dist.is_initialized():
            dist.all_reduce(self.buckets[b])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._pending = list(self._sizes)  # a new step: every bucket waits for its gradients
        return self.module(*args, **kwargs)


def _nbytes(params: list[nn.Parameter]) -> int:
    return sum(p.numel() * p.element_size() for p in params)
