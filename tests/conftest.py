"""Shared test fixtures. Tests run on CPU with gloo; one thread per process keeps N ranks on
two cores from thrashing."""

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import shardbench
from shardbench.harness.config import CellConfig
from tests import cells
from tests.dist import close_shared_worlds
from tests.probes import seed_probes, stand_in_dtensor_update, stand_in_update_replay

torch.set_num_threads(1)

REPOSITORY = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """The tests test this checkout: an editable install made from another checkout would import
    *its* shardbench here, and every result would describe the wrong code without a sign."""
    imported = Path(shardbench.__file__).resolve()
    if not imported.is_relative_to(REPOSITORY):
        raise pytest.UsageError(
            f"shardbench is imported from {imported.parent}, not from the checkout under test "
            f"({REPOSITORY}): run 'bash scripts/setup.sh' in this checkout and use its .venv"
        )


@pytest.fixture
def tiny_cell() -> Callable[..., CellConfig]:
    """``tiny_cell(**overrides)``: a CellConfig of the tiny transformer (tests/cells.py)."""
    return cells.tiny_cell


@pytest.fixture(scope="session", autouse=True)
def _results_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A results home of the session's own: what the tests' cells cache there (this CPU's
    measured peak FLOP/s) never lands in the checkout's results/, and is measured once."""
    before = os.environ.get("SHARDBENCH_HOME")
    os.environ["SHARDBENCH_HOME"] = str(home := tmp_path_factory.mktemp("home"))
    seed_probes(home)
    yield
    if before is None:
        os.environ.pop("SHARDBENCH_HOME", None)
    else:
        os.environ["SHARDBENCH_HOME"] = before


@pytest.fixture(scope="session", autouse=True)
def _fork_servers_import_what_ranks_do() -> None:
    """Each test process's one fork server (the launcher's and tests.dist's) starts with what
    the ranks of any strategy or Lightning workload import at set-up, as a run of them all would
    (``launch.import_for``): the suite forks hundreds of ranks, and DeepSpeed's alone would each
    import torch's inductor again."""
    from shardbench.harness.launch import import_for
    from shardbench.strategies.registry import strategy_names

    import_for(cells.tiny_cell(strategy=name) for name in strategy_names())
    import_for([cells.tiny_cell(workload="lightning:tests.lightning_models:TinyLit")])


@pytest.fixture(scope="session", autouse=True)
def _stand_in_replays() -> Iterator[None]:
    """The probes keyed by a model's own tensors (its update's replay, its DTensor dispatch) are
    stand-ins in the tests' cells: each distinct model would start processes to measure them.
    The tests of those probes import them by name as they are collected, before this patch, so
    they call the real ones."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("shardbench.prediction.update_probe.replay", stand_in_update_replay)
        dtensor = "shardbench.prediction.dtensor_update_probe.probe_dtensor_update"
        patch.setattr(dtensor, stand_in_dtensor_update)
        yield


@pytest.fixture(scope="session", autouse=True)
def _shared_worlds() -> Iterator[None]:
    """The gloo worlds tests share (tests.dist.run_in_world) end with the session."""
    yield
    close_shared_worlds()


@pytest.fixture(scope="session")
def smoke_suite_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``shardbench run --suite smoke`` on this machine, once for the session: its exit code and
    folder. tests/test_job.py compares its jobs' runs with it, tests/test_run_end_to_end.py reads
    what it wrote; both modules share an xdist group, so one worker runs it once. Its report is
    written without charts (``charts_only_where_tested``: neither module reads them)."""
    from shardbench.cli import main
    from shardbench.report import build

    out = tmp_path_factory.mktemp("smoke")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "plot_all", lambda records, out_dir: {})
        return {"code": main(["run", "--suite", "smoke", "--out", str(out)]), "out": out}


@pytest.fixture(autouse=True)
def charts_only_where_tested(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reports are written without their charts except in tests marked ``charts`` (the report's
    and the browser's, where charts are checked): drawing a report's PNGs and SVGs costs seconds
    a command, and the other tests check what a command measures and writes beside them."""
    if request.node.get_closest_marker("charts") is None:
        from shardbench.report import build

        monkeypatch.setattr(build, "plot_all", lambda records, out_dir: {})
