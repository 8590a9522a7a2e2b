"""``shardbench trend``: a nightly history read back as series, drawn, and summarised in trend.html.

The history is synthetic: three cells over five nights, written out of order, with a regressed
night, a cell that fails on the last night, a cell that appears on night 3 (no baseline), a
cell that never has a step time, and a line that is not a history line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shardbench.cli import main
from shardbench.report.trend_charts import draw_metric
from shardbench.studies.compare import compare_runs
from shardbench.studies.history import history_lines as history_lines_of
from shardbench.studies.trend import EVERY_METRIC_SCHEMA, alarms, last_night, read_history, series, unrecorded
from tests.records import make_record

MIB = 2**20
A, B, NEW = (
    "transformer/tiny/ddp/n2/fp32/b4/cpu",
    "transformer/tiny/zero2/n2/fp32/b4/cpu",
    "swav/tiny/ddp/n2/fp32/b2/cpu",
)


def metric(value: float | None, base: float | None, *, unit: str, verdict: str = "unchanged") -> dict:
    band = (None, None) if base is None else (base * 0.99, base * 1.01)
    return {
        "value": value,
        "baseline": base,
        "low": band[0],
        "high": band[1],
        "verdict": verdict,
        "unit": unit,
    }


def line(
    night: int,
    cell: str,
    *,
    mem: float | None,
    t: float | None = None,
    status: str = "ok",
    verdict: str = "unchanged",
    mem_verdict: str = "unchanged",
    base: float | None = 100 * MIB,
) -> dict:
    day = f"202612{night:02d}"
    metrics = {"peak_mem_bytes": metric(mem, base, unit="bytes", verdict=mem_verdict)}
    if t is not None or status != "ok":
        metrics["step_time_s"] = metric(t, None if base is None else 0.010, unit="s")
    return {
        "schema": 1, "suite": "nightly-cpu", "run_id": f"{day}-150000-nightly-cpu-{day}-ab12",
        "name": f"nightly-cpu-{day}", "time": f"2026-12-{night:02d}T15:00:00+0000", "git_sha": None,
        "baseline": "nightly-cpu", "cell": cell, "status": status, "verdict": verdict, "metrics": metrics,
    }  # fmt: skip


def history_lines() -> list[dict]:
    lines = []
    for night in (5, 1, 2, 3, 4):  # appended out of order: the series must sort by time
        regressed = night == 4
        lines.append(line(night, A, mem=(110 if regressed else 100) * MIB, t=0.010,
                          verdict="regressed" if regressed else "unchanged",
                          mem_verdict="regressed" if regressed else "unchanged"))  # fmt: skip
        if night == 5:
            lines.append(line(night, B, mem=None, status="oom", verdict="now failing"))
        else:
            lines.append(line(night, B, mem=60 * MIB))  # too few timed steps: no step_time_s
        if night >= 3:
            lines.append(line(night, NEW, mem=30 * MIB, t=0.020, verdict="new", mem_verdict="new", base=None))
    return lines


@pytest.fixture
def history_file(tmp_path: Path) -> Path:
    path = tmp_path / "history" / "nightly-cpu.jsonl"
    path.parent.mkdir()
    text = [json.dumps(x) for x in history_lines()]
    text.insert(2, '{"suite": "nightly-cpu", "cell": "x"')  # truncated: not JSON
    text.insert(4, json.dumps({"suite": "nightly-cpu", "cell": "no time"}))
    path.write_text("\n".join(text) + "\n\n")
    return path


def test_bad_lines_are_named_and_skipped(history_file: Path) -> None:
    with pytest.warns(UserWarning) as caught:
        history = read_history(history_file)
    assert len(history) == len(history_lines())
    messages = [str(w.message) for w in caught]
    assert f"{history_file}:3: not a history line (invalid JSON" in messages[0]
    assert f"{history_file}:5: not a history line (missing or empty field(s) time)" in messages[1]
    assert len(messages) == 2


def test_series_per_cell_and_metric_sorted_by_time(history_file: Path) -> None:
    with pytest.warns(UserWarning):
        s = series(read_history(history_file))
    # known metrics first, then cells in order; B never timed a step, so it has no step-time series
    assert list(s) == [(NEW, "peak_mem_bytes"), (A, "peak_mem_bytes"), (B, "peak_mem_bytes"),
                       (NEW, "step_time_s"), (A, "step_time_s"), (B, "step_time_s")]  # fmt: skip
    a = s[(A, "peak_mem_bytes")]
    assert a.times == tuple(datetime(2026, 12, d, 15, tzinfo=UTC) for d in (1, 2, 3, 4, 5))
    assert a.values == (100 * MIB, 100 * MIB, 100 * MIB, 110 * MIB, 100 * MIB)
    assert a.verdicts == ("unchanged", "unchanged", "unchanged", "regressed", "unchanged")
    assert a.baselines == (100 * MIB,) * 5 and a.lows[0] == pytest.approx(99 * MIB)
    assert a.runs[0] == "nightly-cpu-20261201" and a.unit == "bytes"
    # the failed night stays in the series, valueless, with the cell's status and verdict
    b = s[(B, "peak_mem_bytes")]
    assert b.values[-1] is None and b.statuses[-1] == "oom" and b.cell_verdicts[-1] == "now failing"
    assert s[(B, "step_time_s")].values == (None,) * 5  # absent before, null on the failed night
    new = s[(NEW, "peak_mem_bytes")]
    assert len(new.times) == 3 and new.baselines == (None,) * 3 and new.verdicts == ("new",) * 3


def test_last_night_alarms(history_file: Path) -> None:
    with pytest.warns(UserWarning):
        history = read_history(history_file)
    last = last_night(history)
    assert [x["cell"] for x in last] == [NEW, A, B] and {x["name"] for x in last} == {"nightly-cpu-20261205"}
    assert [(x["cell"], m) for x, m in alarms(last)] == [(B, None)]
    night4 = [x for x in history if x["name"] == "nightly-cpu-20261204"]
    assert [(x["cell"], m) for x, m in alarms(night4)] == [(A, "peak_mem_bytes")]


def test_chart_has_a_panel_per_cell_and_marks(history_file: Path) -> None:
    with pytest.warns(UserWarning):
        s = series(read_history(history_file))
    fig = draw_metric("peak_mem_bytes", [v for (_, m), v in s.items() if m == "peak_mem_bytes"], suite="x")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title(loc="left") for ax in panels] == [NEW, A, f"{B}  (last night: now failing)"]
    regressed = [ln for ln in panels[1].lines if ln.get_marker() == "X"]
    assert len(regressed) == 1 and list(regressed[0].get_ydata()) == [110.0]  # MiB
    value_line = next(ln for ln in panels[1].lines if ln.get_marker() == "o")
    assert list(value_line.get_ydata()) == [100.0, 100.0, 100.0, 110.0, 100.0]
    failing = [ln for ln in panels[2].lines if ln.get_marker() == "^"]
    assert len(failing) == 1 and [t.get_text() for t in panels[2].texts] == ["oom"]
    assert panels[0].get_ylabel() == "MiB" and fig.texts[0].get_text().startswith(
        "peak_mem_bytes (MiB) per cell, x: 3 cells"
    )
    # the new cell has no baseline: its dashed line is all gaps, and no band is drawn
    assert not panels[0].patches and all(math.isnan(y) for y in panels[0].lines[0].get_ydata())


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        self._in_td = tag == "td"

    def handle_endtag(self, tag: str) -> None:
        self._in_td = False

    def handle_data(self, data: str) -> None:
        if self._in_td:
            self.cells.append(data)


def test_cli_writes_page_and_one_png_per_metric(history_file: Path, capsys) -> None:
    assert main(["trend", str(history_file)]) == 0
    out = history_file.parent / "trend-nightly-cpu"
    captured = capsys.readouterr()
    assert captured.err.count("warning: ") == 2 and f"open {out / 'trend.html'}" in captured.out
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["trend-peak_mem_bytes.png", "trend-step_time_s.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = _Page()
    page.feed((out / "trend.html").read_text())
    assert sorted(page.images) == pngs
    assert "Last night: nightly-cpu-20261205" in (out / "trend.html").read_text()
    assert page.cells[:3] == [B, "oom", "now failing"]  # the last night's only alarm


def test_cli_lists_a_regressed_metric_with_numbers(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in history_lines() if x["time"] < "2026-12-05"))
    assert main(["trend", str(path), "--out", str(tmp_path / "o")]) == 0
    page = _Page()
    page.feed((tmp_path / "o" / "trend.html").read_text())
    assert page.cells == [
        A,
        "ok",
        "regressed",
        "peak_mem_bytes",
        "110 MiB",
        "100 MiB",
        "99 – 101 MiB",
        "+10.0%",
    ]


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "does not exist"),
        ("", "holds no valid history line"),
        ("[1, 2]\n", "holds no valid history line"),
        (json.dumps(line(1, A, mem=1.0)), "exists and is not a directory"),  # --out is a file
    ],
)
def test_cli_bad_input_exits_2(tmp_path: Path, capsys, content: str | None, needle: str) -> None:
    path = tmp_path / "h.jsonl"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "out"
    if "directory" in needle:
        out.write_text("a file\n")
    assert main(["trend", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1] and err[-1].startswith("shardbench trend: error: ")
    assert not out.exists() or out.is_file()  # nothing created


def test_cli_import_stays_light() -> None:
    """``shardbench`` starts without matplotlib or torch; ``trend`` imports what it draws with,
    and a report imports matplotlib only when it draws a chart (``run --no-charts`` never does)."""
    code = (
        "import sys, shardbench.cli; print(sorted({'matplotlib', 'torch', 'pandas'} & set(sys.modules)));"
        "import shardbench.report.build; print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "False"]


NO_BAND = {"low": None, "high": None}


def _gate_line(night: int, *, schema: int, metrics: dict, dedicated: bool | None = None) -> dict:
    out = line(night, B, mem=60 * MIB)
    out["schema"] = schema
    out["metrics"] = {**out["metrics"], **metrics}
    if dedicated is not None:
        out["dedicated"] = dedicated
    return out


def test_only_what_the_gate_gates_has_a_band_and_a_verdict() -> None:
    """Absolute step time is gated on a dedicated runner only: an older shardbench's lines
    (schema 1, which say nothing of the runner) carry a band and verdicts for it, which the chart
    leaves out, as it does on a shared runner's night; a dedicated runner's night keeps both.
    Memory keeps its band, and a ratio of one run ("not judged") has none."""
    history = [
        _gate_line(1, schema=1, metrics={"step_time_s": metric(0.012, 0.010, unit="s", verdict="regressed")}),
        _gate_line(2, schema=2, dedicated=False, metrics={
            "step_time_s": {**metric(0.011, 0.010, unit="s", verdict="not gated"), **NO_BAND},
            "step_time_vs_ddp": {**metric(2.0, 1.1, unit="x", verdict="not judged"), **NO_BAND},
        }),
        _gate_line(3, schema=2, dedicated=True, metrics={
            "step_time_s": metric(0.010, 0.010, unit="s"),
            "step_time_vs_ddp": metric(1.1, 1.1, unit="x"),
        }),
    ]  # fmt: skip
    s = series(history)
    time = s[(B, "step_time_s")]
    assert time.gated == (False, False, True) and time.verdicts == ("not gated", "not gated", "unchanged")
    assert time.lows == (None, None, pytest.approx(0.0099)) and time.highs[:2] == (None, None)
    ratio = s[(B, "step_time_vs_ddp")]
    assert ratio.gated == (False, False, True) and ratio.recorded == (False, True, True)
    assert ratio.lows[:2] == (None, None) and ratio.lows[2] == pytest.approx(1.089)
    assert s[(B, "peak_mem_bytes")].gated == (True, True, True)
    # a shared runner's (or an older shardbench's) nights only: no band, no mark, and the title says why
    shared = series(history[:2])
    fig = draw_metric("step_time_s", [shared[(B, "step_time_s")]], suite="x")
    (panel,) = [ax for ax in fig.axes if ax.get_visible()]
    assert not [ln for ln in panel.lines if ln.get_marker() == "X"] and panel.get_title(loc="left") == B
    title = " ".join(fig.texts[0].get_text().split())
    assert "reported, not gated (absolute time drifts between runs on a shared runner" in title
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("band" in x for x in labels) and "regressed" not in labels
    mem = draw_metric("peak_mem_bytes", [shared[(B, "peak_mem_bytes")]], suite="x")
    legend = [t.get_text() for t in mem.legends[0].get_texts()]
    assert "the gate's band (outside: improved / regressed)" in legend
    assert "not gated" not in mem.texts[0].get_text()
    # the night whose line does not hold the ratio is marked so, not as the cell's verdict
    drawn = draw_metric("step_time_vs_ddp", [ratio], suite="x")
    (panel,) = [ax for ax in drawn.axes if ax.get_visible()]
    assert [t.get_text() for t in panel.texts] == ["not recorded"]


def test_gated_metrics_no_night_holds_are_named(tmp_path: Path, capsys) -> None:
    """The committed nightly-cpu history comes from an older shardbench: it holds neither the
    step-time ratio nor bytes sent, which the gate gates. The page and the command say so; a
    night written by ``nightly`` now holds both, and a history of such nights is not told off
    for cells that have none."""
    committed = Path(__file__).resolve().parents[1] / "results" / "history" / "nightly-cpu.jsonl"
    nights = read_history(committed)
    held = {m for x in nights for m in x["metrics"]}
    assert {"comm_sent_bytes", "step_time_vs_ddp"} <= held | set(unrecorded(nights))
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in history_lines()))
    assert main(["trend", str(path), "--out", str(tmp_path / "o")]) == 0
    said = "comm_sent_bytes and step_time_vs_ddp, which the gate gates; no night of this history records them"
    assert said in capsys.readouterr().out
    page = (tmp_path / "o" / "trend.html").read_text()
    assert 'id="unrecorded">Not charted: model_state_bytes, held_after_step_bytes, comm_sent_bytes' in page
    assert 'id="older"' in page
    assert "trend-step_time_s.png; reported, not gated" in page
    # what nightly writes now
    records = [
        make_record(strategy=s, repeat=i, step_time_s={"median": ms / 1e3, "mad": 1e-4, "n": 20}, steps=20,
                    peak_mem_bytes={"max": MIB, "per_rank": [MIB, MIB]}, comm_per_step={"sent_per_rank": 10})
        for s, ms in (("ddp", 100), ("zero2", 110))
        for i in (0, 1)
    ]  # fmt: skip
    lines = history_lines_of(compare_runs(records, records), suite="s", run_id="r", name="n", baseline="b",
                             git_sha=None)  # fmt: skip
    zero2 = next(x for x in lines if "/zero2/" in x["cell"])
    assert {"comm_sent_bytes", "step_time_vs_ddp"} <= set(zero2["metrics"])
    assert zero2["schema"] >= EVERY_METRIC_SCHEMA and zero2["dedicated"] is False
    assert unrecorded([{**x, "metrics": {}} for x in lines]) == []
