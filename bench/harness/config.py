"""Run configuration: frozen dataclasses and suite loading.

A *cell* is one measured combination (workload x preset x strategy x world size x precision x
batch x shard width). A *suite* is a TOML file in ``bench/suites/`` whose lists expand, by cross
product, into cells. Command-line flags override a suite's lists. Everything is validated here, before any
process starts or any file is written, so bad input fails fast with a message naming what is
allowed.
"""

from __future__ import annotations

import itertools
import os
import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from shardbench.records import CellKey, flat_as_none
from shardbench.strategies.catalog import WorldPlan
from shardbench.strategies.registry import reference_strategy

SUITES_DIR = Path(__file__).resolve().parents[1] / "suites"
DEVICES = ("cpu", "cuda")


#: seconds a cell (every rank, and the check of a workload of one's own) may take
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class CellConfig:
    """One measured cell; serialised to JSON to hand to each rank's worker."""

    workload: str
    preset: str
    strategy: str
    world_size: int
    precision: str = "fp32"
    batch_size: int = 8  # per rank
    steps: int = 5  # measured (timed) steps
    warmup: int = 2
    device: str = "cpu"
    seed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    suite: str = "adhoc"
    #: run as rank 0 of a fake world of ``world_size`` (memory real, no communication).
    simulate: bool = False
    #: plan under FakeTensorMode on top of the simulated world: every allocation is tracked,
    #: nothing is allocated, no step time (implies ``simulate``).
    fake: bool = False
    #: run the memory-tracking phase (False: a timing-only cell, e.g. the claim's real-rank step
    #: time, whose memory is measured by another cell; its record then has no CPU memory)
    track_memory: bool = True
    #: CUDA only: cap this process's allocator at this many bytes (max-size probes emulating a
    #: smaller card with torch.cuda.set_per_process_memory_fraction); None: no cap.
    memory_budget_bytes: int | None = None
    #: dropout off: identical updates across world sizes (parity tests, not benchmarks).
    dropout: bool = True
    #: recompute each of the workload's checkpoint units in backward instead of keeping its
    #: activations (models/checkpointing.py): less activation memory for more compute
    activation_checkpointing: bool = False
    #: hybrid sharding: shard within groups of this many ranks and replicate across the N/S
    #: groups (a strategy whose card takes ``shard_group``); None: over all N, as S = N is
    #: (``plan_cells`` fixes it to N for such a strategy, so its record states it)
    shard_group: int | None = None
    #: ranks a node holds (G), where the cluster's shape is known (``--ranks-per-node``, or a
    #: torchrun or Slurm job's): communication is then accounted per tier, within a node and
    #: across nodes (``metrics.topology``); None: one node, no tiers
    ranks_per_node: int | None = None
    #: how the world is laid out (processes launched, world size reported, note), fixed once by
    #: ``shardbench.harness.validate.plan_cells`` and carried to every rank in the cell JSON
    plan: WorldPlan | None = None
    #: which repetition of this cell it is (``run --repeat R``: each in fresh processes)
    repeat: int = 0
    #: drill-down (not part of the cell's key: it observes the measurement, it is not one):
    #: PyTorch's memory snapshot (CUDA) or the memory tracker's per-module table (CPU) of the
    #: tracked steps, and a profiler trace of one extra step, written into ``drill_down_dir``
    memory_snapshot: bool = False
    trace: bool = False
    drill_down_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> CellConfig:
        d = dict(d)
        if isinstance(d.get("plan"), dict):
            d["plan"] = WorldPlan(**d["plan"])
        return CellConfig(**d)

    def world_plan(self) -> WorldPlan:
        """The cell's plan; planned here when the cell came from elsewhere (torchrun, a test)."""
        if self.plan is not None:
            return self.plan
        from shardbench.strategies.registry import get_strategy

        return get_strategy(self.strategy).plan_world(self.world_size, self.device, self.simulate)

    def key(self) -> tuple[CellKey, int | None]:
        """What makes two cells the same measurement of a run, as ``CellKey.in_run`` reads it
        off a record (``--resume`` skips a cell whose key has an ``ok`` record)."""
        key = CellKey(
            self.workload,
            self.preset,
            self.strategy,
            self.world_size,
            self.simulate,
            self.fake,
            self.activation_checkpointing,
            self.precision,
            self.batch_size,
            self.device,
            flat_as_none(self.shard_group, self.world_size),
        )
        return key, self.repeat


