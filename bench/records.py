"""The result record: one JSON object per cell, appended to ``records.jsonl``.

Tables, plots and baselines are built only from records, never from live objects, so a record
must say everything needed to interpret it: what ran (cell), how the strategy was configured,
what was measured (time, memory and its breakdown), what theory predicted, and where (env).

Records are the product, so writing them is defensive: each append is one whole line under an
exclusive lock, a partial line left by a crash is moved aside before anything is appended after
it, and non-finite numbers are written as ``null`` (JSON has no NaN) with the status saying why.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import types
import typing
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from shardbench.core_binding import launcher_binding
from shardbench.step_figures import BareCompute, ComputeReplay, FlopsPerStep, PredictedStep
from shardbench.step_figures import from_json as figures
from shardbench.wording import count

#: version of the record layout; 2 added ``schema``, ``failure`` and the statuses
#: ``diverged`` and ``interrupted``; 3 added the run's ``name`` and ``tags`` and the cell's
#: ``repeat`` index. Records without ``schema`` are version 1; every older record still loads.
#: ``activation_checkpointing`` came later without a bump: a record without it reads as False,
#: which is what every older record measured; so did ``placement``: a record without it is read
#: from its world size and the host's core count (``oversubscription``). So did the throughput
#: fields (``flops_per_step``, ``peak_flops_per_s``, ``achieved_flops_per_s``, ``mfu``, ``hfu``,
#: ``tokens_per_s``): an older record reads with them None, counted by nobody; and so did
#: ``predicted_step_time``, None on an older record (no prediction to check), and
#: ``compute_replay``, None on an older record (its prediction counts compute from its FLOPs).
#: 4 reads ``flops_per_step``, ``compute_replay`` and ``predicted_step_time`` as typed figures
#: (``step_figures``), their JSON unchanged: an older record's objects read into them
#: (``Record.from_json``). ``bare_compute``, ``optimizer_tensors``, ``optimizer_tensor_elements``
#: and ``optimizer_dtensor_shapes`` read None on a record that lacks them, within this layout (its
#: prediction replays the compute, takes the update from the probe's rate at its size and counts
#: no per-tensor update or DTensor dispatch).
SCHEMA = 4
#: a layout whose records measure what an earlier one's did (only how they are written changed)
#: -> that earlier layout: records of the two compare as of one environment
MEASURED_ALIKE = {4: 3}


def measured_as(schema: int) -> int:
    """The layout whose measurements a record of ``schema`` holds (``MEASURED_ALIKE``)."""
    return MEASURED_ALIKE.get(schema, schema)


STATUSES = ("ok", "oom", "error", "timeout", "diverged", "interrupted", "skipped")
FAILED_STATUSES = tuple(s for s in STATUSES if s not in ("ok", "skipped"))
#: fields a line must have to be read as a record at all
REQUIRED = ("run_id", "workload", "preset", "strategy", "world_size", "status")


class CellKey(NamedTuple):
    """What makes two records measurements of the same cell: the one definition every
    comparison of cells uses, less the fields it sets aside (``without``): ``compare`` across
    runs (``of``), ``--resume`` within a run (``in_run``), the strategies of one group set
    against ddp (``without("strategy")``), a real cell and its simulated twin
    (``without("simulated", "fake")``). The device's name is an environment fact, not part of
    the cell."""

    workload: str
    preset: str
    strategy: str
    world_size: int
    simulated: bool
    fake: bool
    activation_checkpointing: bool
    precision: str
    batch_size: int | None
    device: str
    #: hybrid sharding's shard width S where it is not N (``flat_as_none``): a record without
    #: it, and a flat one, are the same cell
    shard_group: int | None = None

    @classmethod
    def of(cls, r: Record) -> CellKey:
        """The cell ``r`` measures. A max-size summary is a copy of its largest fit's record, so
        what it found (the preset, or the batch) is its answer, not its identity: it is named by
        what was searched instead, ``max-size-params-<budget>`` or
        ``<preset>@max-size-batch-<budget>``, with ``-with-reserve`` where a reserve was counted
        beside each peak (a CUDA target): a search by another fit rule is another cell."""
        preset, batch = r.preset, r.batch_size_per_rank
        if r.max_size is not None:
            budget = (r.max_size.get("budget_bytes") or 0) / 2**30
            counted = (r.max_size.get("reserve") or {}).get("counted")  # ``Reserve.counted``, as recorded
            search = f"max-size-{r.max_size.get('vary')}-{budget:g}GiB" + ("-with-reserve" if counted else "")
            if r.max_size.get("vary") == "batch":
                preset, batch = f"{r.preset}@{search}", None
            else:
                preset = search
        return cls(
            r.workload,
            preset,
            r.strategy,
            r.world_size,
            r.simulated,
            r.fake,
            r.activation_checkpointing,
            r.precision,
            batch,
            r.device,
            flat_as_none(r.shard_group, r.world_size),
        )

    @classmethod
    def in_run(cls, r: Record) -> tuple[CellKey, int | None]:
        """The cell of its run ``r`` was asked for (``CellConfig.key``): as asked (the world
        size requested, the preset and batch as given), and which repeat."""
        key = cls(
            r.workload,
            r.preset,
            r.strategy,
            r.requested_world_size,
            r.simulated,
            r.fake,
            r.activation_checkpointing,
            r.precision,
            r.batch_size_per_rank,
            r.device,
            flat_as_none(r.shard_group, r.requested_world_size),
        )
        return key, r.repeat

    def without(self, *names: str) -> tuple[Any, ...]:
        """The key with ``names`` set aside: cells equal in everything else share it. The shard
        width is a setting of the strategy: setting the strategy aside sets it aside too."""
        names = (*names, "shard_group") if "strategy" in names else names
        return tuple(v for k, v in zip(self._fields, self, strict=True) if k not in names)


def flat_as_none(shard_group: int | None, world_size: int) -> int | None:
    """A cell's shard width as its identity has it: None where it shards over all N (S = N,
    or no S: a record written before the field, a strategy that takes none)."""
    return None if shard_group is None or shard_group == world_size else shard_group


def strategy_label(r: Record) -> str:
    """The strategy as tables show it: with its shard width where that is not N (``zero3 S=2``)."""
    s = flat_as_none(r.shard_group, r.world_size)
    return r.strategy if s is None else f"{r.strategy} S={s}"


class RecordWriteError(OSError):
    """A record could not be written: the run must stop rather than measure into the void."""


@dataclass
class Record:
    run_id: str
    suite: str
    workload: str
    preset: str
    params: int
    strategy: str
    world_size: int
    requested_world_size: int
    simulated: bool
    backend: str
    device: str
    precision: str
    batch_size_per_rank: int
    steps: int
    warmup: int
    status: str
    error: str | None = None
    #: which rank failed first and how: {"rank", "signal", "step", "stopped_by_launcher": [...]}
    failure: dict[str, Any] | None = None
    note: str = ""
    strategy_settings: dict[str, Any] = field(default_factory=dict)
    step_time_s: dict[str, float] | None = None
    #: the seconds of each timed step, in order (the slowest rank's): what ``step_time_s``
    #: summarizes, kept so that any other statistic (``export``'s mean, stddev, extremes) is exact
    step_times_s: list[float] | None = None
    #: a CPU cell's phases, each the median over its timed steps on the rank slowest in it:
    #: ``forward``, ``backward`` (the gradients' reduction waited on in it included) and
    #: ``optimizer`` (the update, and what the step gathers after it): beside
    #: ``predicted_step_time``'s terms, where the model misses shows by term
    step_phases_s: dict[str, float] | None = None
    samples_per_s: float | None = None
    peak_mem_bytes: dict[str, Any] | None = None  # {"per_rank": [...], "max": int, "source": str}
    mem_breakdown_bytes: dict[str, int] | None = None  # of the peak rank, at its peak
    cuda_allocator: dict[str, int] | None = None  # of the peak rank
    predicted_mem_bytes: dict[str, int] | None = None
    #: params/grads/optimizer held after a step (before the next zero_grad), with their total:
    #: what the analytic prediction is compared with (of the peak rank)
    model_state_bytes: dict[str, int] | None = None
    #: planned under FakeTensorMode: memory is what the tracker saw allocated, none was
    fake: bool = False
    #: the workload's checkpoint units recomputed their activations in backward
    activation_checkpointing: bool = False
    #: hybrid sharding's shard width S (N where a strategy that takes one shards over all N);
    #: None for a strategy that takes none, and on a record written before the field (flat)
    shard_group: int | None = None
    #: only on ``shardbench max-size`` summary records (suite "max-size"); see bench/studies/maxsize.py
    max_size: dict[str, Any] | None = None
    loss: dict[str, float | None] | None = None  # {"first", "last"}, rank 0
    wall_s: float | None = None
    env: dict[str, Any] = field(default_factory=dict)
    #: the run's name (``run --name``, the suite's by default) and its ``--tag key=value`` pairs
    name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    #: which of the cell's ``run --repeat R`` repetitions this is (0 when not repeated)
    repeat: int = 0
    #: drill-down artefacts the cell wrote (``--memory-snapshot``, ``--trace``): label -> path
    #: relative to the run directory
    artifacts: dict[str, str] | None = None
    #: the collectives rank 0 issued in one steady step, per kind: calls, bytes of the full
    #: tensors, bytes a ring sends per rank (``bench/metrics/comm.py``); ``sent_per_rank`` in all
    comm_per_step: dict[str, Any] | None = None
    #: the same, as ZeRO's accounting predicts it for this strategy, precision and backend
    #: (``bench/metrics/analytic.predicted_comm``)
    predicted_comm: dict[str, Any] | None = None
    #: ``--trace`` on CUDA: the traced step's NCCL kernel time, the part compute kernels
    #: overlapped, the exposed rest and its fraction of the step (``bench/studies/exposed_comm.py``)
    comm_overlap: dict[str, float] | None = None
    #: torch's intra-op threads per rank (the host's cores shared among its ranks; a simulated
    #: rank gets what a real rank of its world would)
    threads_per_rank: int | None = None
    #: the slowest rank's seconds before its first step (``setup``: imports, process group,
    #: model, strategy; DeepSpeed builds its ops here) and of its first warm-up step
    #: (``first_step``: a cold cache); the timed steps exclude both (``harness.result.slow_start``)
    startup_s: dict[str, float | None] | None = None
    #: how the cell's ranks sat on their host: ``ranks``, its rank processes there (1 for a
    #: simulated world), and what they ran on, ``cores`` (the CPU cores the ranks share) or
    #: ``devices`` (CUDA devices); read by ``oversubscription``. ``bound_cores_each``: the cores
    #: each rank was bound to (``core_binding``), absent where the ranks were free to move
    placement: dict[str, int] | None = None
    #: one rank's training step of its own batch, forward and backward, as torch's FLOP
    #: formulas count it (``bench/prediction/flops.py``): ``model`` (the math once, MFU's)
    #: and ``hardware`` (activation checkpointing's recompute included, HFU's), ``per_sample``,
    #: ``per_token`` (a sequence workload), the matmul ``dtype``, ``by_op``, ``counted_on``
    flops_per_step: FlopsPerStep | None = None
    #: the peak MFU and HFU are set against: ``flops_per_s``, ``kind`` ("datasheet" or
    #: "measured"), ``dtype``, ``source`` (``bench/prediction/peaks.py``)
    peak_flops_per_s: dict[str, Any] | None = None
    #: per rank: FLOPs per step (``model``, ``hardware``) over the median step time
    achieved_flops_per_s: dict[str, float] | None = None
    #: model FLOPs utilisation: achieved model FLOP/s over the peak; ``hfu`` the hardware one's
    mfu: float | None = None
    hfu: float | None = None
    #: ``samples_per_s`` times the workload's tokens per sample (a sequence workload)
    tokens_per_s: float | None = None
    #: the step-time model's prediction for this cell (``bench/prediction/record_step_time.py``):
    #: ``step`` and its terms ``compute``, ``update``, ``comm``, ``exposed_comm``,
    #: ``call_overhead``, ``buffer_memory`` in seconds, the ``network`` profile and the rate,
    #: efficiency and core share it assumed
    predicted_step_time: PredictedStep | None = None
    #: a CPU cell's forward and backward replayed op by op at a rank's threads
    #: (``bench/prediction/op_replay.py``): ``seconds``, ``calls``, ``distinct``,
    #: ``unreplayed_calls``, ``threads``, ``measured_at``; the step-time model's compute term
    compute_replay: ComputeReplay | None = None
    #: a real CPU cell's forward and backward timed on the model itself, before the strategy
    #: wrapped it, on every rank at once (``bench/prediction/bare_compute.py``): the step-time
    #: model's compute term where it was taken
    bare_compute: BareCompute | None = None
    #: the most tensors a rank's optimizer steps over (its own pieces under sharding): the
    #: update's per-tensor cost follows them, as its per-element cost follows the elements
    optimizer_tensors: int | None = None
    #: the elements of each of them, in the order the optimizer steps them, on the rank that
    #: updates the most: the update is replayed over them (``bench/prediction/update_probe.py``)
    optimizer_tensor_elements: list[int] | None = None
    #: the global shapes of the DTensors among them (FSDP2's shards), in the order the optimizer
    #: steps them: the update's DTensor dispatch follows them
    #: (``bench/prediction/dtensor_update_probe.py``); None where it steps over no DTensor
    optimizer_dtensor_shapes: list[list[int]] | None = None
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        assert self.status in STATUSES, f"bad status {self.status!r}"
        # the typed figures, from the JSON objects a record of any schema holds
        self.flops_per_step = figures(FlopsPerStep, self.flops_per_step)
        self.compute_replay = figures(ComputeReplay, self.compute_replay)
        self.bare_compute = figures(BareCompute, self.bare_compute)
        self.predicted_step_time = figures(PredictedStep, self.predicted_step_time)

    def to_json(self) -> dict[str, Any]:
        return finite(asdict(self))

    @staticmethod
    def from_json(d: dict[str, Any]) -> Record:
        known = Record.__dataclass_fields__
        values = {k: v for k, v in d.items() if k in known}
        values.setdefault("schema", 1)  # written before the field existed
        return Record(**values)


#: the suite of a max-size search's probe records (``bench/studies/maxsize.py``)
PROBE_SUITE = "max-size-probe"


def latest_outcomes(records: Iterable[Record]) -> list[Record]:
    """Each cell of each run once, at its latest record, where the cell first appeared: a
    resumed run (``run --resume``) runs a cell that was interrupted or failed again and appends
    the new record, which is now that cell's outcome; the earlier one stays in ``records.jsonl``
    as what happened then. A cell is ``CellKey.in_run`` (as asked, and its repeat), a max-size
    summary ``CellKey.of`` (what was searched). Probes are all kept: a timed-out probe and its
    retry are two steps of one search, both shown."""
    latest: dict[tuple, Record] = {}
    for i, r in enumerate(records):
        if r.suite == PROBE_SUITE:
            key: tuple = ("probe", i)
        elif r.max_size is not None:
            key = ("search", r.run_id, CellKey.of(r), r.repeat)
        else:
            key = ("cell", r.run_id, *CellKey.in_run(r))
        latest[key] = r  # an update keeps the place the cell first had
    return list(latest.values())


def none_ok(records: Iterable[Record]) -> str | None:
    """Where no record is ok, what they are instead ("3 records, none ok: 2 error, 1 oom"), for
    the one line that says an artefact built from them (a report, a baseline, a verdict) rests on
    failures alone; None where a record is ok, or a max-size search answered (its ``oom``: nothing
    fits, an answer)."""
    records = list(records)
    if any(r.status == "ok" or (r.max_size is not None and r.status == "oom") for r in records):
        return None
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    what = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items(), key=lambda kv: -kv[1]))
    return f"{count(len(records), 'record')}, none ok: {what}"


def placement_of(r: Record) -> dict[str, int]:
    """How the cell's ranks sat on their host (``Record.placement``); for a record written
    before that field, read from its world size (its ranks on one host, unless simulated or
    single-process) and the host's ``cpu_count`` (``device_count`` on CUDA); {} where unknown."""
    if r.placement is not None:
        return r.placement
    if r.simulated or r.backend not in ("gloo", "nccl"):
        return {"ranks": 1}
    what = "devices" if r.device == "cuda" else "cores"
    have = r.env.get("device_count" if what == "devices" else "cpu_count")
    return {"ranks": r.world_size, what: have} if isinstance(have, int) else {}


