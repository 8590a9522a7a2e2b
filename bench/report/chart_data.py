"""The report's charts as data: which records go in, and what value each bar or point takes.

One function per chart, each returning a list of ``Chart`` (one per workload or comparison group;
empty when the records hold nothing for it). ``chart_drawing.py`` draws them; tests assert on them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from shardbench.records import Record, strategy_label
from shardbench.report.chart_types import (
    GIB,
    Bar,
    Chart,
    Line,
    Panel,
    by_key,
    cell_title,
    cells,
    flag_notes,
    group_labels,
    mem_unit,
    preset_text,
    series_labels,
    slug,
    status_of,
    subtitle,
)
from shardbench.report.styles import line_marker, strategy_key
from shardbench.studies.maxsize import kept_reserve
from shardbench.studies.reference import REFERENCE
from shardbench.wording import count

BREAKDOWN_PARTS = ("params", "grads", "optimizer", "activations", "comm", "other")
#: the model states held after a step, stacked beside the peak's breakdown
HELD_PARTS = ("params", "grads", "optimizer")
#: world sizes a chart against N needs: a line through two points shows no scaling, only a
#: slope that reads as a trend (the summary table and the bar charts say what two N measured)
SCALING_MIN_N = 3


def _peak(r: Record) -> int | None:
    return (r.peak_mem_bytes or {}).get("max") if r.status == "ok" else None


def _predicted(r: Record) -> int | None:
    return (r.predicted_mem_bytes or {}).get("total")


def _source_note(records: Sequence[Record]) -> list[str]:
    sources = sorted({str(r.peak_mem_bytes.get("source")) for r in records if r.peak_mem_bytes})
    return [f"peak = the highest rank's peak; measured as {' / '.join(sources)}."] if sources else []


def _chart(
    kind: str,
    name: str,
    title: str,
    recs: Sequence[Record],
    panels: tuple[Panel, ...],
    notes: list[str],
    about: str = "",
) -> Chart:
    """``about``: a line that goes before the subtitle (a long preset, ``cell_title``)."""
    return Chart(kind, name, title, " · ".join(x for x in (about, subtitle(recs)) if x), panels, tuple(notes))


def memory_cells(records: Sequence[Record]) -> list[Record]:
    """Cells that measured memory: a timing-only cell (``track_memory`` off, e.g. the claim's
    real-rank step-time cells) finishes ok without a peak and has no place in a memory chart;
    a failed cell does, shown as failed."""
    return [r for r in cells(records) if not (r.status == "ok" and r.peak_mem_bytes is None)]


#: presets whose peaks span more than this ratio get a panel each (each in its own unit, on a
#: linear axis) rather than one log axis that mixes MiB and GiB bars
SPLIT_RANGE = 30


def _peak_panel(recs: Sequence[Record], title: str = "") -> Panel:
    unit, scale = mem_unit([_peak(r) for r in recs])
    bars, reference = [], {}
    for group, r in zip(group_labels(recs), recs, strict=True):
        peak = _peak(r)
        value = None if peak is None else peak / scale
        bars.append(Bar(group, strategy_label(r), value, status_of(r, value)))
        if r.strategy == REFERENCE and value is not None:
            reference[group] = value
    return Panel(ylabel=f"peak memory per rank ({unit})", bars=tuple(bars), reference=reference, title=title)


def peak_memory_charts(records: Sequence[Record]) -> list[Chart]:
    """(a) Per-rank peak memory, one bar per strategy, grouped by preset (and world size); a
    panel per preset when the presets' peaks are too far apart for one linear axis."""
    out = []
    for workload, recs in by_key(memory_cells(records), lambda r: r.workload):
        peaks = [p for p in (_peak(r) for r in recs) if p]
        by_preset = list(by_key(recs, lambda r: r.preset))
        if len(by_preset) > 1 and peaks and max(peaks) / min(peaks) > SPLIT_RANGE:
            panels = tuple(
                _peak_panel(rs, title=f"preset {preset_text(preset, 80)}") for preset, rs in by_preset
            )
        else:
            panels = (_peak_panel(recs),)
        title = f"{workload}: peak memory per rank by strategy"
        notes = [*_source_note(recs), *flag_notes(recs)]
        out.append(_chart("peak_memory", slug("peak_memory", workload), title, recs, panels, notes))
    return out


