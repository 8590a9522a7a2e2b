"""The report layer: table, charts and index.html built from records only; failed cells stay visible.

Runs on the committed sample (results/samples: real records, one of them a timeout) and on small
variations of it; no training happens here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shardbench.records import Record, read_records
from shardbench.report import chart_drawing
from shardbench.report.build import build_report
from shardbench.report.chart_data import (
    ALL_CHARTS,
    breakdown_charts,
    max_size_charts,
    memory_scaling_charts,
    peak_memory_charts,
    step_time_charts,
)
from shardbench.report.chart_types import GIB, MIB
from shardbench.report.styles import FALLBACK_COLORS, legend_label, strategy_color, strategy_key
from shardbench.report.tables import markdown_table, records_to_frame, write_tables

#: one worker runs this module: its module-scoped fixture runs once (pytest-xdist, loadgroup)
pytestmark = pytest.mark.xdist_group("test_report")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "results" / "samples"
PLOTS = (
    chart_drawing.plot_peak_memory,
    chart_drawing.plot_breakdown,
    chart_drawing.plot_step_time,
    chart_drawing.plot_max_size,
    chart_drawing.plot_memory_scaling,
)


@pytest.fixture(scope="module")
def samples() -> list[Record]:
    return read_records([SAMPLES])


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    return build_report([SAMPLES], tmp_path_factory.mktemp("report"))


def _failed(records: list[Record]) -> list[Record]:
    return [r for r in records if r.status != "ok"]


def _bars(charts):
    return [b for c in charts for p in c.panels for b in p.bars]


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs.update(v for k, v in attrs if k in ("src", "href") and v)


def test_sample_is_small_real_and_holds_a_failure(samples: list[Record]) -> None:
    assert 0 < len(samples) <= 30
    assert _failed(samples), "the sample must keep a failed cell for the charts to show"
    assert len({r.run_id for r in samples}) > 1 and any(r.simulated for r in samples)
    assert all(r.env.get("torch") and r.env.get("time") for r in samples)


@pytest.mark.charts
def test_report_from_samples(report, samples: list[Record]) -> None:
    for path in (report.table_md, report.table_csv, report.index_html, *report.charts):
        assert path.is_file() and path.stat().st_size > 0, path
    assert {p.suffix for p in report.charts} == {".png", ".svg"}
    assert len(report.table_csv.read_text().strip().splitlines()) == 1 + len(samples)
    assert len(report.table_md.read_text().strip().splitlines()) == 2 + len(samples)
    page = report.index_html.read_text()
    refs = _Refs()
    refs.feed(page)
    assert {p.name for p in report.charts} <= refs.refs, "every chart file is on the page"
    assert all((report.index_html.parent / ref).is_file() for ref in refs.refs), "no dangling reference"
    kinds = {p.name.split("-")[0] for p in report.charts}
    assert {"peak_memory", "breakdown", "step_time", "memory_scaling"} <= kinds
    assert "max_size" in kinds  # the sample holds four max-size searches
    for r in samples:
        assert r.run_id in page and f"git {r.env['git_sha'][:7]}" in page  # the short sha
    assert "timeout" in page and "2.11.0+cu130" in page


@pytest.mark.charts  # the drawing is not stubbed here: leaving it out is the flag's own doing
def test_a_report_without_charts_says_how_to_draw_them(tmp_path: Path) -> None:
    result = build_report([SAMPLES], tmp_path, charts=False)
    assert result.charts == [] and not [p for p in tmp_path.iterdir() if p.suffix in (".png", ".svg")]
    said = f"Charts not drawn (--no-charts); shardbench report {tmp_path} draws them"
    assert said in result.index_html.read_text()
    assert result.table_md.is_file() and result.records > 0


def test_xdist_keeps_this_module_on_one_worker(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` every test of this module carries its group in its node id,
    so they all go to one worker and the module's fixtures run once; pytest 9.2 broke that
    silently (pytest-dev/pytest-xdist#1386; pyproject.toml pins pytest below it)."""
    if not getattr(request.config.option, "loadgroup", False):  # set on xdist's workers
        pytest.skip("not under pytest-xdist's loadgroup: nothing is distributed")
    assert request.node.nodeid.endswith("@test_report"), request.node.nodeid


def test_index_escapes_record_text(tmp_path: Path, samples: list[Record]) -> None:
    bad = dataclasses.replace(_failed(samples)[0], error="<script>alert(1)</script> & <b>")
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text(json.dumps(bad.to_json()) + "\n")
    page = build_report([run], tmp_path / "out").index_html.read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;" in page


def test_chart_functions_on_empty_input(tmp_path: Path) -> None:
    out = tmp_path / "charts"
    for plot in PLOTS:
        assert plot([], out) == []
    assert not out.exists()
    assert all(build([]) == [] for build in ALL_CHARTS.values())
    assert write_tables([], tmp_path) == "(no records)\n"