def oversubscription(r: Record) -> str | None:
    """The mark of a cell whose rank processes outnumbered what they ran on (``placement_of``),
    "more ranks than cores" (or "than devices"): each waited its turn, so its step time is
    partly that wait. None where they did not, or where it is unknown."""
    placed = placement_of(r)
    for what in ("cores", "devices"):
        have = placed.get(what)
        if have and placed.get("ranks", 0) > have:
            return f"more ranks than {what}"
    return None


def finite(value: Any) -> Any:
    """``value`` with every NaN/Infinity float replaced by None, recursively (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def append_record(path: Path, record: Record) -> None:
    """Append one record as one whole line under an exclusive lock, then fsync, so concurrent
    writers (two runs into one directory) never interleave and a crash later loses nothing.
    A trailing partial line (a crash mid-write) is moved to ``<file>.corrupt`` first, so the new
    record is not glued onto it. Any failure raises ``RecordWriteError`` naming the file."""
    line = json.dumps(record.to_json(), sort_keys=True, allow_nan=False) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                _quarantine_partial_line(f, path)
                f.write(line.encode())
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except OSError as e:
        raise RecordWriteError(f"cannot write the record to {path}: {e.strerror or e}") from e


def _quarantine_partial_line(f: Any, path: Path) -> None:
    """Move a last line with no newline (the remains of an interrupted write) to .corrupt."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return
    f.seek(max(0, size - (1 << 20)))
    tail = f.read()
    cut = tail.rfind(b"\n") + 1  # 0 when the file is one partial line
    keep = size - len(tail) + cut
    with open(f"{path}.corrupt", "ab") as bad:
        bad.write(tail[cut:] + b"\n")
    f.truncate(keep)
    moved = f"moved a partial last line ({count(size - keep, 'byte')}) to {path}.corrupt"
    warnings.warn(f"{path}: {moved}", stacklevel=3)


