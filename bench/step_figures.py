"""The figures a record keeps of one training step for the step-time model, typed: the step's
FLOPs (``FlopsPerStep``, counted by ``prediction.flops``), a CPU step's op replay
(``ComputeReplay``, ``prediction.op_replay``), its forward and backward timed on the model itself
(``BareCompute``, ``prediction.bare_compute``) and the model's prediction (``PredictedStep``,
``prediction.record_step_time``).

They sit on the ground floor because the record (``records.py``) holds them. Each writes the JSON
object records have always held under its field (``dataclasses.asdict``), and reads one back
with ``from_json``: a record of any schema, whatever keys it was written with (a key it lacks
reads as None; one these classes do not know is not kept).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def from_json(cls: type[T], data: T | dict[str, Any] | None) -> T | None:
    """``data`` (a JSON object, or already ``cls``) as ``cls``; None stays None."""
    if data is None or isinstance(data, cls):
        return data
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class FlopsPerStep:
    """One rank's training step of its own batch, forward and backward, as torch's
    FLOP formulas count it: ``model`` (the math once, MFU's) and ``hardware`` (activation
    checkpointing's recompute included, HFU's), per sample and per token (a sequence workload),
    the matmul ``dtype``, the count ``by_op``, what it was ``counted_on`` and how long it took."""

    model: float
    hardware: float
    per_sample: dict[str, float] | None = None
    per_token: dict[str, float] | None = None
    batch: int | None = None
    tokens_per_sample: int | None = None
    dtype: str | None = None
    by_op: dict[str, int] = field(default_factory=dict)
    counted_on: str | None = None
    count_s: float | None = None


@dataclass(frozen=True)
class ComputeReplay:
    """A CPU step's forward and backward replayed op by op at a rank's threads: its compute
    ``seconds`` (the slowest copy's) and each copy's, the step's ``calls``, its ``distinct``
    ones, those it could not make (``unreplayed_calls``), how long the replay took, and the
    cache ``key`` it was measured under and when."""

    seconds: float
    calls: int
    seconds_per_copy: list[float] | None = None
    copies: int | None = None
    distinct: int | None = None
    unreplayed_calls: int = 0
    replay_s: float | None = None
    threads: int | None = None
    key: str | None = None
    measured_at: str | None = None


@dataclass(frozen=True)
class BareCompute:
    """A real cell's forward and backward timed on the model itself, before any strategy wrapped
    it, on every rank at once (``prediction.bare_compute``): the median over the passes of
    each pass's slowest rank, ``seconds``, its ``mad_seconds``, the timed ``repeats`` and the
    rank's ``threads``; and ``collectives``, those the model's own loss issued in a pass
    (``{kind: {calls, bytes}}``, SwAV's Sinkhorn sums): in ``seconds`` already, so the step-time
    model does not cost them again among the step's. ``pooled_seconds`` is what the model takes
    where kept."""

    seconds: float
    mad_seconds: float | None = None
    repeats: int | None = None
    threads: int | None = None
    collectives: dict[str, dict[str, int]] | None = None
    #: each timed pass, its slowest rank's: what the pool below keeps
    pass_seconds: list[float] | None = None
    #: the median over the passes of this machine's newest cells of the same model at the same
    #: placement, this one included, and how many cells and passes (``prediction/bare_pool.py``):
    #: the step-time model's compute, which one cell's few passes would leave to a stall or a drift
    pooled_seconds: float | None = None
    pooled_cells: int | None = None
    pooled_passes: int | None = None


@dataclass(frozen=True)
class PredictedStep:
    """The step-time model's prediction for a cell: ``step`` and its terms ``compute``,
    ``update``, ``comm`` (every collective's time), ``exposed_comm``, ``call_overhead`` (the
    calls' in-step cost beyond their aligned time) and ``buffer_memory`` in seconds; the tokens/s
    and MFU they give; the network profile; how compute was reached (``compute_source``, in words,
    and ``compute_basis``: ``measured``, the cell's own forward and backward timed; ``replayed``,
    its operators replayed; ``flops``, FLOPs at a rate of the peak and an efficiency); the core
    share and the update rate it assumed."""

    step: float
    compute: float | None = None
    update: float | None = None
    comm: float | None = None
    exposed_comm: float | None = None
    call_overhead: float | None = None
    buffer_memory: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_flops_per_s: float | None = None
    shares_compute: bool | None = None
    network: str | None = None
    network_source: str | None = None
    compute_source: str | None = None
    compute_basis: str | None = None
    rate_flops_per_s: float | None = None
    peak_kind: str | None = None
    efficiency: float | None = None
    core_share: float | None = None
    seconds_per_update_element: float | None = None
    #: the range the measured step should fall in, where the model states one
    interval: list[float] | None = None
