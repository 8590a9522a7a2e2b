"""The fork server imports what a run's forked ranks import at set-up (``launch.import_for``):
a strategy's ``rank_imports`` and a workload's, once per server instead of once per rank, and
nothing for a run that does not need it."""

from __future__ import annotations

import importlib.util

import pytest

from shardbench.harness import launch
from shardbench.harness.launch import PRELOAD, fork_server_preload, import_for
from shardbench.models.specs import rank_imports
from shardbench.strategies.registry import missing_packages, strategy_card, strategy_names


@pytest.fixture
def fresh_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose fork server has not been told about any cell yet."""
    monkeypatch.setattr(launch, "_IMPORTED_FOR_CELLS", [])


def test_a_run_without_such_strategies_starts_its_server_as_before(fresh_server, tiny_cell) -> None:
    import_for([tiny_cell(strategy=s) for s in ("ddp", "zero1", "zero2", "zero3", "fsdp2-zero3")])
    assert fork_server_preload() == PRELOAD


def test_each_strategy_and_workload_adds_its_imports_once_after_the_guard(fresh_server, tiny_cell) -> None:
    cells = [
        tiny_cell(strategy="deepspeed-zero2"),
        tiny_cell(strategy="deepspeed-zero3"),
        tiny_cell(strategy="torch-zero1"),
        tiny_cell(workload="lightning:pkg.module:Lit"),
    ]
    import_for(cells)
    import_for(cells)  # a run's cells, then each cell again as it starts
    expected = [
        *strategy_card("deepspeed-zero2").rank_imports,
        *strategy_card("torch-zero1").rank_imports,
        *rank_imports("lightning:pkg.module:Lit"),
    ]
    assert expected and fork_server_preload() == [*PRELOAD, *expected]
    # first: the server ends with its launcher
    assert fork_server_preload()[0] == "shardbench.harness.fork_server_guard"


def test_a_rank_that_is_execd_adds_nothing(fresh_server, tiny_cell) -> None:
    """A CUDA rank starts as a fresh interpreter: no fork server imports anything for it."""
    import_for([tiny_cell(strategy="deepspeed-zero2", device="cuda")])
    assert fork_server_preload() == PRELOAD


@pytest.mark.parametrize("name", strategy_names())
def test_a_strategys_rank_imports_are_modules_that_exist(name: str) -> None:
    """Where its packages are installed: a name that went stale would be skipped by the server
    without a word, and every rank would pay the import again."""
    if missing_packages(name):
        pytest.skip(f"{name} needs {missing_packages(name)}")
    for module in strategy_card(name).rank_imports:
        assert importlib.util.find_spec(module) is not None, module


def test_a_lightning_workloads_rank_imports_are_modules_that_exist() -> None:
    pytest.importorskip("lightning")
    assert rank_imports("lightning:a/b.py:Lit") and rank_imports("transformer") == ()
    for module in rank_imports("lightning:a/b.py:Lit"):
        assert importlib.util.find_spec(module) is not None, module


_SERVER_WITH_A_MODULE_THAT_RAISES = """
import sys
from shardbench.harness.launch import forkserver_context

def rank():
    # the server went on to the module after the one that raised
    sys.exit(0 if "fine_at_import" in sys.modules else 3)

if __name__ == "__main__":
    ctx = forkserver_context(["raises_at_import", "fine_at_import"])
    process = ctx.Process(target=rank)
    process.start()
    process.join(60)
    sys.exit(process.exitcode)
"""


def test_a_module_that_raises_at_import_leaves_the_fork_server_forking(tmp_path) -> None:
    """multiprocessing's own server stops at such a module, and every rank of the run with it:
    the guard imports each module on its own and leaves that one to the rank that needs it."""
    import subprocess
    import sys

    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('broken')\n")
    (tmp_path / "fine_at_import.py").write_text("")
    (tmp_path / "server.py").write_text(_SERVER_WITH_A_MODULE_THAT_RAISES)
    done = subprocess.run(
        [sys.executable, "server.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    left = "fork server: left raises_at_import to the ranks that need it: RuntimeError('broken')"
    assert left in done.stderr