def read_records(paths: Iterable[Path], *, strict: bool = False) -> list[Record]:
    """Read records from JSONL files (or run directories holding ``records.jsonl``). A line that
    is not a record is named by file and line and skipped with a warning (``strict``: raises
    ``ValueError``), so one bad line never hides the good ones."""
    out: list[Record] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "records.jsonl"
        with p.open(errors="surrogateescape") as f:  # a line that is not UTF-8 is named below
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    if not line.isascii():
                        line.encode()  # a byte that is not UTF-8 (kept as a surrogate) raises here
                    out.append(parse_record(line))
                except (ValueError, UnicodeEncodeError) as e:
                    if isinstance(e, UnicodeEncodeError):
                        e = ValueError(f"not UTF-8 text at column {e.start + 1}")
                    message = f"{p}:{lineno}: not a record ({e})"
                    if strict:
                        raise ValueError(message) from None
                    warnings.warn(message + "; skipped", stacklevel=2)
    return out


def records_file(source: Path | str) -> Path:
    """A run directory's ``records.jsonl``, or the records file itself; ``ValueError`` names an
    input that holds neither."""
    p = Path(source)
    f = p / "records.jsonl" if p.is_dir() else p
    if not f.is_file():
        where = f"{p} has no records.jsonl" if p.is_dir() else f"{p} does not exist"
        raise ValueError(f"{where}: expected a run directory holding records.jsonl, or a .jsonl file")
    return f