def breakdown_charts(records: Sequence[Record]) -> list[Chart]:
    """(b) What the peak rank held at its peak, stacked, beside the analytic model-state prediction.

    One chart per workload/preset: stacked segments cannot go on a log axis, and a tiny preset
    next to a base one would be a row of invisible bars.
    """
    out = []
    for (workload, preset), recs in by_key(memory_cells(records), lambda r: (r.workload, r.preset)):
        unit, scale = mem_unit([_peak(r) for r in recs] + [_predicted(r) for r in recs])
        bars = []
        for group, r in zip(group_labels(recs), recs, strict=True):
            bd = r.mem_breakdown_bytes if r.status == "ok" else None
            parts = {k: bd.get(k, 0) / scale for k in BREAKDOWN_PARTS} if bd else None
            total = None if parts is None else sum(parts.values())
            pred = _predicted(r)
            predicted = None if pred is None else pred / scale
            kept = r.model_state_bytes if r.status == "ok" else None
            held = {k: kept.get(k, 0) / scale for k in HELD_PARTS} if kept else None
            bars.append(
                Bar(
                    group,
                    strategy_label(r),
                    total,
                    status_of(r, total),
                    parts=parts,
                    predicted=predicted,
                    held_parts=held,
                )
            )
        panel = Panel(ylabel=f"memory at the peak ({unit})", bars=tuple(bars))
        notes = [
            "left: the peak rank at its peak; middle (hatched): the model states it holds after a "
            "step (zero2's gradient shards appear here: at its forward peak they do not exist yet); "
            "right (outline): the analytic ZeRO model states (params + grads + optimizer).",
            *flag_notes(recs),
        ]
        named, about = cell_title(workload, preset)
        title = f"{named}: memory breakdown vs prediction"
        name = slug("breakdown", workload, preset)
        out.append(_chart("breakdown", name, title, recs, (panel,), notes, about))
    return out


def step_time_charts(records: Sequence[Record]) -> list[Chart]:
    """(c) Step time (median, MAD error bars) and throughput; simulated and fake cells are left out."""
    out = []
    for workload, all_recs in by_key(cells(records), lambda r: r.workload):
        recs = [r for r in all_recs if not r.simulated and not r.fake]
        if not recs:
            continue
        times, rates = [], []
        for group, r in zip(group_labels(recs), recs, strict=True):
            t = (r.step_time_s or {}) if r.status == "ok" else {}
            ms = None if t.get("median") is None else t["median"] * 1e3
            mad = None if t.get("mad") is None else t["mad"] * 1e3
            times.append(Bar(group, strategy_label(r), ms, status_of(r, ms), err=mad))
            rate = r.samples_per_s if r.status == "ok" else None
            rates.append(Bar(group, strategy_label(r), rate, status_of(r, rate)))
        panels = (
            Panel(
                ylabel="step time (ms)", bars=tuple(times), title="step time: median of the measured steps"
            ),
            Panel(ylabel="throughput (samples/s)", bars=tuple(rates), title="throughput, all ranks together"),
        )
        notes = ["step time is the slowest rank's median; error bars are the median absolute deviation."]
        n_sim = sum(1 for r in all_recs if r.simulated)
        n_fake = sum(1 for r in all_recs if r.fake and not r.simulated)
        if n_sim:
            notes.append(f"{count(n_sim, 'simulated cell')} left out: their step time has no communication.")
        if n_fake:
            notes.append(f"{count(n_fake, 'fake (planned) cell')} left out: nothing ran.")
        title = f"{workload}: step time and throughput by strategy"
        out.append(_chart("step_time", slug("step_time", workload), title, recs, panels, notes))
    return out


