"""The regression gate's thresholds: defaults, and a TOML rules file that overrides them.

A rules file (``compare --rules FILE``; a nightly suite's ``bench/suites/rules/<suite>.toml``)::

    [memory]
    tolerance_pct = 0.5       # a memory metric regressed when it grew by more than
    tolerance_mib = 1.0       # max(tolerance_pct % of the baseline, tolerance_mib MiB); without
                              # it the floor is the cell's default (``_memory_floor``)

    [time]
    cpu_pct = 15              # step time (its ratio to ddp's in the run; on a dedicated runner
    cuda_pct = 5              # also the time itself) regressed when slower by more than this %
    k_mad = 3                 # of the baseline (per device) AND by more than k_mad x the noise
    cpu_strategy_pct = 5      # a strategy over all its cells (compare_strategy): slower by more
    cuda_strategy_pct = 5     # than this % AND by more than k_mad x the combined standard error
    min_steps = 5             # fewer timed steps: memory only
    dedicated = false         # true: nothing else runs on this machine, so absolute step time
    min_repeats = 3           # is gated too, where each side has this many timed repeats

    [[override]]              # thresholds for the cells it matches (every given key must match)
    workload = "deepspeech2"
    time_pct = 30
    reason = "LSTM step time on 2 shared cores swings night to night"

    [[ignore]]                # a matching cell's regression does not fail the gate
    strategy = "fsdp2-zero3"
    metrics = ["step_time_s"] # optional: only these metrics (default: the whole cell)
    reason = "shares a busy host: its step time is noise"

Every override and ignore needs a ``reason``: the report prints it beside the rows it changed,
so a relaxed threshold is never silent. Unknown keys are errors that name what is allowed.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.records import CellKey
from shardbench.wording import count

if TYPE_CHECKING:
    from shardbench.records import Record

MIB = 1 << 20
#: what makes two records the same cell: ``compare`` matches cells on these fields, and an
#: override or ignore matches on any of them (the device's name is an environment fact instead)
CELL_FIELDS = CellKey._fields
MATCH_KEYS = CELL_FIELDS
#: step time over ddp's in the same run and cell group (``compare_ratios``)
RATIO_METRIC = "step_time_vs_ddp"
METRICS = (
    "peak_mem_bytes",
    "model_state_bytes",
    "held_after_step_bytes",
    "comm_sent_bytes",
    "step_time_s",
    RATIO_METRIC,
)
#: override keys -> Thresholds field
OVERRIDE_KEYS = {
    "memory_pct": "memory_pct",
    "memory_mib": "memory_bytes",
    "time_pct": "time_pct",
    "k_mad": "k_mad",
    "min_steps": "min_steps",
    "strategy_pct": "strategy_pct",
}


#: how much slower a step may be before it regresses (also beyond the noise), per device: a CUDA
#: step is steadier than a CPU one
TIME_PCT = {"cpu": 15.0, "cuda": 5.0}
#: the same, for a strategy's ratio over all its cells at once (``compare_strategy``): its noise
#: band, k x a standard error that shrinks with the cells' count, is what guards it; this floor
#: only keeps a real but immaterial change (a few percent, on a quiet night) from failing it.
#: Below a cell's threshold on the CPU, so that a 15 % slowdown of one strategy can be seen
#: there; on CUDA a cell's own, until the GPU nights' power is measured.
STRATEGY_PCT = {"cpu": 5.0, "cuda": 5.0}
#: the least a memory metric may grow by before it regresses: on the CPU, for a strategy whose
#: tracked memory is the same to the byte run after run (``StrategyCard.exact_memory``), a
#: small floor, so a few-percent regression of a tiny cell is seen; 1 MiB otherwise (CUDA's
#: allocator rounds to blocks; some peers free buffers asynchronously). A cell whose memory
#: varied between the baseline's repeats is allowed that spread too (``compare._memory_delta``).
EXACT_MEMORY_FLOOR = {"cpu": 64 * 1024.0}
MEMORY_FLOOR = float(MIB)


@dataclass(frozen=True)
class Thresholds:
    memory_pct: float = 0.5
    memory_bytes: float = float(MIB)
    time_pct: float = TIME_PCT["cpu"]
    #: the strategy-wide test's relative threshold (``STRATEGY_PCT``)
    strategy_pct: float = STRATEGY_PCT["cpu"]
    k_mad: float = 3.0
    min_steps: int = 5
    #: absolute step time is gated (else only its ratio to ddp's), with this many repeats a side
    dedicated: bool = False
    min_repeats: int = 3


def step_time_noise(ours: Record, base: Record, *, base_label: str) -> str | None:
    """Whether ``ours``' step time differs from ``base``'s by more than the noise, by the rule
    ``compare`` uses: at least ``min_steps`` timed steps each, and a difference beyond ``k_mad``
    x the combined MAD. None when either has no step time."""
    a, b = ours.step_time_s or {}, base.step_time_s or {}
    if ours.status != "ok" or base.status != "ok" or not a.get("median") or not b.get("median"):
        return None
    t = Thresholds()
    steps = min(ours.steps, base.steps)
    if steps < t.min_steps:
        return f"{count(steps, 'timed step')}: too few to tell from noise"
    noise = step_noise(ours, base)
    if abs(a["median"] - b["median"]) <= noise:
        return "within noise"
    return f"beyond noise: {t.k_mad:g} x combined MAD = {noise / b['median']:.0%} of {base_label}'s"


def step_noise(ours: Record, base: Record) -> float:
    """How far apart two timed cells' median step times may be by their steps' noise alone:
    ``k_mad`` x their combined MAD, in seconds."""
    a, b = ours.step_time_s or {}, base.step_time_s or {}
    return Thresholds().k_mad * math.hypot(a.get("mad") or 0.0, b.get("mad") or 0.0)


@dataclass(frozen=True)
class Rule:
    match: dict[str, Any]
    reason: str
    settings: dict[str, float] = field(default_factory=dict)  # override: Thresholds fields
    metrics: tuple[str, ...] = ()  # ignore: () = the whole cell

    def matches(self, cell: dict[str, Any]) -> bool:
        return all(cell.get(k) == v for k, v in self.match.items())


@dataclass(frozen=True)
class Rules:
    """The thresholds of a comparison: ``Thresholds``' defaults, the step-time tolerance per
    device, and the file's overrides and ignores."""

    memory_pct: float = Thresholds.memory_pct
    #: the floor for every cell (a rules file's ``tolerance_mib``); None: ``_memory_floor``'s
    memory_bytes: float | None = None
    time_pct: dict[str, float] = field(default_factory=lambda: dict(TIME_PCT))
    strategy_pct: dict[str, float] = field(default_factory=lambda: dict(STRATEGY_PCT))
    k_mad: float = Thresholds.k_mad
    min_steps: int = Thresholds.min_steps
    #: the runner runs nothing else: absolute step time compares across runs, and is gated
    dedicated: bool = Thresholds.dedicated
    min_repeats: int = Thresholds.min_repeats
    overrides: tuple[Rule, ...] = ()
    ignores: tuple[Rule, ...] = ()
    source: str = "defaults"

    def thresholds_for(self, cell: dict[str, Any]) -> Thresholds:
        t = Thresholds(
            memory_pct=self.memory_pct,
            memory_bytes=_memory_floor(cell) if self.memory_bytes is None else self.memory_bytes,
            time_pct=self.time_pct.get(cell.get("device", "cpu"), self.time_pct["cpu"]),
            strategy_pct=self.strategy_pct.get(cell.get("device", "cpu"), self.strategy_pct["cpu"]),
            k_mad=self.k_mad,
            min_steps=self.min_steps,
            dedicated=self.dedicated,
            min_repeats=self.min_repeats,
        )
        for rule in self.overrides:
            if rule.matches(cell):
                t = replace(t, **rule.settings)
        return t

    def unmatched(self, cells: list[dict[str, Any]]) -> list[str]:
        """The rules (``[[override]]``, ``[[ignore]]``) whose match selects none of ``cells``."""
        out = []
        for kind, rules in (("override", self.overrides), ("ignore", self.ignores)):
            for rule in rules:
                if not any(rule.matches(cell) for cell in cells):
                    out.append(f"[[{kind}]] match {rule.match} ({rule.reason!r})")
        return out

    def override_reasons(self, cell: dict[str, Any]) -> list[str]:
        return [r.reason for r in self.overrides if r.matches(cell)]

    def ignored_reason(self, cell: dict[str, Any], regressed: set[str] | None) -> str:
        """Why the cell's regression is ignored, or "" when it counts. ``regressed``: the metrics
        that regressed, None when the cell did not (a rule naming metrics ignores a regression
        only when every metric that regressed is one it names)."""
        for rule in self.ignores:
            if not rule.matches(cell):
                continue
            if not rule.metrics:
                return rule.reason
            if regressed and regressed <= set(rule.metrics):
                return rule.reason
        return ""


