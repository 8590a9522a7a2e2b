"""``shardbench claim``: does sharding halve per-rank memory or double the trainable model?

For each workload of a ``ClaimSpec`` (bench/studies/claim_specs.py) it measures, at equal per-rank batch:

* per-rank peak memory of ddp, zero2, our further stages (zero3) and the peers at a simulated
  world size N (real memory);
* the largest trainable model of ddp, zero2 and zero3 within the same per-rank budget (max-size search;
  probes under ``--fake`` where the workload allows it, since planning equals a real run within
  1% per category (tests/test_fake.py), real allocations otherwise);
* the step time of ddp and zero2 on real ranks where the machine has them, else the simulated
  runs' compute-only time, labelled.

The verdict is a measurement: the claim holds for a workload when zero2's peak is at most 0.5x
DDP's or its largest trainable model is at least 2x DDP's; when it does not, the report says what
the peak is made of (typically activations, which no ZeRO stage shards).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench.harness.config import CellConfig
from shardbench.harness.launch import run_cell
from shardbench.models.registry import get_workload
from shardbench.records import Record, append_record, first_line
from shardbench.report.tables import markdown_table
from shardbench.studies.claim_specs import ClaimSpec, ClaimWorkload
from shardbench.studies.compare_rules import step_time_noise
from shardbench.studies.maxsize import parse_budget, search

OURS, BASELINE = "zero2", "ddp"
MEMORY_THRESHOLD, SIZE_THRESHOLD = 0.5, 2.0


@dataclass
class WorkloadResult:
    workload: ClaimWorkload
    memory: dict[str, Record] = field(default_factory=dict)  # strategy -> simulated-N record
    timing: dict[str, Record] = field(default_factory=dict)  # strategy -> timing record
    max_size: dict[str, Record] = field(default_factory=dict)  # strategy -> max-size summary
    #: strategy -> memory record on real ranks (N = the spec's timing world size): the peers that
    #: cannot be simulated, with ddp and zero2 at the same N to set them against
    real_memory: dict[str, Record] = field(default_factory=dict)

    def real_peak(self, strategy: str) -> int | None:
        r = self.real_memory.get(strategy)
        return (r.peak_mem_bytes or {}).get("max") if r is not None and r.status == "ok" else None

    def real_peak_ratio(self, strategy: str) -> float | None:
        peak, base = self.real_peak(strategy), self.real_peak(BASELINE)
        return peak / base if peak and base else None

    def peer_verdicts(self) -> list[tuple[str, bool | None, str]]:
        """(peer, holds, text) for each peer measured on real ranks: its peak against DDP's at
        the same N, ours beside it, what ZeRO-2's model states allow at that N, and where the
        peer's peak differs most from ours."""
        out = []
        ours, base = self.real_memory.get(OURS), self.real_memory.get(BASELINE)
        for peer, r in self.real_memory.items():
            if peer in (BASELINE, OURS):
                continue
            n = r.world_size
            ratio = self.real_peak_ratio(peer)
            if ratio is None:
                why = first_line(r.error, 100) if r.status != "ok" else "ddp's cell failed"
                out.append((peer, None, f"not measured at real N={n}: {r.status}, {why}"))
                continue
            text = f"peak = {ratio:.2f}x ddp at real N={n}"
            if (mine := self.real_peak_ratio(OURS)) is not None:
                text += f" (ours, zero2: {mine:.2f}x)"
            floor = _model_state_floor(r, base)
            if floor is not None and floor > MEMORY_THRESHOLD:
                text += (
                    f"; at N={n} ZeRO-2's model states are at best {floor:.2f}x DDP's (their formula), "
                    "so halving needs more ranks"
                )
            if (
                ours is not None
                and ours.status == "ok"
                and r.mem_breakdown_bytes
                and ours.mem_breakdown_bytes
            ):
                diff = {k: v - ours.mem_breakdown_bytes.get(k, 0) for k, v in r.mem_breakdown_bytes.items()}
                top = max(diff, key=lambda k: abs(diff[k]))
                if diff[top]:
                    more = "more" if diff[top] > 0 else "less"
                    text += f"; against ours its peak holds {abs(diff[top]) / 2**20:.0f} MiB {more} {top}"
            out.append((peer, ratio <= MEMORY_THRESHOLD, text))
        return out

    def peak(self, strategy: str) -> int | None:
        r = self.memory.get(strategy)
        return (r.peak_mem_bytes or {}).get("max") if r is not None and r.status == "ok" else None

    def memory_ratio(self) -> float | None:
        return self.peak_ratio(OURS)

    def peak_ratio(self, strategy: str) -> float | None:
        ours, base = self.peak(strategy), self.peak(BASELINE)
        return ours / base if ours and base else None

    def size_ratio(self, strategy: str = OURS) -> tuple[float | None, float | None, float | None]:
        """(measured, lower bound, upper bound) of ``strategy``'s / ddp's largest trainable params."""
        ours, base = (self.max_size.get(s) for s in (strategy, BASELINE))
        if not ours or not base or not ours.max_size or not base.max_size:
            return None, None, None
        o_fit, b_fit = ours.max_size["largest_fit"], base.max_size["largest_fit"]
        o_fail, b_fail = ours.max_size["smallest_fail"], base.max_size["smallest_fail"]
        if not o_fit or not b_fit or (not o_fail and not b_fail):
            return None, None, None  # nothing fitted, or the whole ladder fitted both: no boundary
        ratio = o_fit["params"] / b_fit["params"]
        lower = o_fit["params"] / b_fail["params"] if b_fail else None
        upper = o_fail["params"] / b_fit["params"] if o_fail else None
        return ratio, lower, upper

    def size_decides(self) -> bool | None:
        """Whether zero2's largest model is >= 2x DDP's, judged on the brackets: True only when
        even the least favourable end (zero2's fit over DDP's smallest non-fit) reaches it,
        False when even the most favourable end does not, None in between (or unmeasured)."""
        size, lower, upper = self.size_ratio()
        if size is None:
            return None
        if (lower if lower is not None else size) >= SIZE_THRESHOLD:
            return True
        if (upper if upper is not None else size) < SIZE_THRESHOLD:
            return False
        return None

    def time_ratio(self) -> float | None:
        t = {s: (r.step_time_s or {}).get("median") for s, r in self.timing.items() if r.status == "ok"}
        return t[OURS] / t[BASELINE] if t.get(OURS) and t.get(BASELINE) else None

    def time_noise(self) -> str | None:
        """Whether zero2's step time differs from DDP's by more than the noise, by the rule
        ``compare`` uses: at least ``min_steps`` timed steps each, and a difference beyond
        ``k_mad`` x the combined MAD; None when unmeasured."""
        ours, base = self.timing.get(OURS), self.timing.get(BASELINE)
        if ours is None or base is None:
            return None
        return step_time_noise(ours, base, base_label=BASELINE)

    def verdict(self, world_size: int) -> tuple[bool | None, str]:
        mem, (size, lower, upper) = self.memory_ratio(), self.size_ratio()
        if mem is None and size is None:
            return None, "not measured: " + self._failures()
        by_size = self.size_decides()
        holds = (mem is not None and mem <= MEMORY_THRESHOLD) or by_size is True
        parts = []
        if mem is not None:
            parts.append(f"zero2 peak = {mem:.2f}x ddp")
        if size is not None:
            bounds = f" (between {_fmt(lower)}x and {_fmt(upper)}x: the searches' brackets"
            if by_size is None:
                bounds += f", which straddle {SIZE_THRESHOLD:g}x: undecided at this resolution"
            parts.append(f"largest trainable = {size:.2f}x ddp{bounds + ')' if lower or upper else ''}")
        elif failed := [r for r in self.max_size.values() if r.status not in ("ok", "oom")]:
            parts.append(
                "largest trainable: search failed ("
                + "; ".join(f"{r.strategy}: {first_line(r.error, 100)}" for r in failed)
                + ")"
            )
        else:
            parts.append("largest trainable: no boundary found in the sizes searched")
        t = self.time_ratio()
        parts.append(
            f"step time {t:.2f}x ddp ({self.time_noise()})" if t is not None else "step time not measured"
        )
        text = "; ".join(parts)
        if not holds:
            text += ". " + self.why_not(world_size)
        return holds, text

    def why_not(self, world_size: int) -> str:
        """Why zero2's peak is above half of DDP's, from the two breakdowns: what a perfect ZeRO-2
        would reach given DDP's peak (replicated parameters and activations stay), and what
        zero2 holds beyond that ideal."""
        base, ours = self.memory.get(BASELINE), self.memory.get(OURS)
        bd = (base.mem_breakdown_bytes or {}) if base else {}
        total = sum(bd.values())
        if not total:
            return ""
        kept = sum(bd.get(k, 0) for k in ("params", "activations", "comm", "other"))
        ideal = (kept + (bd.get("grads", 0) + bd.get("optimizer", 0)) / world_size) / total
        act = (bd.get("activations", 0) + bd.get("other", 0)) / total
        text = (
            f"DDP's peak is {bd.get('params', 0) / total:.0%} parameters and {act:.0%} activations and "
            f"inputs, which ZeRO-2 does not shard: even a perfect ZeRO-2 would reach {ideal:.2f}x here"
        )
        peak = self.peak(OURS)
        if peak and ours and ours.mem_breakdown_bytes and peak / total > ideal + 0.02:
            extra = {k: v - bd.get(k, 0) for k, v in ours.mem_breakdown_bytes.items()}
            top = max(extra, key=lambda k: extra[k])
            text += f"; zero2 measured {peak / total:.2f}x, its largest excess over DDP being {top}"
            text += f" (+{extra[top] / 2**20:.0f} MiB)" if extra[top] > 0 else ""
        return text + "."

    def _failures(self) -> str:
        bad = [r for r in [*self.memory.values(), *self.max_size.values()] if r.status != "ok"]
        return "; ".join(f"{r.strategy}: {r.status} {first_line(r.error, 80)}" for r in bad) or "no records"