def mfu_charts(records: Sequence[Record]) -> list[Chart]:
    """(g) MFU per strategy and cell, one chart per workload, where any cell has an MFU: model
    FLOPs per step over the median step time, against the peak each cell names (a simulated
    cell's would be its compute's alone, so only real ranks are drawn)."""
    out = []
    for workload, all_recs in by_key(cells(records), lambda r: r.workload):
        recs = [r for r in all_recs if not r.simulated and not r.fake]
        if not any(r.mfu is not None for r in recs):
            continue
        bars = tuple(
            Bar(group, strategy_label(r), pct, status_of(r, pct))
            for group, r in zip(group_labels(recs), recs, strict=True)
            for pct in [None if r.mfu is None or r.status != "ok" else r.mfu * 100]
        )
        panel = Panel(ylabel="MFU (%)", bars=bars, title="model FLOPs utilisation of one rank")
        kinds = sorted({str(p.get("kind")) for r in recs if (p := r.peak_flops_per_s) and r.mfu is not None})
        notes = [
            "MFU: one rank's model FLOPs per step (torch's FLOP formulas) over its median step time, "
            f"against the device's peak ({' / '.join(kinds)}; which peak: the table's peak columns).",
        ]
        if left := sum(1 for r in all_recs if r.simulated or r.fake):
            left_out = count(left, "simulated or fake cell")
            notes.append(f"{left_out} left out: their step time has no communication.")
        title = f"{workload}: MFU by strategy"
        out.append(_chart("mfu", slug("mfu", workload), title, recs, (panel,), notes))
    return out


def throughput_scaling_charts(records: Sequence[Record]) -> list[Chart]:
    """(h) Throughput (samples/s, all ranks) against world size, per workload/preset/precision/
    batch of real cells that include the run's N=1 cell of the reference strategy
    (``studies.scaling``), with ideal scaling drawn: N x the N=1 cell's samples/s. Every
    strategy's line starts at that one N=1 cell; a point is the median of its repeats."""
    from shardbench.studies.scaling import is_reference

    def key(r: Record) -> tuple:
        return (
            r.workload,
            r.preset,
            r.device,
            r.precision,
            r.batch_size_per_rank,
            r.activation_checkpointing,
        )

    out = []
    real = [r for r in cells(records) if not r.simulated and not r.fake]
    for (workload, preset, device, precision, batch, ac), recs in by_key(real, key):
        refs = [r.samples_per_s for r in recs if is_reference(r) and r.status == "ok" and r.samples_per_s]
        scaled = [r for r in recs if r.world_size > 1]
        if not refs or not scaled:
            continue
        one = statistics.median(refs)
        lines = []
        for strategy, rs in by_key(sorted(scaled, key=_line_order), strategy_label):
            points = [(1, one, "ok")]
            for n, at_n in by_key(rs, lambda r: r.world_size):
                rates = [r.samples_per_s for r in at_n if r.status == "ok" and r.samples_per_s]
                points.append((n, statistics.median(rates) if rates else None, _worst(at_n, rates)))
            x = tuple(n for n, _, _ in points)
            y = tuple(v for _, v, _ in points)
            status = tuple(s for *_, s in points)
            marker = line_marker(strategy)
            lines.append(Line(strategy, strategy, x, y, status, (False,) * len(x), marker=marker))
        xs = (1, *sorted({r.world_size for r in scaled}))
        ideal = tuple(n * one for n in xs)
        lines.append(Line("ideal", REFERENCE, xs, ideal, ("ok",) * len(xs), (False,) * len(xs), dashed=True))
        panel = Panel(
            ylabel="throughput (samples/s, all ranks)",
            lines=tuple(lines),
            xlabel="world size N (log2)",
            dashed_label=f"ideal scaling: N x {REFERENCE}'s N=1 samples/s",
        )
        notes = [
            f"solid: measured samples/s of all ranks (a point: the median of its repeats), every line from "
            f"{REFERENCE}'s N=1 cell of the run; dashed: ideal scaling, N times that cell's samples/s. "
            "Scaling efficiency is a point's height over the dashed line's at its N (the tables).",
            *flag_notes(recs),
        ]
        how = f"{precision}, batch {batch} per rank" + (", activation checkpointing" if ac else "")
        named, about = cell_title(workload, preset)
        title = f"{named}: throughput vs world size ({how})"
        name = slug(
            "throughput_scaling", workload, preset, device, precision, f"b{batch}", "ac" if ac else ""
        )
        out.append(_chart("throughput_scaling", name, title, recs, (panel,), notes, about))
    return out


