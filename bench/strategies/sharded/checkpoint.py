"""Converting between a ShardedOptimizer's per-piece state and the plain optimizer's format.

The consolidated checkpoint is exactly what the wrapped ``torch.optim`` class would save for the
full parameters (state keyed by the parameter's index over all groups, per-element tensors in
the parameter's shape, scalars such as Adam's ``step`` as they are), so it loads into the plain
optimizer, and into a ShardedOptimizer of any world size, which keeps only the slices it owns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from shardbench.strategies.sharded.layout import whole_shape

#: (parameter index, lo, hi, state of that piece or None)
OwnedState = tuple[int, int, int, dict[str, Any] | None]


def hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def state_pieces(owned: Iterable[OwnedState]) -> dict[int, list[tuple[int, int, dict[str, Any]]]]:
    """This rank's contribution: per parameter index, its pieces' state moved to the CPU."""
    payload: dict[int, list[tuple[int, int, dict[str, Any]]]] = {}
    for idx, lo, hi, st in owned:
        if st:
            cpu = {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in st.items()}
            payload.setdefault(idx, []).append((lo, hi, cpu))
    return payload


def assemble_full_state(param_groups: list[dict[str, Any]], payloads: list[Any] | None) -> dict[str, Any]:
    """Join every rank's pieces into full per-parameter state (plain optimizer format).

    A 1-D state tensor of a piece holds that piece's elements; a 0-d one (``step``) is the same
    on every piece and is taken once."""
    params = [p for g in param_groups for p in g["params"]]
    state: dict[int, dict[str, Any]] = {}
    for payload in payloads or []:
        for idx, pieces in payload.items():
            full = state.setdefault(idx, {})
            for lo, hi, st in pieces:
                for k, v in st.items():
                    if torch.is_tensor(v) and v.dim() > 0:
                        if k not in full:
                            full[k] = torch.zeros(whole_shape(params[idx]).numel(), dtype=v.dtype)
                        full[k][lo:hi] = v
                    else:
                        full.setdefault(k, v)
    for idx, full in state.items():
        for k, v in full.items():
            if torch.is_tensor(v) and v.dim() > 0:
                full[k] = v.view(whole_shape(params[idx]))
    groups, start = [], 0
    for g in param_groups:
        groups.append({**hyperparameters(g), "params": list(range(start, start + len(g["params"])))})
        start += len(g["params"])
    return {"state": state, "param_groups": groups}


def slice_state(full: dict[str, Any], lo: int, hi: int, device: torch.device) -> dict[str, Any]:
    """The state of one piece ``[lo, hi)`` cut from a parameter's full state (copied)."""
    out: dict[str, Any] = {}
    for k, v in full.items():
        if torch.is_tensor(v) and v.dim() > 0:
            out[k] = v.reshape(-1)[lo:hi].to(device, copy=True)
        elif torch.is_tensor(v):
            out[k] = v.clone()
        else:
            out[k] = v
    return out