def _model_state_floor(peer: Record, base: Record | None) -> float | None:
    """The ZeRO formula's model states of ``peer``'s sharding over DDP's at its N (both
    predicted in their records): the lowest peak ratio the claim could measure if nothing but
    model states were in memory."""
    ours = (peer.predicted_mem_bytes or {}).get("total")
    theirs = ((base.predicted_mem_bytes if base else None) or {}).get("total")
    return ours / theirs if ours and theirs else None


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def run_claim(
    spec: ClaimSpec,
    *,
    out_dir: Path,
    run_id: str,
    workloads: tuple[str, ...] | None = None,
    progress: Callable[[str], None] = print,
    measured: dict[str, WorkloadResult] | None = None,
) -> list[WorkloadResult]:
    """Measure every workload of ``spec``; records go to ``out_dir/records.jsonl`` as they come.
    ``measured`` (``claim --resume``): results by variant label whose ok cells are kept, not
    measured again."""
    budget = parse_budget(spec.budget)
    results = []
    for w in spec.variants():
        if workloads and w.name not in workloads:
            continue
        res = WorkloadResult(w)
        have = (measured or {}).get(w.label) or WorkloadResult(w)
        base = CellConfig(
            workload=w.name,
            preset=w.preset,
            strategy=BASELINE,
            world_size=spec.world_size,
            batch_size=w.batch_size,
            # memory cells: one timed step (after warm-up) is enough, unless they are also the
            # step-time cells (no real ranks: timing_world_size 0)
            steps=1 if spec.timing_world_size else spec.steps,
            warmup=spec.warmup,
            device=spec.device,
            suite=f"claim-{spec.name}",
            simulate=True,
            activation_checkpointing=w.activation_checkpointing,
        )

        def record(cell: CellConfig, kept: dict[str, Record]) -> Record:
            if (r := kept.get(cell.strategy)) is not None and r.status == "ok":
                return r
            r = run_cell(cell, run_id=run_id)
            append_record(out_dir / "records.jsonl", r)
            label = f"{cell.workload}/{cell.preset} {cell.strategy} N={r.world_size}"
            progress(f"{label}: {r.status} ({r.wall_s:.0f}s)")
            return r

        for s in (BASELINE, OURS, *spec.further, *spec.peers):
            res.memory[s] = record(_with(base, strategy=s), have.memory)
        if spec.timing_world_size:
            for s in (BASELINE, OURS):
                real = _with(base, strategy=s, world_size=spec.timing_world_size, simulate=False)
                res.timing[s] = record(_with(real, steps=spec.steps, track_memory=False), have.timing)
        else:
            res.timing = {s: res.memory[s] for s in (BASELINE, OURS)}
        if spec.real_peers and spec.timing_world_size:
            for s in (BASELINE, OURS, *spec.real_peers):
                real = _with(base, strategy=s, world_size=spec.timing_world_size, simulate=False, steps=1)
                res.real_memory[s] = record(real, have.real_memory)
        plannable = not get_workload(w.name).not_plannable and spec.device == "cpu"
        for s in (BASELINE, OURS, *spec.further):
            if (kept := have.max_size.get(s)) is not None and kept.status == "ok":
                res.max_size[s] = kept
                continue
            probe = _with(base, strategy=s, fake=plannable, steps=1)
            res.max_size[s] = search(
                probe,
                known={w.preset: res.memory[s]},
                budget=budget,
                vary="params",
                ladder=w.ladder,
                out_dir=out_dir,
                run_id=run_id,
                progress=progress,
            )
        results.append(res)
    return results


