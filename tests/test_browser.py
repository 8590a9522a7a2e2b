"""The HTML pages in a real browser (headless Chromium): a smoke-like run's report and a plan's
page load without a console error, lead with their summary table, fit a 1400 px window (wide
tables scroll in their own box), link only files that exist, and show charts two per row at a
size whose text stays readable.

The records are made by hand (``tests/records.py``): no training, only the report is built.
Without Chromium on the PATH the tests skip, saying so; ``.ci/run`` installs it and sets
``SHARDBENCH_REQUIRE_BROWSER``, so there a missing browser fails instead of skipping.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from shardbench.records import Record, append_record
from shardbench.report.build import build_report
from shardbench.report.html import MIN_SCALE
from shardbench.report.plan_report import PLAN_JSON, plan_json
from shardbench.studies.plan import Plan, rows_from
from shardbench.studies.plan_reserve import ReservePolicy
from tests.browser import Browser, Page, find_chromium
from tests.records import make_record

#: one worker runs this module: its module-scoped browser starts once (pytest-xdist, loadgroup)
pytestmark = [pytest.mark.xdist_group("test_browser"), pytest.mark.charts]

WIDTH = 1400
MIB = 1 << 20
ENV = {"torch": "2.11.0+cpu", "python": "3.11.7", "host": "ci", "time": "2026-12-02T10:00:00+0000"}


@pytest.fixture(scope="module")
def browser():
    binary = find_chromium()
    if binary is None:
        why = "no chromium on the PATH (Debian: apt-get install chromium; .ci/run installs it)"
        if os.environ.get("SHARDBENCH_REQUIRE_BROWSER"):
            pytest.fail(why + ", and SHARDBENCH_REQUIRE_BROWSER is set")
        pytest.skip(why)
    with Browser(binary) as b:
        yield b


def _cell(workload: str, strategy: str, *, shard: int, step_ms: float, **overrides) -> Record:
    """A measured cell of a tiny model at N=2: ``shard`` 0 (ddp) to 3 (zero3) sets how much of
    the model states one rank holds, and so its peak and its bytes sent."""
    params, grads, optim = 4 * MIB, 4 * MIB, 8 * MIB
    params, grads, optim = (
        params // (2 if shard >= 3 else 1),
        grads // (2 if shard >= 2 else 1),
        optim // (2 if shard >= 1 else 1),
    )
    states = params + grads + optim
    breakdown = {"params": params, "grads": grads, "optimizer": optim, "activations": 6 * MIB, "comm": MIB}
    peak = sum(breakdown.values())
    sent = 4 * MIB * (3 if shard >= 3 else 2) // 2
    return make_record(
        workload=workload,
        strategy=strategy,
        params=MIB,
        peak_mem_bytes={
            "max": peak,
            "per_rank": [peak, peak - 4096],
            "source": "tracked tensors (MemTracker)",
        },
        mem_breakdown_bytes={**breakdown, "other": 0},
        model_state_bytes={
            "params": params,
            "grads": grads,
            "optimizer": optim,
            "total": states,
            "held": states,
        },
        predicted_mem_bytes={"total": states},
        step_time_s={"median": step_ms / 1e3, "mad": step_ms / 40e3, "n": 5},
        samples_per_s=16e3 / step_ms,
        comm_per_step={"sent_per_rank": sent, "ops": {}},
        predicted_comm={"sent_per_rank": sent, "ops": {}},
        **{"env": ENV, "run_id": "20261202-100000-smoke", "suite": "smoke", **overrides},
    )


def _smoke_records() -> list[Record]:
    records = []
    for workload, ms in (("transformer", 20.0), ("imagegpt", 35.0)):
        records += [
            _cell(workload, "ddp", shard=0, step_ms=ms),
            _cell(workload, "zero2", shard=2, step_ms=ms * 1.02),  # within the noise
            _cell(workload, "zero3", shard=3, step_ms=ms * 1.6),  # beyond it: one run does not judge it
        ]
    records.append(
        make_record(
            workload="imagegpt",
            strategy="zero1",
            status="timeout",
            error="cell exceeded its 300 s timeout <rank 1 stuck in all_gather>",
            env=ENV,
            run_id="20261202-100000-smoke",
            suite="smoke",
        )
    )
    return records


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("smoke")
    for r in _smoke_records():
        append_record(run / "records.jsonl", r)
    return build_report([run], run).index_html


@pytest.fixture(scope="module")
def plan_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan run's folder as ``plan`` leaves it (records and ``plan.json``), reported."""
    run = tmp_path_factory.mktemp("plan")
    plan = dict(suite="plan", simulated=True, fake=True, backend="fake", run_id="20261202-100000-plan")
    records = [
        _cell("transformer", s, shard=level, step_ms=1.0, **plan)
        for s, level in (("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3))
    ]
    records = [replace(r, step_time_s=None, samples_per_s=None) for r in records]  # fake: no time
    for r in records:
        append_record(run / "records.jsonl", r)
    budget = 20 * MIB  # ddp (20 MiB and more) does not fit; zero1 does
    rows = rows_from(records, budget, max_batch=False)
    plan = Plan(rows=tuple(rows), budget=budget, policy=ReservePolicy(device="cpu"), batch=8)
    title = "plan: transformer tiny, N=2, fp32, budget 20MiB per rank, batch 8 (fake)"
    (run / PLAN_JSON).write_text(json.dumps(plan_json(plan, title_text=title)))
    return build_report([run], run).index_html


def _problems(page: Page, where: Path) -> list[str]:
    """What a reader would hit: console errors, anything wider than the window, a link to a
    file that does not exist, a chart not loaded or shrunk below ``MIN_SCALE`` of its size."""
    p = page.probe
    out = [f"console: {e}" for e in page.errors]
    if p["page_width"] > p["viewport"]:
        out.append(f"the page is {p['page_width']} px wide in a {p['viewport']} px window")
    out += [f"wider than the window: {w}" for w in p["wide"]]
    for ref in p["links"]:
        url = urlparse(ref)
        if url.scheme in ("", "file") and not ref.startswith("#"):
            if not (where.parent / unquote(url.path)).is_file():
                out.append(f"links a missing file: {ref}")
    for img in p["images"]:
        if not img["loaded"]:
            out.append(f"image not loaded: {img['src']}")
        elif img["shown"] + 1 < MIN_SCALE * img["natural"]:
            out.append(f"{img['src']} shown at {img['shown']:.0f} of {img['natural']} px")
    return out


def test_the_checks_see_what_is_wrong(browser: Browser, tmp_path: Path) -> None:
    """A page with a script error, a missing image, a box wider than the window and a word
    that spills out of its heading fails every check: the checks of the real pages can fail."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><script>undefinedFunction()</script>"
        '<img src="missing.png"><div style="width: 2000px">wide</div>'
        f"<h2>{'hidden_size=2048:' * 40}</h2></body></html>"
    )
    problems = _problems(browser.open(page, width=WIDTH), page)
    assert any("undefinedFunction" in p for p in problems), problems
    assert any("missing.png" in p and "links a missing file" in p for p in problems), problems
    assert any(p.startswith("wider than the window: div") for p in problems), problems
    assert any(p.startswith("wider than the window: h2: its content") for p in problems), problems


def test_smoke_report_leads_with_the_summary_and_fits_the_window(
    browser: Browser, smoke_report: Path
) -> None:
    page = browser.open(smoke_report, width=WIDTH)
    assert _problems(page, smoke_report) == []
    p = page.probe
    assert p["first_table"] == {"id": "summary", "cls": "summary"} and p["first_table_before_charts"]
    heads = p["headings"]
    assert heads[0] == "Each strategy against ddp" and heads.index("Environment") == 1, heads
    assert not any("world size" in h for h in heads), "one N: no chart against N"
    text = p["text"]
    assert "1.02× within noise" in text and "1.60× one run: not judged" in text and "timeout" in text
    figures = p["figures"]
    rows = {f["top"] for f in figures}
    assert len(figures) == 6 and len(rows) < len(figures), "charts stand two per row at 1400 px"
    records_box = next(b for b in p["boxes"] if "records" in b["cls"])
    assert records_box["scroll"] > records_box["client"], "the records table scrolls in its own box"


def test_plan_page_leads_with_budget_reserve_and_recommendation(browser: Browser, plan_page: Path) -> None:
    page = browser.open(plan_page, width=WIDTH)
    assert _problems(page, plan_page) == []
    p = page.probe
    assert p["first_table"] == {"id": "plan", "cls": "summary"} and p["first_table_before_charts"]
    text = p["text"]
    lead = text[: text.index("strategy\tshards")]  # everything above the plan's table
    assert "budget per rank\n20.0 MiB" in lead and "reserve\n0" in lead and "recommended\nzero1" in lead
    assert "recommended: zero1" in lead


def test_compare_page_shows_every_note_within_the_window(browser: Browser, tmp_path: Path) -> None:
    """compare.html: regressions first, and the table, its note column included, fits the
    window: nothing to scroll to, nothing cut at its edge."""
    from shardbench.report.compare_report import write_comparison
    from shardbench.studies.compare import compare_runs

    base = [  # two repeats: a ratio of one pair is not judged, and no row would regress
        _cell(w, s, shard=i, step_ms=20.0, repeat=repeat)
        for w in ("transformer", "imagegpt")
        for i, s in enumerate(("ddp", "zero2"))
        for repeat in (0, 1)
    ]
    now = [
        replace(r, step_time_s={"median": 0.04, "mad": 0.0005, "n": 5}) if r.strategy == "zero2" else r
        for r in base
    ]
    paths = write_comparison(
        compare_runs(base, now), tmp_path, baseline="results/baselines/smoke", current=str(tmp_path)
    )
    page = browser.open(paths["html"], width=WIDTH)
    assert _problems(page, paths["html"]) == []
    (box,) = page.probe["boxes"]
    assert box["scroll"] <= box["client"], f"the table is {box['scroll']} px wide in a {box['client']} px box"
    assert page.probe["text"].index("regressed") < page.probe["text"].index("unchanged")
