"""shardbench as a user installs it: the wheel, non-editable, in a fresh environment, run from
a directory of the user's own that has a ``models`` package of its own (shardbench installs
only ``shardbench``, so it shadows nothing)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.probes import seed_probes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("install")

USER_MODELS = {
    "models/__init__.py": "",
    "models/encoder.py": """
        from torch import nn


        class Encoder(nn.Module):
            def __init__(self, width: int = 32, depth: int = 2) -> None:
                super().__init__()
                self.blocks = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

            def forward(self, x):
                return self.blocks(x)
    """,
    "mynet.py": """
        from models.encoder import Encoder  # the user's own models package, not ours

        from shardbench import Input, ModelSpec


        def factory(width: int = 32, depth: int = 2) -> ModelSpec:
            return ModelSpec(build=lambda: Encoder(width, depth), inputs={"x": Input((width,))})
    """,
}


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")} if path.exists() else set()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed (not editable). Its dependencies (torch, ...)
    come from this environment's site-packages through a ``.pth`` line, so nothing is fetched."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"  # built from a copy: the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("bench", "models"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            wheels,
            source,
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("shardbench-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
    )
    return venv


def test_the_installed_package_runs_and_plans_from_a_users_directory(installed: Path, tmp_path: Path) -> None:
    user = tmp_path / "project"
    for name, text in USER_MODELS.items():
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        (user / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDBENCH_HOME")}
    # the probes a prediction reads, cached where the user's results go (./results): the run and
    # the plan predict over them instead of forking ranks to measure this machine's gloo
    seed_probes(user / "results")
    checkout_before = _tree(ROOT / "results")
    shardbench = installed / "bin" / "shardbench"

    where = subprocess.run(
        [installed / "bin" / "python", "-c", "import shardbench; print(shardbench.__file__)"],
        cwd=user, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(installed)), where.stdout  # the wheel, not the checkout

    run = subprocess.run(
        [shardbench, "run", "--workload", "transformer", "--preset", "tiny", "--strategy", "zero2",
         "--world-size", "2", "--steps", "1", "--warmup", "0"],
        cwd=user, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (records,) = (user / "results" / "runs").glob("*/records.jsonl")
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(r["strategy"], r["status"]) for r in lines] == [("zero2", "ok")]

    plan = subprocess.run(
        [shardbench, "plan", "--workload", "mynet.py:factory", "--world-size", "2", "--budget", "1GiB",
         "--strategy", "ddp,zero2"],
        cwd=user, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    assert "recommended" in plan.stdout

    written = _tree(user) - {name for n in USER_MODELS for name in _parents(n)}
    assert all(p == "results" or p.startswith("results/") or "__pycache__" in p for p in written), written
    assert _tree(ROOT / "results") == checkout_before  # nothing written into the checkout


def _parents(name: str) -> set[str]:
    parts = Path(name).parts
    return {str(Path(*parts[: i + 1])) for i in range(len(parts))}