def _with(cell: CellConfig, **changes: Any) -> CellConfig:
    return CellConfig(**{**cell.to_json(), **changes})


def write_claim_report(
    spec: ClaimSpec,
    results: list[WorkloadResult],
    out_dir: Path,
    wall_s: float | None,
    *,
    resumed: bool = False,
) -> Path:
    """``report.md``: the verdict per workload, the table of ratios, how it was measured, and the
    charts (written by the report builder from the same records)."""
    from shardbench.report.build import build_report

    report = build_report([out_dir], out_dir)
    lines = [
        f"# Does sharding halve per-rank memory or double the trainable model? ({spec.name})",
        "",
        spec.scale_note,
        "",
        f"Claim holds for a workload when zero2's per-rank peak <= {MEMORY_THRESHOLD}x DDP's, or its largest "
        f"trainable model within {spec.budget} per rank >= {SIZE_THRESHOLD:g}x DDP's. Memory: simulated "
        f"N={spec.world_size}, equal per-rank batch. "
        + (
            f"Step time: real ranks, N={spec.timing_world_size}."
            if spec.timing_world_size
            else "Step time: the simulated runs (compute only, no communication)."
        )
        + (
            f" {', '.join(spec.further)}: measured the same way to show how far sharding goes "
            "(its columns in the table); the verdict is zero2's."
            if spec.further
            else ""
        ),
        "",
        "## Verdicts",
        "",
    ]
    for r in results:
        holds, text = r.verdict(spec.world_size)
        w = r.workload
        ac = ", activation checkpointing" if w.activation_checkpointing else ""
        lines.append(f"- **{w.label}** ({w.preset}, batch {w.batch_size}{ac}): {_WORD[holds]} - {text}")
        for peer, peer_holds, peer_text in r.peer_verdicts():
            lines.append(f"  - {_PEER_LABELS.get(peer, peer)}: {_WORD[peer_holds]} - {peer_text}")
    lines += ["", "## Measurements", "", _table(spec, results), ""]
    if any(r.real_memory for r in results):
        lines += ["## Peers on real ranks", "", _PEERS_NOTE, "", _real_table(results), ""]
    lines += [
        "## How it was produced",
        "",
        _how(spec, wall_s, resumed) + "Records: `records.jsonl`; "
        "every cell: `table.md`; charts: `index.html`. Max-size probes: "
        + (
            "under --fake where the workload allows it (planning = real within 1%), real otherwise."
            if spec.device == "cpu"
            else "real, on an emulated card."
        ),
        "",
        "## Charts",
        "",
    ]
    lines += [f"![{p.stem}]({p.name})" for p in report.charts if p.suffix == ".png"]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _how(spec: ClaimSpec, wall_s: float | None, resumed: bool) -> str:
    command = f"`shardbench claim --spec {spec.name}`"
    if wall_s is None:
        return f"{command}, report rebuilt from records (`--from-records`). "
    if resumed:
        return f"{command}, completed by `--resume` (that part: {wall_s / 60:.1f} min wall). "
    return f"{command} ({wall_s / 60:.1f} min wall). "