def test_strategy_the_registry_does_not_know_still_renders(tmp_path: Path, samples: list[Record]) -> None:
    """Old records may name a strategy that no longer exists: it sorts last, in a fallback colour."""
    old = [dataclasses.replace(r, strategy="ddp_v0") if r.strategy == "ddp" else r for r in samples]
    assert strategy_key("ddp_v0") > strategy_key("fsdp2-zero3") > strategy_key("zero2") > strategy_key("ddp")
    assert strategy_color("ddp_v0") in FALLBACK_COLORS and strategy_color("ddp") not in FALLBACK_COLORS
    assert legend_label("ddp_v0", "ddp_v0") == "ddp_v0" and legend_label("zero2", "zero2") == "zero2 (ours)"
    charts = peak_memory_charts(old)
    assert any(b.series == "ddp_v0" for b in _bars(charts))
    assert not any(c.panels[0].reference for c in charts), "no reference line without the reference strategy"
    assert chart_drawing.plot_peak_memory(old, tmp_path)


def test_markdown_table_from_rows() -> None:
    table = markdown_table(["a", "b"], [["x|y", 1.23456], [None, 2943.0]])
    assert table == "| a | b |\n|---|---|\n| x\\|y | 1.23 |\n|  | 2943 |"


def test_failed_cell_alone_is_shown_not_dropped(tmp_path: Path, samples: list[Record]) -> None:
    failed = _failed(samples)
    for build in (peak_memory_charts, breakdown_charts, step_time_charts):
        bars = _bars(build(failed))
        assert bars and all(b.value is None and b.status == "timeout" for b in bars), build.__name__
    written = chart_drawing.plot_peak_memory(failed, tmp_path)
    assert sorted(p.suffix for p in written) == [".png", ".svg"] and all(p.is_file() for p in written)


def test_failed_cell_stands_beside_the_same_cell_from_another_run(samples: list[Record]) -> None:
    tiny = [r for r in samples if r.preset == "tiny"]
    (chart,) = peak_memory_charts(tiny)
    ddp = [b for b in chart.panels[0].bars if b.series == "ddp"]
    assert sorted(b.status for b in ddp) == ["ok", "timeout"]
    assert len({b.group for b in ddp}) == 2, "two runs of one cell are two groups, not one overwriting"
    assert all(r.run_id in {b.group.split("\n")[-1] for b in ddp} for r in tiny if r.strategy == "ddp")
    assert memory_scaling_charts(tiny) == []  # N=1 and 2 only: no chart against N
    four = [replace(r, world_size=4, requested_world_size=4, run_id="n4") for r in tiny if r.status == "ok"]
    (scaling,) = memory_scaling_charts(tiny + four)
    measured = [line for line in scaling.panels[0].lines if not line.dashed and line.strategy == "ddp"]
    assert sorted(s for line in measured for s in line.status) == ["ok", "ok", "timeout"]


def test_ok_record_without_measurements_is_no_data(tmp_path: Path, samples: list[Record]) -> None:
    """No step time: "no data" in the time chart. No memory: a timing-only cell, not in memory
    charts at all (a failed cell is, as failed)."""
    r = dataclasses.replace(
        samples[0], peak_mem_bytes=None, mem_breakdown_bytes=None, step_time_s=None, samples_per_s=None
    )
    assert [b.status for b in _bars(step_time_charts([r]))] in (["no data"], ["no data", "no data"])
    assert _bars(peak_memory_charts([r])) == [] and _bars(breakdown_charts([r])) == []
    assert sum(len(v) for v in chart_drawing.plot_all([r], tmp_path).values()) > 0


def test_bars_carry_the_recorded_values(samples: list[Record]) -> None:
    (chart,) = peak_memory_charts(samples)
    # tiny (MiB) and base (GiB) are >30x apart: a panel each, each in its own unit, no log axis
    panels = {p.title: p for p in chart.panels}
    assert set(panels) == {"preset tiny", "preset base"}
    assert panels["preset base"].ylabel.endswith("(GiB)") and panels["preset tiny"].ylabel.endswith("(MiB)")
    scale = {title: GIB if p.ylabel.endswith("(GiB)") else MIB for title, p in panels.items()}
    ok = [r for r in samples if r.status == "ok" and r.max_size is None]
    drawn = [b.value * scale[t] for t, p in panels.items() for b in p.bars if b.value is not None]
    assert sorted(drawn) == pytest.approx(sorted(r.peak_mem_bytes["max"] for r in ok), rel=1e-12)
    ddp_n4 = next(r for r in ok if r.strategy == "ddp" and r.world_size == 4 and not r.simulated)
    reference = panels["preset base"].reference["base N=4"] * GIB  # within a panel only N varies
    assert reference == pytest.approx(ddp_n4.peak_mem_bytes["max"], rel=1e-12)
    tiny = [c for c in breakdown_charts(samples) if c.name.endswith("tiny")][0]
    dp = next(b for b in tiny.panels[0].bars if b.series == "dp")
    dp_rec = next(r for r in samples if r.strategy == "dp")
    assert dp.parts["optimizer"] * MIB == dp_rec.mem_breakdown_bytes["optimizer"]
    assert dp.predicted * MIB == dp_rec.predicted_mem_bytes["total"]