def records_files(sources: Sequence[Path | str]) -> list[Path]:
    """Each input's records file, in order; the same file given twice counts once."""
    if not sources:
        raise ValueError("no input: give run directories (holding records.jsonl) or .jsonl files")
    files: list[Path] = []
    for source in sources:
        f = records_file(source)
        if f.resolve() not in {g.resolve() for g in files}:
            files.append(f)
    return files


def load_records(sources: Path | str | Sequence[Path | str], *, strict: bool = False) -> list[Record]:
    """The records of every input (run directories or records files), in input order: what a
    command reads. An input that holds no records is an error, not a blank; a line that is not a
    record is named and skipped (``strict``: refused, ``ValueError``)."""
    records: list[Record] = []
    for f in records_files([sources] if isinstance(sources, str | Path) else sources):
        found = read_records([f], strict=strict)
        if not found:
            raise ValueError(f"{f}: holds no records")
        records.extend(found)
    return records


def parse_json_object(line: str) -> dict[str, Any]:
    """One JSONL line as a JSON object; ``ValueError`` says what is wrong with it."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON at column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def parse_record(line: str) -> Record:
    """One JSONL line as a Record; ``ValueError`` says what is wrong with it. The one validator
    every reader uses (``read_records``: report, compare, baseline save, trend, export): a field
    of the wrong type is refused here, never met later as a crash in whichever tool reads it."""
    data = parse_json_object(line)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if data["status"] not in STATUSES:
        raise ValueError(f"unknown status {data['status']!r}; allowed: {', '.join(STATUSES)}")
    hints = _field_types()
    for name, value in data.items():
        if name in hints and (problem := _type_problem(name, value, hints[name])):
            raise ValueError(problem)
    peak = data.get("peak_mem_bytes")
    if isinstance(peak, dict) and not _number_or_none(peak.get("max")):
        raise ValueError(f"peak_mem_bytes.max should be a number, got {peak.get('max')!r}")
    try:
        return Record.from_json(data)
    except TypeError as e:
        raise ValueError(str(e)) from None


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(Record)


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _type_problem(name: str, value: Any, hint: Any) -> str | None:
    """Why ``value`` is not of the field's declared type ``hint``, or None when it is (one level
    of a dict's values is checked where they are declared numbers)."""
    if hint is Any:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(name, value, a) for a in args if a is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # typed figures: an object
        if not isinstance(value, dict | hint):
            return f"{name} should be an object, got {type(value).__name__} {value!r:.40}"
        return None
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            return f"{name} should be an object, got {type(value).__name__} {value!r:.40}"
        if len(args) == 2 and args[1] in (int, float):
            bad = next((k for k, v in value.items() if not _number_or_none(v)), None)
            if bad is not None:
                return f"{name}.{bad} should be a number, got {value[bad]!r:.40}"
        return None
    if origin is list:
        if not isinstance(value, list):
            return f"{name} should be a list, got {type(value).__name__} {value!r:.40}"
        if args and args[0] in (int, float) and not all(_number_or_none(v) and v is not None for v in value):
            return f"{name} should be a list of numbers, got {value!r:.40}"
        return None
    wanted = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}.get(hint)
    if wanted is None or isinstance(value, wanted) and not (hint in (int, float) and isinstance(value, bool)):
        return None
    return f"{name} should be {hint.__name__}, got {type(value).__name__} {value!r:.40}"


