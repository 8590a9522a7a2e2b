"""The claim's report (``report.md``): the verdict per workload, its table of ratios, the peers
measured on real ranks, how it was measured, and the charts; and the gate's section when it was
judged against a baseline. Rendering only: the verdicts come from ``studies.claim_result``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from shardbench.report.build import build_report
from shardbench.report.tables import markdown_table
from shardbench.studies.claim_gate import ClaimChange
from shardbench.studies.claim_result import (
    BASELINE,
    MEMORY_THRESHOLD,
    OURS,
    SIZE_THRESHOLD,
    WorkloadResult,
    ratio_text,
)
from shardbench.studies.claim_specs import ClaimSpec, claim_command
from shardbench.studies.maxsize import kept_reserve, parse_budget
from shardbench.units import in_unit, size_text, size_unit


def write_claim_report(
    spec: ClaimSpec,
    results: list[WorkloadResult],
    out_dir: Path,
    wall_s: float | None,
    *,
    resumed: bool = False,
) -> Path:
    """``report.md``: the verdict per workload, the table of ratios, how it was measured (the
    command that measures ``spec`` into ``out_dir``), and the charts (written by the report
    builder from the same records)."""
    report = build_report([out_dir], out_dir)
    lines = [
        f"# Does sharding halve per-rank memory or double the trainable model? ({spec.title})",
        "",
        spec.scale_note,
        "",
        _rule(spec, results),
        "",
        "## Verdicts",
        "",
        *_verdicts(spec, results),
    ]
    lines += ["", "## Measurements", "", _table(spec, results), ""]
    if any(r.real_memory for r in results):
        lines += ["## Peers on real ranks", "", _PEERS_NOTE, "", _real_table(results), ""]
    lines += [
        "## How it was produced",
        "",
        _how(claim_command(spec, out_dir), wall_s, resumed) + "Records: `records.jsonl`; "
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


def _rule(spec: ClaimSpec, results: list[WorkloadResult]) -> str:
    """When the claim holds, and how memory and step time were measured."""
    return (
        f"Claim holds for a workload when zero2's per-rank peak <= {MEMORY_THRESHOLD}x DDP's, or its largest "
        f"trainable model within {spec.budget} per rank >= {SIZE_THRESHOLD:g}x DDP's. Memory: simulated "
        f"N={spec.world_size}, {spec.precision}, equal per-rank batch. "
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
        )
        + _reserve_note(results)
    )


def _verdicts(spec: ClaimSpec, results: list[WorkloadResult]) -> list[str]:
    """One item per workload: its verdict, sharding's cost in throughput, and the peers'."""
    lines = []
    sharded = (OURS, *spec.further)
    for r in results:
        _, text = r.verdict(spec.world_size)
        w = r.workload
        ac = ", activation checkpointing" if w.activation_checkpointing else ""
        word = r.outcome(spec.world_size).upper()
        lines.append(f"- **{w.label}** ({w.preset}, batch {w.batch_size}{ac}): {word} - {text}")
        lines.append(
            f"  - sharding's cost in throughput, beside its saving in memory: {r.cost_line(sharded)}"
        )
        for peer, peer_holds, peer_text in r.peer_verdicts():
            lines.append(f"  - {_PEER_LABELS.get(peer, peer)}: {_WORD[peer_holds]} - {peer_text}")
    return lines


def _reserve_note(results: list[WorkloadResult]) -> str:
    """How the max-size searches judged a fit, from their records: with the reserve ``plan`` keeps
    beside each peak where one was counted (on CUDA), so the claim and ``plan`` agree."""
    counted: dict[str, str] = {}
    for r in results:
        for strategy, summary in r.max_size.items():
            reserve = kept_reserve(summary.max_size or {})
            if reserve.counted:
                parts = [f"{reserve.ratio - 1:.2%} of its peak"] if reserve.ratio > 1 else []
                parts += [size_text(reserve.fixed)] if reserve.fixed else []
                counted.setdefault(strategy, f"{strategy} {' + '.join(parts)}")
    if not counted:
        return ""
    return (
        " A model fits when its peak and the reserve `plan` keeps beside it are within the budget "
        f"({', '.join(counted.values())}; what each is made of: docs/measuring.md, and each "
        "search's record, `max_size.reserve`)."
    )


def _how(command: str, wall_s: float | None, resumed: bool) -> str:
    command = f"`{command}`"
    if wall_s is None:
        return f"{command}, report rebuilt from records (`--from-records`). "
    if resumed:
        return f"{command}, completed by `--resume` (that part: {wall_s / 60:.1f} min wall). "
    return f"{command} ({wall_s / 60:.1f} min wall). "


def _table(spec: ClaimSpec, results: list[WorkloadResult]) -> str:
    """One row per workload variant: peaks, zero2's ratios (the verdict's), then each further
    stage's ratios (how far sharding goes); "-" where a cell was not measured."""
    unit, label = size_unit(parse_budget(spec.budget))  # as the plan table: MiB under 1 GiB
    peaked = (BASELINE, OURS, *spec.further, *spec.peers)
    sized = (BASELINE, OURS, *spec.further)
    head = ["workload", "AC", "preset", "params (M)", *(f"{s} peak {label}" for s in peaked)]
    head += [f"{s}/{BASELINE} peak" for s in (OURS, *spec.further)]
    head += [f"{s} max params (M)" for s in sized]
    head += [f"{s}/{BASELINE} max-size" for s in (OURS, *spec.further)]
    head += [f"{OURS}/{BASELINE} step time"]
    rows = []
    for r in results:
        base = r.memory.get(BASELINE)
        rows.append(
            [
                r.workload.name,
                "yes" if r.workload.activation_checkpointing else "no",
                r.workload.preset,
                f"{base.params / 1e6:.1f}" if base else "",
                *[_peak_cell(r, s, unit) for s in peaked],
                *[ratio_text(r.peak_ratio(s)) if s in r.memory else "-" for s in (OURS, *spec.further)],
                *[_fit_cell(r, s) for s in sized],
                *[ratio_text(r.size_ratio(s)[0]) if s in r.max_size else "-" for s in (OURS, *spec.further)],
                ratio_text(r.time_ratio()) + (f" ({v.note()})" if (v := r.time_verdict()) else ""),
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
    peaks = [p for r in results for s in r.real_memory if (p := r.real_peak(s))]
    unit, label = size_unit(max(peaks, default=0))
    head = ["workload", "AC", "N", "strategy", f"peak {label}", f"/{BASELINE} peak", "model states / formula"]
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
                    in_unit(peak, unit, extra=1) if peak else rec.status,
                    ratio_text(r.real_peak_ratio(s)),
                    ratio_text(held / pred if held and pred else None),
                ]
            )
    return markdown_table(head, rows)


def _peak_cell(r: WorkloadResult, strategy: str, unit: int) -> str:
    if strategy not in r.memory:
        return "-"
    peak = r.peak(strategy)
    return in_unit(peak, unit, extra=1) if peak else "failed"


def _fit_cell(r: WorkloadResult, strategy: str) -> str:
    if (m := r.max_size.get(strategy)) is None:
        return "-"
    fit = (m.max_size or {}).get("largest_fit")
    return f"{fit['params'] / 1e6:.1f}" if fit else "none"


def gate_section(name: str, changes: Sequence[ClaimChange]) -> str:
    word = {True: "holds", False: "does not hold", None: "not measured"}
    lines = [f"## Against baseline `{name}`", ""]
    for c in changes:
        flag = " - REGRESSED" if c.regressed else ""
        before, now = c.before or word[c.held_before], c.now or word[c.holds_now]
        lines.append(f"- {c.workload}: {before} -> {now}{flag} ({c.moved})")
    return "\n".join(lines) + "\n"