def test_simulated_cells_are_left_out_of_time_charts(samples: list[Record]) -> None:
    (chart,) = step_time_charts(samples)
    assert not any("simulated" in b.group for b in _bars([chart]))
    assert any("6 simulated cells left out" in n for n in chart.notes)
    simulated = [r for r in samples if r.simulated]
    assert step_time_charts(simulated) == [] and peak_memory_charts(simulated)
    assert "simulated" in peak_memory_charts(simulated)[0].subtitle


def test_memory_scaling_needs_three_world_sizes(samples: list[Record]) -> None:
    names = [c.name for c in memory_scaling_charts(samples)]
    assert "memory_scaling-transformer-base-cpu-fp32-b2" in names
    assert memory_scaling_charts([r for r in samples if r.world_size == 4]) == []
    assert memory_scaling_charts([r for r in samples if r.world_size in (2, 4)]) == []
    base = next(c for c in memory_scaling_charts(samples) if "base" in c.name)
    zero2 = [line for line in base.panels[0].lines if line.series == "zero2"]
    assert {line.dashed for line in zero2} == {False, True} and zero2[0].x == (2, 4, 8)
    assert zero2[0].hollow == (False, False, True)  # N=8 is simulated


def _summary(base: Record, strategy: str, n: int, fit: int | None, fail: int) -> Record:
    r = dataclasses.replace(base, suite="max-size", strategy=strategy, world_size=n, status="ok")
    r.max_size = {  # type: ignore[attr-defined]
        "vary": "params",
        "budget_bytes": 16 * GIB,
        "fits_by": "tracked peak",
        "largest_fit": None
        if fit is None
        else {"preset": "a", "batch_size": 2, "params": fit, "peak_bytes": 1},
        "smallest_fail": {
            "preset": "b",
            "batch_size": 2,
            "params": fail,
            "peak_bytes": None,
            "status": "oom",
        },
        "probes": 4,
    }
    return r


def test_max_size_chart_from_summary_records(tmp_path: Path, samples: list[Record]) -> None:
    samples = [r for r in samples if r.max_size is None]
    assert max_size_charts(samples) == []
    base = samples[0]
    summaries = [
        _summary(base, "ddp", 2, 110_000_000, 150_000_000),
        _summary(base, "ddp", 4, None, 60_000_000),
        _summary(base, "zero2", 2, 200_000_000, 260_000_000),
        _summary(base, "zero2", 4, 300_000_000, 350_000_000),
    ]
    (chart,) = max_size_charts([*samples, *summaries])
    lines = {line.series: line for line in chart.panels[0].lines}
    assert (
        lines["zero2"].x == (2, 4)
        and lines["zero2"].y == (200.0, 300.0)
        and lines["zero2"].upper == (260, 350)
    )
    assert lines["ddp"].y == (110.0, None) and lines["ddp"].status == ("ok", "nothing fits")
    assert "16 GiB" in chart.title
    assert [p.suffix for p in chart_drawing.plot_max_size(summaries, tmp_path)] == [".png", ".svg"]
    frame = records_to_frame(summaries)
    assert list(frame.note) == [s.note for s in summaries]  # the search's answer line
    # summaries describe searches, not cells: no bar or point of their own in the cell charts
    assert len(_bars(peak_memory_charts([*samples, *summaries]))) == len(samples)


def test_every_measured_strategy_is_on_its_max_size_chart(samples: list[Record]) -> None:
    """The claim measures ddp's search on a simulated world and zero2's under --fake: both
    belong on the one chart "double the model" is read from, each with its bound."""
    base = [r for r in samples if r.max_size is None][0]
    ddp = replace(_summary(base, "ddp", 8, 100_000_000, 130_000_000), simulated=True, fake=False)
    zero2 = replace(_summary(base, "zero2", 8, 250_000_000, 260_000_000), simulated=True, fake=True)
    (chart,) = max_size_charts([ddp, zero2])
    lines = {line.series: line for line in chart.panels[0].lines}
    assert set(lines) == {"ddp", "zero2"}
    assert lines["ddp"].upper == (130,) and lines["zero2"].upper == (260,)
    bf16 = replace(zero2, precision="bf16")
    names = [c.name for c in max_size_charts([ddp, zero2, bf16])]
    assert len(names) == len(set(names)) == 2  # another precision: its own file, not an overwrite


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.mkdir(parents=True)
    (path / "records.jsonl").write_text("".join(lines))
    return path