def _worst(recs: Sequence[Record], rates: Sequence[float]) -> str:
    """A point's status: ok where a repeat measured it, else the first failed repeat's."""
    return "ok" if rates else next((r.status for r in recs if r.status != "ok"), "no data")


def max_size_charts(records: Sequence[Record]) -> list[Chart]:
    """(d) Largest trainable size against world size, from max-size summary records."""
    summaries = sorted((r for r in records if isinstance(r.max_size, dict)), key=_line_order)

    def key(r: Record) -> tuple:
        # not split by how a probe measured (real, simulated, --fake): the claim measures ddp
        # and zero2 on different paths, and "double the model" needs both on one chart
        ms = r.max_size or {}
        return (r.workload, ms.get("vary"), ms.get("budget_bytes"), r.device, r.precision)

    out: list[Chart] = []
    names: set[str] = set()
    for (workload, vary, budget, device, precision), recs in by_key(summaries, key):
        field_, scale, ylabel = _max_size_axis(vary, recs)
        lines = [_max_size_line(series, rs, field_, scale) for series, rs in by_key(recs, _series_key(recs))]
        fits_by = " / ".join(sorted({str((r.max_size or {}).get("fits_by")) for r in recs}))
        budget_text = "?" if budget is None else f"{budget / GIB:g} GiB"
        reserved = any(kept_reserve(r.max_size or {}).counted for r in recs)
        counted = ", counting the reserve plan keeps beside each peak" if reserved else ""
        notes = [
            f"fits by {fits_by}{counted}; the pale bar above a point reaches the smallest size that failed.",
            *flag_notes(recs),
        ]
        what = "model" if vary == "params" else "batch"
        title = f"{workload}: largest trainable {what} per rank in {budget_text}"
        panel = Panel(ylabel=ylabel, lines=tuple(lines), xlabel="world size N (log2)")
        name = slug("max_size", workload, vary, budget)
        if name in names:  # the same search on another device or precision: its own file
            name = slug("max_size", workload, vary, budget, device, precision)
        names.add(name)
        out.append(_chart("max_size", name, title, recs, (panel,), notes))
    return out


def _max_size_line(series: str, rs: Sequence[Record], field_: str, scale: float) -> Line:
    ys, ups, status = [], [], []
    for r in rs:
        ms = r.max_size or {}
        fit, fail = ms.get("largest_fit"), ms.get("smallest_fail")
        y = fit.get(field_) if r.status == "ok" and fit else None
        up = fail.get(field_) if fail else None
        ys.append(None if y is None else y / scale)
        ups.append(None if up is None else up / scale)
        status.append(r.status if r.status != "ok" else ("ok" if y is not None else "nothing fits"))
    x = tuple(r.world_size for r in rs)
    hollow = tuple(r.simulated or r.fake for r in rs)
    marker = "^" if rs[0].activation_checkpointing else "o"
    return Line(series, rs[0].strategy, x, tuple(ys), tuple(status), hollow, upper=tuple(ups), marker=marker)


def _max_size_axis(vary: str | None, recs: Sequence[Record]) -> tuple[str, float, str]:
    if vary != "params":
        return "batch_size", 1, "largest batch per rank (samples)"
    sizes = [((r.max_size or {}).get("largest_fit") or {}).get("params") or 0 for r in recs]
    if max(sizes) >= 1e9:
        return "params", 1e9, "largest model (B parameters)"
    return "params", 1e6, "largest model (M parameters)"


