"""The analytical ZeRO memory model: predicted model-state bytes per rank.

From the ZeRO paper (Rajbhandari et al., 2020, section 5): with Psi parameters, model states are
parameters + gradients + optimizer state. fp32 AdamW keeps 4 (param) + 4 (grad) + 8 (exp_avg,
exp_avg_sq) bytes per parameter; bf16 mixed precision keeps 2 + 2 + K with K = 12 (fp32 master
weights, exp_avg, exp_avg_sq). Each sharded term is divided by the world size N:

=========  ================  ==================
strategy   fp32 (AdamW)      bf16 mixed (K=12)
=========  ================  ==================
ddp        16 Psi            16 Psi
zero1      4+4+8/N Psi       2+2+12/N Psi
zero2      4+12/N Psi        2+14/N Psi
zero3      16/N Psi          16/N Psi
=========  ================  ==================

The prediction is driven by a strategy's capability flags, not its name, so a new strategy gets
the right formula by declaring what it shards. It counts model states only: activations, buffers,
inputs and communication buckets are what the measured breakdown adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass

# bytes per parameter: (parameter, gradient, optimizer state incl. master weights)
_BYTES = {"fp32": (4, 4, 8), "bf16": (2, 2, 12)}


@dataclass(frozen=True)
class Sharding:
    optimizer_state: bool = False
    gradients: bool = False
    parameters: bool = False


def predicted_model_state_bytes(
    num_params: int, world_size: int, precision: str, sharding: Sharding
) -> dict[str, int]:
    """Per-rank bytes of params, grads and optimizer state (and their total) for AdamW."""
    if precision not in _BYTES:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(_BYTES)}")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    p, g, o = _BYTES[precision]

    def share(nbytes_per_param: int, sharded: bool) -> int:
        total = nbytes_per_param * num_params
        return -(-total // world_size) if sharded else total  # ceil: the largest rank's share

    out = {
        "params": share(p, sharding.parameters),
        "grads": share(g, sharding.gradients),
        "optimizer": share(o, sharding.optimizer_state),
    }
    out["total"] = sum(out.values())
    return out