def available_cores() -> int:
    """The CPU cores this process may run on: its affinity where the OS has one, else the
    machine's count."""
    from shardbench.core_binding import own_cpus

    return len(own_cpus()) or os.cpu_count() or 1


def available_memory() -> int | None:
    """The bytes of memory this machine can give without swapping: Linux's ``MemAvailable``
    (free memory and the page cache it can drop), else the free pages; None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def threads_per_rank(local_world_size: int) -> int:
    """Share the cores among the ranks on this host: N ranks with default threads each
    oversubscribe the CPU (measured: 4 ranks on 2 cores ran 2x slower)."""
    return max(1, available_cores() // max(1, local_world_size))


@dataclass(frozen=True)
class SuiteSpec:
    """A suite: lists that expand into cells, plus shared settings."""

    name: str
    description: str = ""
    workloads: tuple[str, ...] = ("transformer",)
    strategies: tuple[str, ...] = ("ddp",)
    world_sizes: tuple[int, ...] = (2,)
    presets: tuple[str, ...] = ("tiny",)
    precisions: tuple[str, ...] = ("fp32",)
    batch_sizes: tuple[int, ...] = (8,)
    #: shard widths S (hybrid sharding) of the strategies that take one; None: over all N
    shard_group: tuple[int | None, ...] = (None,)
    #: ranks a node holds, for communication per tier (``CellConfig.ranks_per_node``)
    ranks_per_node: int | None = None
    steps: int = 5
    warmup: int = 2
    device: str = "cpu"
    timeout_s: float = DEFAULT_TIMEOUT_S
    simulate: bool = False
    fake: bool = False
    #: activation checkpointing for every cell (``run --activation-checkpointing``); a matrix
    #: may set its own, so one suite can measure a workload with and without it
    activation_checkpointing: bool = False
    #: run each timed cell this many times in a row, each in fresh processes, so a comparison
    #: sees run-to-run noise (``run --repeat`` overrides; a matrix may set its own)
    repeat: int = 1
    #: measure scaling efficiency (``run --scaling``): every real cell at N > 1 gets its N = 1
    #: cell, the reference strategy at world size 1 with all else equal
    #: (``bench/studies/scaling.py``), repeated as the cell is and measured in the same rounds
    #: (``harness.runner.interleave_repeats``); a matrix may set its own
    scaling: bool = False

    #: strategies the suite runs only where its cells run on two or more CUDA devices
    #: (DataParallel: anywhere else it is a single-device run, which beside N-rank cells reads as
    #: a slow N-rank one); ``for_devices`` adds them to ``strategies`` or leaves them out
    multi_gpu_strategies: tuple[str, ...] = ()

    #: max-size searches (``[[max_size]]`` tables: ``shardbench max-size`` flags as keys, e.g.
    #: ``workload = "transformer"``, ``strategy = "ddp,zero2"``, ``budget = "16GiB"``,
    #: ``simulate = true``); ``nightly`` runs them after the cells and gates their answers
    max_size: tuple[dict[str, Any], ...] = ()

    #: extra cross products (a suite's ``[[matrix]]`` tables): each overrides some of the lists
    #: above, e.g. a different preset per workload, and may set its own steps, warmup,
    #: timeout_s, simulate, fake, activation_checkpointing or repeat. Empty: the lists above
    #: are the one matrix.
    matrices: tuple[dict[str, Any], ...] = ()

    def for_devices(self, cuda_devices: int) -> SuiteSpec:
        """The suite on a machine with ``cuda_devices`` CUDA devices: ``multi_gpu_strategies``
        join ``strategies`` (and every ``[[matrix]]`` that names its own) when its cells run on
        two or more, and are left out otherwise."""
        if not self.multi_gpu_strategies or self.device != "cuda" or cuda_devices < 2:
            return replace(self, multi_gpu_strategies=())
        extra = tuple(s for s in self.multi_gpu_strategies if s not in self.strategies)
        matrices = tuple(
            {**m, "strategies": (*m["strategies"], *extra)} if "strategies" in m else m for m in self.matrices
        )
        return replace(
            self, strategies=(*self.strategies, *extra), matrices=matrices, multi_gpu_strategies=()
        )

    def cells(self) -> list[CellConfig]:
        cells: list[CellConfig] = []
        for matrix in self.matrices or ({},):
            lists = {key: matrix.get(key, getattr(self, key)) for key in _LIST_KEYS}
            at = {key: matrix.get(key, getattr(self, key)) for key in _MATRIX_SCALARS}
            for values in itertools.product(*(lists[k] for k in _LIST_KEYS)):
                cell = make_cell(
                    **dict(zip(_LIST_FIELDS, values, strict=True)),
                    **{key: at[key] for key in _MATRIX_SCALARS if key not in ("repeat", "scaling")},
                    device=self.device,
                    suite=self.name,
                    ranks_per_node=self.ranks_per_node,
                )
                # a --fake cell measures no time and its memory is deterministic: once is enough
                repeats = range(1 if cell.fake else at["repeat"])
                reference = scaling_reference(cell) if at["scaling"] else None
                for c in (reference, cell) if reference is not None else (cell,):
                    for i in repeats:  # the reference first: the runner's rounds keep this order
                        if (repeat := replace(c, repeat=i)) not in cells:
                            cells.append(repeat)
        return cells


def scaling_reference(cell: CellConfig) -> CellConfig | None:
    """The N = 1 cell ``cell``'s scaling efficiency is set against: the reference strategy
    (ddp) at world size 1, all else equal; None for a cell that has none (N = 1 itself, a
    simulated or planned world, which time no communication)."""
    if cell.world_size <= 1 or cell.simulate or cell.fake:
        return None
    return replace(cell, strategy=reference_strategy(), world_size=1, shard_group=None)


# order matters: the cross product in SuiteSpec.cells() follows it
_LIST_KEYS = {
    "workloads": str,
    "presets": str,
    "strategies": str,
    "world_sizes": int,
    "precisions": str,
    "batch_sizes": int,
    "shard_group": int,
}
_SCALAR_KEYS = {
    "description": str,
    "steps": int,
    "warmup": int,
    "device": str,
    "timeout_s": float,
    "simulate": bool,
    "fake": bool,
    "activation_checkpointing": bool,
    "repeat": int,
    "scaling": bool,
    "ranks_per_node": int,
}


#: settings a ``[[matrix]]`` may set for its own cells
_MATRIX_SCALARS = (
    "steps",
    "warmup",
    "timeout_s",
    "simulate",
    "fake",
    "activation_checkpointing",
    "repeat",
    "scaling",
)

#: the CellConfig field each list of ``_LIST_KEYS`` varies, in the same order
_LIST_FIELDS = ("workload", "preset", "strategy", "world_size", "precision", "batch_size", "shard_group")
_SUITE_LIST = dict(zip(_LIST_FIELDS, _LIST_KEYS, strict=True))

#: command-line flag (argparse's name for it) -> the CellConfig field it sets. Every command
#: that builds cells from flags (run, max-size, plan) reads them through this one table, so a
#: flag means the same field everywhere.
FLAG_FIELDS = {
    "workload": "workload",
    "preset": "preset",
    "strategy": "strategy",
    "world_size": "world_size",
    "precision": "precision",
    "batch_size": "batch_size",
    "shard_group": "shard_group",
    "ranks_per_node": "ranks_per_node",
    "steps": "steps",
    "warmup": "warmup",
    "device": "device",
    "timeout": "timeout_s",
    "simulate": "simulate",
    "fake": "fake",
    "activation_checkpointing": "activation_checkpointing",
}


def fields_from_flags(args: Any) -> dict[str, Any]:
    """The CellConfig fields set by the flags ``args`` has (``FLAG_FIELDS``); a flag the
    command does not take is left out."""
    return {field: getattr(args, flag) for flag, field in FLAG_FIELDS.items() if hasattr(args, flag)}


def suite_overrides(fields: dict[str, Any]) -> dict[str, Any]:
    """Cell fields as the ``SuiteSpec`` keys ``override`` takes: a field a suite varies
    (``workload``) names its list (``workloads``), whose value the flag replaces."""
    return {_SUITE_LIST.get(field, field): value for field, value in fields.items()}


def make_cell(**fields: Any) -> CellConfig:
    """A cell from its fields, with the one rule between them: ``fake`` implies ``simulate``
    (a planned cell is a simulated rank that allocates nothing)."""
    simulate = bool(fields.get("simulate")) or bool(fields.get("fake"))
    return CellConfig(**{**fields, "simulate": simulate})


def suite_names() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def load_suite(name_or_path: str) -> SuiteSpec:
    """Load a suite by name (``bench/suites/<name>.toml``) or by path to a TOML file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = SUITES_DIR / f"{name_or_path}.toml"
        if not path.exists():
            raise ValueError(
                f"unknown suite {name_or_path!r}; allowed: {', '.join(suite_names())} "
                "or a path to a .toml file"
            )
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read suite file {str(path)!r}: {e}") from None
    where = f"suite {str(path)!r}"
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "matrix":
            if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
                raise ValueError(f"{where}: 'matrix' must be an array of tables ([[matrix]])")
            kwargs["matrices"] = tuple(_matrix(m, f"{where} [[matrix]]") for m in value)
        elif key == "max_size":
            if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
                raise ValueError(f"{where}: 'max_size' must be an array of tables ([[max_size]])")
            kwargs["max_size"] = tuple(value)
        elif key in _LIST_KEYS:
            kwargs.update(_lists({key: value}, where))
        elif key == "multi_gpu_strategies":
            kwargs[key] = _lists({"strategies": value}, f"{where} {key!r}")["strategies"]
        elif key in _SCALAR_KEYS:
            kwargs[key] = _scalar(key, value, where)
        else:
            allowed = ", ".join([*_LIST_KEYS, "multi_gpu_strategies", *_SCALAR_KEYS, "matrix", "max_size"])
            raise ValueError(f"{where}: unknown key {key!r}; allowed: {allowed}")
    return SuiteSpec(name=path.stem, **kwargs)