def _memory_floor(cell: dict[str, Any]) -> float:
    """The default memory floor of ``cell`` (``EXACT_MEMORY_FLOOR``, ``MEMORY_FLOOR``)."""
    from shardbench.strategies.registry import strategy_card

    try:
        exact = strategy_card(str(cell.get("strategy"))).exact_memory
    except ValueError:
        exact = False  # a strategy this install does not know (an old record): the wider floor
    return EXACT_MEMORY_FLOOR.get(str(cell.get("device")), MEMORY_FLOOR) if exact else MEMORY_FLOOR


def load_rules(path: Path) -> Rules:
    """Read and validate a rules file; ``ValueError`` names the file, the key and what is allowed."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--rules {path}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--rules {path}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"--rules {path}: not UTF-8 text (byte {e.start}); a rules file is TOML") from None
    where = f"--rules {path}"
    defaults = Rules()
    _only(data, ("memory", "time", "override", "ignore"), where)
    memory, time = data.get("memory", {}), data.get("time", {})
    _only(memory, ("tolerance_pct", "tolerance_mib"), f"{where} [memory]")
    _only(
        time,
        ("cpu_pct", "cuda_pct", "cpu_strategy_pct", "cuda_strategy_pct", "k_mad", "min_steps", "dedicated")
        + ("min_repeats",),
        f"{where} [time]",
    )
    dedicated = time.get("dedicated", defaults.dedicated)
    if not isinstance(dedicated, bool):
        raise ValueError(f"{where} [time]: dedicated must be true or false, got {dedicated!r}")
    return Rules(
        memory_pct=_number(memory, "tolerance_pct", defaults.memory_pct, f"{where} [memory]"),
        memory_bytes=(
            MIB * _number(memory, "tolerance_mib", 0.0, f"{where} [memory]")
            if "tolerance_mib" in memory
            else None
        ),
        time_pct={
            d: _number(time, f"{d}_pct", defaults.time_pct[d], f"{where} [time]") for d in ("cpu", "cuda")
        },
        strategy_pct={
            d: _number(time, f"{d}_strategy_pct", defaults.strategy_pct[d], f"{where} [time]")
            for d in ("cpu", "cuda")
        },
        k_mad=_number(time, "k_mad", defaults.k_mad, f"{where} [time]"),
        min_steps=int(_number(time, "min_steps", defaults.min_steps, f"{where} [time]", integer=True)),
        dedicated=dedicated,
        min_repeats=int(_number(time, "min_repeats", defaults.min_repeats, f"{where} [time]", integer=True)),
        overrides=tuple(
            _rule(t, f"{where} [[override]] #{i + 1}", True)
            for i, t in enumerate(_tables(data, "override", where))
        ),
        ignores=tuple(
            _rule(t, f"{where} [[ignore]] #{i + 1}", False)
            for i, t in enumerate(_tables(data, "ignore", where))
        ),
        source=str(path),
    )


def _tables(data: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    tables = data.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ValueError(f"{where}: {key} must be an array of tables ([[{key}]])")
    return tables


def _rule(table: dict[str, Any], where: str, override: bool) -> Rule:
    settings_keys = tuple(OVERRIDE_KEYS) if override else ("metrics",)
    _only(table, (*MATCH_KEYS, "reason", *settings_keys), where)
    reason = table.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f'{where}: needs a reason = "..." (the report shows it)')
    match = {k: table[k] for k in MATCH_KEYS if k in table}
    if override:
        settings = {
            OVERRIDE_KEYS[k]: _number(table, k, 0, where, integer=k == "min_steps")
            * (MIB if k == "memory_mib" else 1)
            for k in OVERRIDE_KEYS
            if k in table
        }
        if not settings:
            raise ValueError(f"{where}: sets no threshold; allowed: {', '.join(OVERRIDE_KEYS)}")
        return Rule(match=match, reason=reason, settings=settings)
    metrics = table.get("metrics", [])
    if not isinstance(metrics, list) or any(m not in METRICS for m in metrics):
        raise ValueError(f"{where}: metrics must be a list of {', '.join(METRICS)}; got {metrics!r}")
    return Rule(match=match, reason=reason, metrics=tuple(metrics))


def _only(table: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table")
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _number(table: dict[str, Any], key: str, default: float, where: str, *, integer: bool = False) -> float:
    value = table.get(key, default)
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise ValueError(f"{where}: {key} must be {kind}, got {value!r}")
    return value
