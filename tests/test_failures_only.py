"""An artefact built from records that all failed says so: a baseline of them is refused (every
night would pass against it), and a report, a comparison or a claim of them warns in one line."""

from __future__ import annotations

import json
from pathlib import Path

from shardbench.cli import main
from shardbench.records import none_ok
from tests.records import make_record


def _failed(path: Path, statuses: tuple[str, ...] = ("error", "oom")) -> Path:
    records = [make_record(strategy=s, status=st) for s, st in zip(("ddp", "zero2"), statuses, strict=True)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_none_ok_names_what_the_records_are_instead() -> None:
    assert none_ok([make_record(status="error"), make_record(status="timeout")]) == (
        "2 records, none ok: 1 error, 1 timeout"
    )
    assert none_ok([make_record(status="error"), make_record()]) is None
    # a max-size search that found nothing fits answered: its oom is a result, not a failure
    assert none_ok([make_record(status="oom", suite="max-size", max_size={"vary": "params"})]) is None


def test_a_baseline_of_failed_cells_is_refused(tmp_path: Path, capsys) -> None:
    run = _failed(tmp_path / "run" / "records.jsonl").parent
    root = tmp_path / "home"
    assert main(["baseline", "save", str(run), "--as", "x", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "2 records, none ok: 1 error, 1 oom; a baseline of failed cells" in err
    assert not list(root.rglob("x.*"))


def test_report_and_compare_of_failed_cells_warn(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    run = _failed(tmp_path / "run" / "records.jsonl").parent
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1
    assert "shardbench report: warning: 2 records, none ok: 1 error, 1 oom; the table and charts" in err
    # failed against failed reads "unchanged" and exits 0: the warning is what tells
    assert main(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")]) == 0
    err = capsys.readouterr().err
    assert "warning: the baseline: 2 records, none ok" in err
    assert "warning: the current run: 2 records, none ok" in err


def test_a_claim_of_failed_cells_warns(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("shardbench.report.build.plot_all", lambda records, out_dir: {})
    out = _failed(tmp_path / "claim" / "records.jsonl").parent
    assert main(["claim", "--spec", "tiny", "--out", str(out), "--from-records"]) == 0
    err = capsys.readouterr().err
    assert "shardbench claim: warning: 2 records, none ok: 1 error, 1 oom; the report has no measured" in err
