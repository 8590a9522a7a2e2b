"""SIGINT and SIGTERM during a run: the cell in flight is recorded as ``interrupted``, no rank
survives, the exit code is 130/143, and the line says how to resume (what ``--resume`` then
runs, with the run's name and tags, is tested in-process: tests/test_safe_files.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardbench.records import read_records
from tests.procs import alive, descendants, worker_processes

ROOT = Path(__file__).resolve().parents[1]
# cell 1 (ddp) runs normally; cell 2 (zero2) hangs on rank 1, so the signal lands inside it
ARGS = "run --workload transformer --preset tiny --strategy ddp,zero2 --world-size 2".split()
ARGS += ["--steps", "2", "--warmup", "0"]
ARGS += ["--batch-size", "2", "--timeout", "300", "--no-charts"]  # the report's charts are not what is tested


@pytest.fixture
def cell_tmp() -> Iterator[Path]:
    """The command's TMPDIR, where its cells' temporary directories go: a marker for their
    processes. Short, because the fork server's socket lives there and an AF_UNIX path is limited
    to 107 bytes (pytest's tmp_path under xdist is longer)."""
    path = Path(tempfile.mkdtemp(prefix="sb-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ours(tmp: Path) -> list[Path]:
    """What the run left in its TMPDIR: anything but torch's own caches (torchinductor_<user>,
    which any torch program may create there and keeps on purpose)."""
    return [p for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]


def _start(out: Path, tmp: Path, *extra: str, fault: str | None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    env.pop("SHARDBENCH_FAULT", None)
    if fault:
        env["SHARDBENCH_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "shardbench.cli", *ARGS, *extra], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _long_dir(base: Path, length: int) -> Path:
    """A directory below ``base`` whose path is ``length`` characters long."""
    path = base / ("t" * (length - len(str(base)) - 1))
    path.mkdir()
    assert len(str(path)) == length
    return path


def _launchers_ranks(launcher: int) -> list[int]:
    """The live ranks of the launcher with PID ``launcher``: their logs lie in its private
    directory, ``sb-<pid>-...`` (bench/harness/guardian.py), wherever that directory is."""
    return worker_processes(f"/sb-{launcher}-")


# SIGTERM takes the same handler inside ``run`` (bench/harness/runner.py); its own exit code and
# unwinding are tested on max-size below, where no other path would stop the probe's ranks
def test_sigint_records_the_cell_as_interrupted_and_stops_every_rank(tmp_path, cell_tmp) -> None:
    """Under a TMPDIR of 119 characters, too long for a Unix socket's 107 bytes: the launcher
    keeps its files (the fork server's socket among them) in a short private directory
    elsewhere, so the run works there, and it leaves nothing behind in either."""
    long_tmp = _long_dir(cell_tmp, 119)
    out = tmp_path / "run"
    args = ["--out", str(out), "--name", "night", "--tag", "k=v"]
    proc = _start(out, long_tmp, *args, fault="hang:rank=1:strategy=zero2")
    records = out / "records.jsonl"
    deadline = time.monotonic() + 240
    while not (records.exists() and records.read_text().count("\n") == 1):  # cell 1 written
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    while len(_launchers_ranks(proc.pid)) < 2:  # cell 2's ranks are up
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [r.status for r in read_records([out])] == ["ok", "interrupted"]
    assert f"shardbench run --resume {out}" in err
    assert _launchers_ranks(proc.pid) == []
    assert ours(long_tmp) == [] and list(Path("/tmp").glob(f"sb-{proc.pid}-*")) == []


def test_sigterm_during_a_max_size_probe_stops_its_ranks(tmp_path, cell_tmp) -> None:
    """Commands other than ``run`` (max-size, claim, nightly's searches) unwind on SIGTERM too:
    the probe's ranks are stopped and reaped, the exit code is 143 and the records written stay."""
    tmp = cell_tmp
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "SHARDBENCH_FAULT": "hang:rank=1"}
    out = tmp_path / "ms"
    args = "max-size --workload transformer --strategy ddp --world-size 2 --budget 1GiB".split()
    args += ["--ladder", "tiny", "--batch-size", "2", "--steps", "1", "--warmup", "0", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardbench.cli", *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(worker_processes(str(tmp))) < 2:  # the probe's ranks are up
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert worker_processes(str(tmp)) == []


def test_sigkill_of_the_launcher_leaves_no_process_and_no_file(tmp_path, cell_tmp) -> None:
    """The launcher killed outright (no handler runs) while a rank hangs: within 5 s its fork
    server and ranks are gone, and so is its private directory, cells' directories and the
    server's socket included. A rank busy stepping goes the same way: the kernel kills a rank
    when its parent, the fork server, ends with the launcher, whatever the rank is doing."""
    fault = "hang:rank=1:strategy=ddp"
    proc = _start(tmp_path / "run", cell_tmp, "--out", str(tmp_path / "run"), fault=fault)
    deadline = time.monotonic() + 120
    while len(worker_processes(str(cell_tmp))) < 2:  # the first cell's ranks are up
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(1)
    below = descendants(proc.pid)
    assert len(below) >= 3  # the fork server and two ranks
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while (alive(below) or ours(cell_tmp)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(below) == [] and worker_processes(str(cell_tmp)) == []
    assert ours(cell_tmp) == []


def test_a_child_whose_launcher_already_left_exits_quietly(tmp_path) -> None:
    """A signal that stops the launcher while a rank is starting removes the rank's log folder
    first; the rank then exits without a traceback over the launcher's last line."""
    script = (
        "import sys; from shardbench.harness.launch import output_to_log; "
        f"output_to_log({str(tmp_path / 'gone' / 'rank0.log')!r}); print('ran on')"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")


def test_a_ctrl_c_after_the_command_finished_prints_no_traceback() -> None:
    """The command's output is written; a SIGINT while the interpreter exits (torch's exit
    handlers run then) is ignored rather than printed as a KeyboardInterrupt traceback."""
    script = (
        "import os, signal, sys; from shardbench.cli import entry; sys.argv = ['shardbench', 'env']; "
        "code = entry(); os.kill(os.getpid(), signal.SIGINT); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_the_fork_server_ignores_a_terminals_ctrl_c_from_its_first_import() -> None:
    """A terminal's Ctrl-C reaches the launcher's process group, the fork server too, which
    would otherwise print a KeyboardInterrupt traceback while it imports its preload."""
    from shardbench.harness.guardian import FORK_SERVER_IMPORTS, LAUNCHER_PID

    env = {**os.environ, LAUNCHER_PID: str(os.getpid())}  # as the launcher starts its server
    env.pop(FORK_SERVER_IMPORTS, None)  # the guard alone: what it imports after it is not tested here
    script = (
        "import signal, shardbench.harness.fork_server_guard; "
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr
