"""The memory a plan keeps free beside a strategy's peak: the reserve.

A plan's peak is what tensors hold (``max_memory_allocated`` on CUDA, the tracker's count on the
CPU). A CUDA process needs more than that: the CUDA context (driver, loaded kernels, library
handles: memory outside the caching allocator) and what the allocator keeps beyond what it
hands out (cached blocks, fragmentation: ``max_memory_reserved / max_memory_allocated`` above
1). A plan that fits its peak to the byte runs out of memory on the card, so every fit is
judged against ``budget - reserve``, with

    reserve = context + (ratio - 1) x peak

``ratio`` the worst reserved/allocated ratio measured for the strategy on a GPU (the worst of
all strategies for one never measured there), ``context`` as measured. The CUDA figures are
data, not constants: ``bench/suites/measured/cuda-reserve.toml``, derived from the committed GPU
records by ``scripts/derive_cuda_reserve.py`` (``derive`` below; a test checks the file against
the records). The CPU has no allocator cache and no context: its reserve is 0. ``--reserve
SIZE`` replaces either with a fixed size.

``plan``, ``max-size`` and ``claim`` judge every fit by the same rule, ``Reserve.fits``, with the
same policy (``policy``): a model one of them says fits, the others say fits too.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench.harness.config import SUITES_DIR
from shardbench.records import Record
from shardbench.units import size_text

CUDA_RESERVE_FILE = SUITES_DIR / "measured" / "cuda-reserve.toml"


@dataclass(frozen=True)
class Reserve:
    """What one strategy's plan keeps free: ``fixed`` bytes plus ``ratio - 1`` of its peak."""

    fixed: int = 0
    ratio: float = 1.0
    #: what the figures are and where they come from, for the lines that name the reserve
    basis: str = field(default="", compare=False)

    @property
    def counted(self) -> bool:
        """Whether anything is kept beside the peak (not on the CPU, nor with ``--reserve 0``)."""
        return self.fixed > 0 or self.ratio > 1.0

    def of(self, peak: int) -> int:
        """The reserve beside a peak of ``peak`` bytes."""
        return self.fixed + math.ceil((self.ratio - 1.0) * peak)

    def fits(self, peak: int, budget: int) -> bool:
        """Whether a peak and its reserve are within ``budget``: the one rule by which ``plan``,
        ``max-size`` and ``claim`` decide that something fits."""
        return peak + self.of(peak) <= budget

    def usable(self, budget: int) -> int:
        """The largest peak that fits ``budget`` with its reserve (where a search aims)."""
        return max(0, math.floor((budget - self.fixed) / self.ratio))

    def as_dict(self) -> dict[str, Any]:
        """The reserve as a record keeps it: enough to judge a fit again by ``fits``."""
        return {"fixed_bytes": self.fixed, "ratio": self.ratio, "basis": self.basis, "counted": self.counted}


#: nothing kept beside the peak (a search given no reserve)
NO_RESERVE = Reserve()


@dataclass(frozen=True)
class ReservePolicy:
    """The reserve of every strategy in one plan."""

    device: str
    fixed: int | None = None  # --reserve
    ratios: Mapping[str, float] = field(default_factory=dict)
    worst: float = 1.0
    context: int | None = None
    source: str = ""

    def of(self, strategy: str) -> Reserve:
        """``--reserve`` when given; none on the CPU; else the context and the strategy's worst
        measured ratio (the worst of all where it was never measured)."""
        if self.fixed is not None:
            return Reserve(fixed=self.fixed, basis=f"--reserve {size_text(self.fixed)}")
        if self.device != "cuda":
            return Reserve(basis="none: on the CPU nothing is held beside the tensors")
        ratio = self.ratios.get(strategy)
        cache = (
            f"{strategy}'s worst reserved/allocated ratio, {ratio:.4f} {self.source}"
            if ratio is not None
            else f"the worst reserved/allocated ratio of any strategy, {self.worst:.4f} {self.source}, "
            f"{strategy} having none of its own"
        )
        context = (
            "not the CUDA context, not measured yet"
            if self.context is None
            else f"plus the CUDA context, {size_text(self.context)}"
        )
        return Reserve(
            fixed=self.context or 0,
            ratio=self.worst if ratio is None else ratio,
            basis=f"the CUDA allocator's cache at {cache}; {context}",
        )


def policy(device: str, *, fixed: int | None = None, data_file: Path = CUDA_RESERVE_FILE) -> ReservePolicy:
    """The plan's reserves: ``fixed`` (``--reserve``) when given, 0 on the CPU, else the data."""
    if fixed is not None or device != "cuda":
        return ReservePolicy(device=device, fixed=fixed)
    data = tomllib.loads(data_file.read_text())
    ratios = {name: float(entry["ratio"]) for name, entry in data["ratio"].items()}
    source = f"measured on {data['device']}"
    return ReservePolicy(
        device=device,
        ratios=ratios,
        worst=float(data["worst_ratio"]),
        context=data.get("context", {}).get("bytes"),
        source=source,
    )


def allocator_ratio(r: Record) -> float | None:
    """``max_reserved / max_allocated`` of an ok cell measured by the CUDA allocator."""
    a = r.cuda_allocator or {}
    if r.status != "ok" or r.fake or not a.get("max_allocated") or not a.get("max_reserved"):
        return None
    return a["max_reserved"] / a["max_allocated"]


def derive(records: Iterable[Record], contexts: Iterable[int] = ()) -> dict[str, Any]:
    """The reserve data from GPU records: per strategy the worst ratio and the cell it came from,
    the worst of all, and the largest context measured (absent when none was)."""
    worst: dict[str, tuple[float, Record, int]] = {}
    for r in records:
        if (ratio := allocator_ratio(r)) is None:
            continue
        seen = worst.get(r.strategy)
        count = seen[2] + 1 if seen else 1
        worst[r.strategy] = (ratio, r, count) if seen is None or ratio > seen[0] else (*seen[:2], count)
    if not worst:
        raise ValueError("no ok CUDA record with allocator figures: nothing to derive a reserve from")
    cells = [v[1] for v in worst.values()]
    data: dict[str, Any] = {
        "device": ", ".join(sorted({str(r.env.get("device_name")) for r in cells})),
        "torch": ", ".join(sorted({str(r.env.get("torch")) for r in cells})),
        "worst_ratio": _up(max(v[0] for v in worst.values())),
        "ratio": {
            s: {
                "ratio": _up(ratio),
                "records": count,
                "worst_cell": f"{r.workload} {r.preset} N={r.world_size}"
                + (" simulated" if r.simulated else "")
                + f" {r.precision} b={r.batch_size_per_rank}",
            }
            for s, (ratio, r, count) in sorted(worst.items())
        },
    }
    if contexts := list(contexts):
        data["context"] = {"bytes": max(contexts), "measurements": len(contexts)}
    return data


def _up(ratio: float) -> float:
    """Rounded up to 4 decimals: a rounded figure never reserves less than was measured."""
    return math.ceil(ratio * 1e4) / 1e4