def _series_key(recs: Sequence[Record]) -> Callable[[Record], str]:
    labels = dict(zip(map(id, recs), series_labels(recs), strict=True))
    return lambda r: labels[id(r)]


def _line_order(r: Record) -> tuple:
    return (strategy_key(r.strategy), r.world_size, r.simulated, r.run_id)


def memory_scaling_charts(records: Sequence[Record]) -> list[Chart]:
    """(e) Memory per rank against world size, measured and predicted, per workload/preset
    measured at ``SCALING_MIN_N`` or more world sizes."""

    def key(r: Record) -> tuple:
        flags = (r.fake, r.activation_checkpointing)
        return (r.workload, r.preset, r.device, r.precision, r.batch_size_per_rank, *flags)

    out = []
    for (workload, preset, device, precision, batch, fake, ac), recs in by_key(memory_cells(records), key):
        if len({r.world_size for r in recs}) < SCALING_MIN_N:
            continue
        recs = sorted(recs, key=_line_order)
        unit, scale = mem_unit([_peak(r) for r in recs] + [_predicted(r) for r in recs])
        lines = []
        for series, rs in by_key(recs, _series_key(recs)):
            lines.extend(_scaling_lines(series, rs, scale))
        panel = Panel(ylabel=f"memory per rank ({unit})", lines=tuple(lines), xlabel="world size N (log2)")
        notes = [
            "solid: measured peak of the highest rank; dashed: predicted model states (params+grads+optim).",
            *_source_note(recs),
            *flag_notes(recs),
        ]
        how = f"{precision}, batch {batch} per rank" + (", activation checkpointing" if ac else "")
        named, about = cell_title(workload, preset)
        title = f"{named}: memory per rank vs world size ({how})"
        name = slug(
            "memory_scaling",
            workload,
            preset,
            device,
            precision,
            f"b{batch}",
            "fake" if fake else "",
            "ac" if ac else "",
        )
        out.append(_chart("memory_scaling", name, title, recs, (panel,), notes, about))
    return out


def _scaling_lines(series: str, rs: Sequence[Record], scale: float) -> list[Line]:
    """The measured line (failed points kept, valueless) and, where known, the predicted one."""
    hollow = tuple(r.simulated or r.fake for r in rs)
    peaks = [_peak(r) for r in rs]
    ys = tuple(None if p is None else p / scale for p in peaks)
    status = tuple(status_of(r, y) for r, y in zip(rs, ys, strict=True))
    marker = line_marker(strategy_label(rs[0]))
    lines = [Line(series, rs[0].strategy, tuple(r.world_size for r in rs), ys, status, hollow, marker=marker)]
    pts = [(r, p) for r in rs if (p := _predicted(r)) is not None]
    if pts:
        x = tuple(r.world_size for r, _ in pts)
        y = tuple(p / scale for _, p in pts)
        h = tuple(r.simulated or r.fake for r, _ in pts)
        lines.append(Line(series, rs[0].strategy, x, y, ("ok",) * len(pts), h, dashed=True, marker=marker))
    return lines


def _sent(r: Record, field_: str = "comm_per_step") -> int | None:
    return (getattr(r, field_) or {}).get("sent_per_rank") if r.status == "ok" else None