def test_merging_two_runs(tmp_path: Path) -> None:
    lines = (SAMPLES / "records.jsonl").read_text().splitlines(keepends=True)
    a = _write_lines(tmp_path / "a", lines[:12])
    b = _write_lines(tmp_path / "b", lines[12:])
    merged = build_report([a, b], tmp_path / "merged")
    rows = merged.table_csv.read_text().strip().splitlines()
    assert len(rows) == 1 + len(lines) and rows[0].startswith("run_id,")
    single = build_report([a], tmp_path / "single")
    rows = single.table_csv.read_text().strip().splitlines()
    assert len(rows) == 1 + 12 and "run_id" not in rows[0]
    assert build_report([a, a / "records.jsonl"], tmp_path / "twice").table_csv.read_text() == (
        single.table_csv.read_text()
    ), "the same run given twice counts once"


def test_missing_or_empty_input_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    with pytest.raises(ValueError, match=f"{missing} does not exist"):
        build_report([missing], tmp_path / "out")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="empty_dir has no records.jsonl"):
        build_report([SAMPLES, tmp_path / "empty_dir"], tmp_path / "out")
    blank = _write_lines(tmp_path / "blank", [])
    with pytest.raises(ValueError, match="holds no records"):
        build_report([blank], tmp_path / "out")
    with pytest.raises(ValueError, match="no input"):
        build_report([], tmp_path / "out")


def test_notebook_is_committed_with_its_outputs_and_runs_headless_from_a_copy(tmp_path) -> None:
    """Committed with outputs (it reads on GitHub), its sections in order, and the headless
    command of its first cell (``jupyter nbconvert --execute``), run on a copy from another
    directory given SHARDBENCH_RECORDS, reproduces them: no error, the same text, as many
    charts, and nothing written beside the notebook."""
    nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e .[dev])")
    jupyter = Path(sys.executable).with_name("jupyter")
    if not jupyter.is_file() or importlib.util.find_spec("nbconvert") is None:
        pytest.skip("jupyter nbconvert not installed (pip install -e .[dev])")
    from scripts.refresh_notebook import NOTEBOOK

    def texts_and_images(nb) -> tuple[list[str], int]:
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"]
        texts = [o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs]
        texts = [re.sub(r"run\(s\): \[.*\]", "run(s)", "".join(t)) for t in texts]  # where they were read
        return texts, sum("image/png" in o.get("data", {}) for o in outputs)

    committed = nbformat.read(NOTEBOOK, as_version=4)
    headings = [c.source.splitlines()[0] for c in committed.cells if c.cell_type == "markdown"]
    lettered = [h.split(")")[0].split("(")[-1] for h in headings if h.startswith("## (")]
    assert lettered == sorted(lettered), "sections (a), (b), ... in order"
    assert (
        "shardbench report" in committed.cells[0].source and "jupyter nbconvert" in committed.cells[0].source
    )
    texts, images = texts_and_images(committed)
    assert images >= 4, "peak memory, breakdown, step time and scaling charts stored inline"
    assert any(f"{len(read_records([SAMPLES]))} records" in t for t in texts)

    copy, elsewhere, out = tmp_path / "copy", tmp_path / "elsewhere", tmp_path / "out"
    for d in (copy, elsewhere):
        d.mkdir()
    shutil.copy(NOTEBOOK, copy / NOTEBOOK.name)
    beside = sorted(NOTEBOOK.parent.iterdir())
    cmd = [str(jupyter), "nbconvert", "--to", "notebook", "--execute", str(copy / NOTEBOOK.name)]
    env = {**os.environ, "SHARDBENCH_RECORDS": str(SAMPLES)}
    done = subprocess.run(
        [*cmd, "--output-dir", str(out)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    again_texts, again_images = texts_and_images(nbformat.read(out / NOTEBOOK.name, as_version=4))
    assert again_texts == texts and again_images == images, "stale outputs: run scripts/refresh_notebook.py"
    assert sorted(NOTEBOOK.parent.iterdir()) == beside and sorted(p.name for p in copy.iterdir()) == [
        NOTEBOOK.name
    ]


def test_timing_only_cells_stay_out_of_memory_charts(samples: list[Record]) -> None:
    """An ok record without a peak (a timing-only cell) is not a failed memory cell."""
    timing_only = dataclasses.replace(samples[0], peak_mem_bytes=None, mem_breakdown_bytes=None, run_id="t")
    assert len(_bars(peak_memory_charts([*samples, timing_only]))) == len(_bars(peak_memory_charts(samples)))
