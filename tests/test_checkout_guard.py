"""The suite refuses, in one line and before any test, to test a shardbench imported from outside
the checkout it belongs to (an editable install made from another checkout)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def _pytest(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "tests/test_checkout_guard.py",
         "-k", "no_test_matches_this"],
        cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=120,
    )


def test_another_checkouts_shardbench_is_refused_in_one_line(tmp_path: Path) -> None:
    other = tmp_path / "other-checkout"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPOSITORY / "bench", other / "shardbench", ignore=skip)
    shutil.copytree(REPOSITORY / "models", other / "shardbench" / "models", ignore=skip)
    done = _pytest({"PYTHONPATH": str(other)})
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 4, done.stdout + done.stderr
    assert lines == [
        f"ERROR: shardbench is imported from {other / 'shardbench'}, not from the checkout under test "
        f"({REPOSITORY}): run 'bash scripts/setup.sh' in this checkout and use its .venv"
    ]