def comm_scaling_charts(records: Sequence[Record]) -> list[Chart]:
    """(f) Bytes each rank sends per step against world size, measured and as ZeRO's accounting
    predicts them, per workload/preset/precision measured at ``SCALING_MIN_N`` or more world
    sizes: what sharding costs on the wire. Batch size, activation checkpointing and whether a
    world was real, simulated or fake do not change what a step communicates, so a real N=2 and
    a fake N=1024 sit on one line; where a cell was measured both ways, the real ranks' count is
    drawn."""

    def key(r: Record) -> tuple:
        return (r.workload, r.preset, r.precision)

    def realest(r: Record) -> tuple:
        return (r.fake, r.simulated, r.activation_checkpointing, r.run_id)

    out = []
    counted = [r for r in memory_cells(records) if r.comm_per_step is not None or r.status != "ok"]
    for (workload, preset, precision), recs in by_key(counted, key):
        if len({r.world_size for r in recs}) < SCALING_MIN_N or not any(_sent(r) for r in recs):
            continue
        one = {}
        for r in sorted(recs, key=realest, reverse=True):  # the realest record of each point wins
            one[(strategy_label(r), r.world_size)] = r
        recs = sorted(one.values(), key=_line_order)
        unit, scale = mem_unit([_sent(r) for r in recs] + [_sent(r, "predicted_comm") for r in recs])
        lines = []
        for strategy, rs in by_key(recs, strategy_label):
            ys = tuple(None if (s := _sent(r)) is None else s / scale for r in rs)
            hollow = tuple(r.simulated or r.fake for r in rs)
            status = tuple(status_of(r, y) for r, y in zip(rs, ys, strict=True))
            marker, x = line_marker(strategy), tuple(r.world_size for r in rs)
            lines.append(Line(strategy, strategy, x, ys, status, hollow, marker=marker))
            pts = [(r, p) for r in rs if (p := _sent(r, "predicted_comm")) is not None]
            if pts:
                x, y = tuple(r.world_size for r, _ in pts), tuple(p / scale for _, p in pts)
                h = tuple(r.simulated or r.fake for r, _ in pts)
                done = ("ok",) * len(pts)
                lines.append(Line(strategy, strategy, x, y, done, h, dashed=True, marker=marker))
        panel = Panel(
            ylabel=f"sent per rank per step ({unit})",
            lines=tuple(lines),
            xlabel="world size N (log2)",
            predicted="ZeRO's accounting",
        )
        notes = [
            "solid: counted collectives of one steady step (a ring's bytes per rank); dashed: ZeRO's "
            "accounting for the strategy, precision and backend (DDP 2(N-1)/N x the gradients; "
            "ZeRO-1/2 that again split into a reduce-scatter and a parameter all-gather; ZeRO-3 one "
            "more gather). On gloo our zero2/zero3 all-reduce each bucket in place (gloo's "
            "reduce-scatter is slower), which sends 3(N-1)/N x the model instead of 2(N-1)/N.",
            *_coinciding(lines),
            *flag_notes(recs),
        ]
        named, about = cell_title(workload, preset)
        title = f"{named}: communication per rank per step vs world size ({precision})"
        name = slug("comm_scaling", workload, preset, precision)
        out.append(_chart("comm_scaling", name, title, recs, (panel,), notes, about))
    return out


def _coinciding(lines: list[Line]) -> list[str]:
    """A note naming the measured lines that lie on one another (within 0.5% at every point), so
    a strategy hidden under another is not read as missing."""
    groups: list[list[Line]] = []
    for line in (x for x in lines if not x.dashed):
        for group in groups:
            first = group[0]
            if first.x == line.x and all(
                a is not None and b is not None and abs(a - b) <= 0.005 * max(a, b)
                for a, b in zip(first.y, line.y, strict=True)
            ):
                group.append(line)
                break
        else:
            groups.append([line])
    same = [" = ".join(x.series for x in g) for g in groups if len(g) > 1]
    return [f"lines on one another (the same bytes at every N shown): {'; '.join(same)}."] if same else []


ALL_CHARTS: dict[str, Callable[[Sequence[Record]], list[Chart]]] = {
    "peak_memory": peak_memory_charts,
    "breakdown": breakdown_charts,
    "step_time": step_time_charts,
    "memory_scaling": memory_scaling_charts,
    "comm_scaling": comm_scaling_charts,
    "max_size": max_size_charts,
    "mfu": mfu_charts,
    "throughput_scaling": throughput_scaling_charts,
}