def _table(spec: ClaimSpec, results: list[WorkloadResult]) -> str:
    """One row per workload variant: peaks, zero2's ratios (the verdict's), then each further
    stage's ratios (how far sharding goes); "-" where a cell was not measured."""
    gib = 2**30
    peaked = (BASELINE, OURS, *spec.further, *spec.peers)
    sized = (BASELINE, OURS, *spec.further)
    head = ["workload", "AC", "preset", "params (M)", *(f"{s} peak GiB" for s in peaked)]
    head += [f"{s}/ddp peak" for s in (OURS, *spec.further)]
    head += [f"{s} max params (M)" for s in sized]
    head += [f"{s}/ddp max-size" for s in (OURS, *spec.further)]
    head += ["zero2/ddp step time"]
    rows = []
    for r in results:
        base = r.memory.get(BASELINE)
        rows.append(
            [
                r.workload.name,
                "yes" if r.workload.activation_checkpointing else "no",
                r.workload.preset,
                f"{base.params / 1e6:.1f}" if base else "",
                *[_peak_cell(r, s, gib) for s in peaked],
                *[_fmt(r.peak_ratio(s)) if s in r.memory else "-" for s in (OURS, *spec.further)],
                *[_fit_cell(r, s) for s in sized],
                *[_fmt(r.size_ratio(s)[0]) if s in r.max_size else "-" for s in (OURS, *spec.further)],
                _fmt(r.time_ratio()) + (" (within noise)" if r.time_noise() == "within noise" else ""),
            ]
        )
    return markdown_table(head, rows)