def _is_a(value: Any, typ: type) -> bool:
    """isinstance, except that a boolean is never a number (TOML ``true`` is not world size 1)."""
    return isinstance(value, typ) and not (isinstance(value, bool) and typ is not bool)


def _scalar(key: str, value: Any, where: str) -> Any:
    typ = _SCALAR_KEYS[key]
    if typ is float and _is_a(value, int):
        value = float(value)
    if not _is_a(value, typ):
        raise ValueError(f"{where}: {key!r} must be {typ.__name__}, got {value!r}")
    if key == "repeat" and not 1 <= value <= 100:
        raise ValueError(f"{where}: 'repeat' must be from 1 to 100, got {value!r}")
    return value


def _matrix(table: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``[[matrix]]`` table: list keys, plus the per-cell settings it may override (so one
    suite can hold real world sizes and simulated ones, or more steps for some cells)."""
    scalars = {k: _scalar(k, v, where) for k, v in table.items() if k in _MATRIX_SCALARS}
    try:
        return {**_lists({k: v for k, v in table.items() if k not in _MATRIX_SCALARS}, where), **scalars}
    except ValueError as e:
        if "unknown key" not in str(e):
            raise
        raise ValueError(f"{e}, {', '.join(_MATRIX_SCALARS)}") from None


def _lists(table: dict[str, Any], where: str) -> dict[str, tuple[Any, ...]]:
    """Validate the list keys of a table (a scalar counts as a one-element list)."""
    out = {}
    for key, value in table.items():
        if key not in _LIST_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; allowed: {', '.join(_LIST_KEYS)}")
        values = value if isinstance(value, list) else [value]
        if not values or not all(_is_a(v, _LIST_KEYS[key]) for v in values):
            bad = next((v for v in values if not _is_a(v, _LIST_KEYS[key])), None)
            raise ValueError(
                f"{where}: {key!r} must be a non-empty list of {_LIST_KEYS[key].__name__}"
                + (f", got {bad!r}" if values else "")
            )
        out[key] = tuple(values)
    return out


def override(spec: SuiteSpec, **changes: Any) -> SuiteSpec:
    """Apply command-line overrides (None keeps the suite's value). An overridden list replaces
    that list in every ``[[matrix]]`` too: the command line wins everywhere."""
    given = {k: v for k, v in changes.items() if v is not None}
    if "strategies" in given:  # the strategies named are the ones run, wherever that is
        given["multi_gpu_strategies"] = ()
    matrices = tuple({k: v for k, v in m.items() if k not in given} for m in spec.matrices)
    return replace(spec, matrices=matrices, **given)
