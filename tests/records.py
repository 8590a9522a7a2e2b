"""A record for tests that build records by hand (compare, export, report, units): every field a
``Record`` requires, for an ok CPU cell of the tiny transformer; ``overrides`` replace any."""

from __future__ import annotations

from typing import Any

from shardbench.records import Record

DEFAULTS: dict[str, Any] = dict(
    run_id="r",
    suite="s",
    workload="transformer",
    preset="tiny",
    params=1000,
    strategy="ddp",
    world_size=2,
    requested_world_size=2,
    simulated=False,
    backend="gloo",
    device="cpu",
    precision="fp32",
    batch_size_per_rank=8,
    steps=5,
    warmup=2,
    status="ok",
)


def make_record(**overrides: Any) -> Record:
    return Record(**{**DEFAULTS, **overrides})
