"""A probe measured on a busy machine is provisional: the next lookup on a quiet one measures again
and keeps the quiet figure; a quiet figure stays whatever runs beside it later."""

from __future__ import annotations

from pathlib import Path

from shardbench.prediction import probe_cache


def _measure(value: float):
    calls = []

    def measure() -> dict:
        calls.append(value)
        return {"flops_per_s": value}

    return measure, calls


def test_a_busy_figure_is_replaced_by_a_quiet_one_and_a_quiet_one_stays(tmp_path: Path) -> None:
    busy, busy_calls = _measure(1.0)
    first = probe_cache.cached("gemm", "k", busy, tmp_path, load=lambda: 3.0)
    assert first["flops_per_s"] == 1.0 and probe_cache.busy(first)
    again, again_calls = _measure(2.0)
    assert probe_cache.cached("gemm", "k", again, tmp_path, load=lambda: 1.5)["flops_per_s"] == 1.0
    assert again_calls == []  # still busy: nothing better to measure now
    quiet, _ = _measure(4.0)
    kept = probe_cache.cached("gemm", "k", quiet, tmp_path, load=lambda: 0.2)
    assert kept["flops_per_s"] == 4.0 and not probe_cache.busy(kept) and kept["load_per_core"] == 0.2
    later, later_calls = _measure(0.5)
    for load in (0.1, 5.0):
        entry = probe_cache.cached("gemm", "k", later, tmp_path, load=lambda load=load: load)
        assert entry["flops_per_s"] == 4.0
    assert later_calls == [] and busy_calls == [1.0]


def test_an_unknown_load_counts_as_quiet(tmp_path: Path) -> None:
    measure, _ = _measure(3.0)
    entry = probe_cache.cached("gemm", "k", measure, tmp_path, load=lambda: None)
    assert not probe_cache.busy(entry)


def test_remeasure_drops_every_cached_probe(tmp_path: Path) -> None:
    measure, _ = _measure(3.0)
    probe_cache.cached("gemm", "k", measure, tmp_path, load=lambda: None)
    probe_cache.cached("network", "k", measure, tmp_path, load=lambda: None)
    assert [p.name for p in probe_cache.forget_all(tmp_path)] == ["gemm.json", "network.json"]
    assert probe_cache.read("gemm", tmp_path) == {}


def test_env_remeasure_drops_the_cache_and_says_what(tmp_path: Path, monkeypatch, capsys) -> None:
    """``shardbench env --remeasure`` in a results home of its own (the session's stand-ins stay)."""
    from shardbench.cli import main

    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    measure, _ = _measure(3.0)
    probe_cache.cached("update", "k", measure, tmp_path, load=lambda: None)
    assert main(["env", "--remeasure"]) == 0
    assert f"dropped {tmp_path / 'peaks' / 'update.json'}" in capsys.readouterr().err
    assert probe_cache.read("update", tmp_path) == {}
    (entry,) = probe_cache.read("measured", tmp_path).values()  # the peak, measured again now
    assert "load_per_core" in entry and entry["measured_at"]


def test_an_entry_cached_without_its_load_is_provisional() -> None:
    """Cached before loads were recorded: it may have been measured busy, so a quiet lookup
    measures again; a load this machine could not read stays quiet."""
    assert probe_cache.busy({"flops_per_s": 1.0})
    assert not probe_cache.busy({"flops_per_s": 1.0, "load_per_core": None})


def test_env_shows_every_cached_probe_with_when_and_how_it_was_measured(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """What the step-time model's probes cache (a gloo profile, an update rate, a compute
    replay), each with its figures, when and under what load, its lists left out."""
    import json

    import torch

    from shardbench.cli import main
    from shardbench.prediction.op_calls import OpCall, describe
    from tests.probes import plain_probes

    monkeypatch.setenv("SHARDBENCH_HOME", str(tmp_path))
    probes = plain_probes(tmp_path)
    probes.gloo_profile(2, 1, "cpu-x", "2.x")
    probes.update_rate(1, 1000, 1, "cpu-x", "2.x")
    call = OpCall("aten.add.Tensor", describe((torch.ones(4), torch.ones(4))), {}, 3, 16)
    probes.replayed_compute([call], 1, 1, "cpu-x", "2.x")
    assert main(["env"]) == 0
    shown = json.loads(capsys.readouterr().out)["probes"]
    (network,) = shown["network"].values()
    (update,) = shown["update"].values()
    (compute,) = shown["compute"].values()
    assert network["kinds"]["all_reduce"]["latency_s"] == 1e-4 and update["seconds_per_element"] == 1e-8
    assert compute["seconds"] > 0 and "seconds_per_copy" not in compute  # a list: left out
    for entry in (network, update, compute):
        assert "load_per_core" in entry and entry["measured_at"]