def first_line(text: str | None, limit: int = 120) -> str:
    """The first non-empty line of an error, for one-line table cells."""
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else ""


#: the checkout this code runs from, if it is one: bench/ sits in it
CHECKOUT = Path(__file__).resolve().parents[1]


def _git_sha(root: Path = CHECKOUT) -> str | None:
    """The commit of the shardbench checkout this code runs from; None for an installed package
    (whose folder may sit inside some other repository, a user's, whose commit says nothing).
    Read from the repository's files: every record asks, and a ``git`` process forked from a
    launcher holding torch costs milliseconds each time. A layout the files do not settle (a
    worktree's ``.git`` file, a ref in neither place) asks ``git``."""
    git = root / ".git"
    if not git.exists():
        return None
    if git.is_dir():
        try:
            head = (git / "HEAD").read_text().strip()
            if not head.startswith("ref: "):
                return head or None  # a detached HEAD holds the commit itself
            ref = head[len("ref: ") :]
            if (git / ref).is_file():
                return (git / ref).read_text().strip() or None
            for line in (git / "packed-refs").read_text().splitlines():
                sha, _, name = line.partition(" ")
                if name == ref:
                    return sha
        except OSError:
            pass
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str | None:
    """The CPU's model name (Linux): which machine a CPU step time was measured on."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


#: the libraries a record can name beside torch: the peers' (their versions also in a cell's
#: strategy settings), Lightning's and the one that builds ``hf:`` models
PACKAGES = ("deepspeed", "fairscale", "lightning", "transformers")


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Each package's installed version, "not installed" where it is absent; read from the
    installed metadata, so nothing is imported (DeepSpeed's import alone takes seconds)."""
    return dict(_installed_versions(tuple(names)))


@functools.cache
def _installed_versions(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Read once a process: the metadata search walks every installed distribution (milliseconds
    for each record), and a package installed while a process runs is not the one it imported."""
    from importlib import metadata

    versions = []
    for name in names:
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, "not installed"))
    return tuple(versions)


#: the device name where an env names none (a processor whose model and architecture could not
#: be read): one name, so every probe cache keys one such CPU alike
UNNAMED_DEVICE = "unknown CPU"


def capture_env(device: str) -> dict[str, Any]:
    """Versions and hardware the numbers depend on."""
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "host": socket.gethostname(),
        "git_sha": _git_sha(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_model": _cpu_model(),
        "packages": package_versions(),
        # a checkout's commit says more, but an installed package has none
        "shardbench": dict(_installed_versions(("shardbench",)))["shardbench"],
    }
    # on the CPU the device is the processor: its model, not only its architecture
    env["device_name"] = env["cpu_model"] or platform.processor() or platform.machine()
    if device == "cuda" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(0)
        env["device_count"] = torch.cuda.device_count()
    # how the ranks sat on the cores: bound and free ranks' step times do not compare
    if (binding := launcher_binding(device)) is not None:
        env["rank_binding"] = binding
    return env