_WORD = {True: "HOLDS", False: "DOES NOT HOLD", None: "NOT MEASURED"}
#: how a verdict line names a peer measured on real ranks
_PEER_LABELS = {
    "fairscale-zero2": "fairscale-zero2 (FairScale OSS + ShardedDataParallel: Lightning's ddp_sharded, "
    "the implementation the claim was made for)",
    "deepspeed-zero2": "deepspeed-zero2 (DeepSpeed ZeRO stage 2)",
}
_PEERS_NOTE = (
    "DeepSpeed and FairScale run their own communication, so they cannot be a simulated rank: "
    "they are measured on real ranks, beside ddp and our zero2 at the same N (memory tracked "
    "over two steps after warm-up). Each has its verdict line under its workload's."
)


def _real_table(results: list[WorkloadResult]) -> str:
    """Per workload and strategy measured on real ranks: peak, its ratio to ddp's, the model
    states held after a step against the ZeRO formula."""
    gib = 2**30
    head = ["workload", "AC", "N", "strategy", "peak GiB", "/ddp peak", "model states / formula"]
    rows = []
    for r in results:
        for s, rec in r.real_memory.items():
            held = (rec.model_state_bytes or {}).get("total")
            pred = (rec.predicted_mem_bytes or {}).get("total")
            peak = r.real_peak(s)
            rows.append(
                [
                    r.workload.name,
                    "yes" if r.workload.activation_checkpointing else "no",
                    str(rec.world_size),
                    s,
                    f"{peak / gib:.3f}" if peak else rec.status,
                    _fmt(r.real_peak_ratio(s)),
                    _fmt(held / pred if held and pred else None),
                ]
            )
    return markdown_table(head, rows)


def _peak_cell(r: WorkloadResult, strategy: str, gib: int) -> str:
    if strategy not in r.memory:
        return "-"
    peak = r.peak(strategy)
    return f"{peak / gib:.3f}" if peak else "failed"


def _fit_cell(r: WorkloadResult, strategy: str) -> str:
    if (m := r.max_size.get(strategy)) is None:
        return "-"
    fit = (m.max_size or {}).get("largest_fit")
    return f"{fit['params'] / 1e6:.1f}" if fit else "none"


def every_variant(spec: ClaimSpec, found: dict[str, WorkloadResult]) -> list[WorkloadResult]:
    """A result per variant of ``spec``, in report order, from those found by label; a variant
    without one is an empty result (reported as not measured)."""
    return [found.get(w.label) or WorkloadResult(w) for w in spec.variants()]


def claim(
    spec: ClaimSpec, *, out_dir: Path, workloads: tuple[str, ...] | None = None, resume: bool = False
) -> tuple[Path, list[WorkloadResult]]:
    """Run the claim into ``out_dir``; its ``report.md`` and the per-workload results. With
    ``resume``, the directory's ok cells are kept and only the others measured (a claim stopped
    part-way, or a spec that gained a strategy); the report then covers every variant."""
    start = time.perf_counter()
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-claim-{spec.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    old = out_dir / "records.jsonl"
    measured = None
    if resume and old.exists():
        from shardbench.records import read_records
        from shardbench.studies.claim_gate import results_from_records

        measured = {r.workload.label: r for r in results_from_records(spec, read_records([old]))}
    elif old.exists():  # a report describes one claim run; the previous one is kept aside, not lost
        old.rename(
            out_dir / f"records.{time.strftime('%Y%m%d-%H%M%S', time.localtime(old.stat().st_mtime))}.bak"
        )
    results = run_claim(spec, out_dir=out_dir, run_id=run_id, workloads=workloads, measured=measured)
    if measured:
        ran = {r.workload.label: r for r in results}
        results = every_variant(spec, {**measured, **ran})
    report = write_claim_report(spec, results, out_dir, time.perf_counter() - start, resumed=bool(measured))
    return report, results
