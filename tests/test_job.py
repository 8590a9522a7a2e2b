"""Past one machine: the job read from torchrun's and Slurm's variables, and real jobs of two
processes on this host, all at once: smoke-suite cells under torchrun (two agents meeting by
c10d rendezvous) and under Slurm (its variables played), each cell measuring what a local run of
the suite measures, to the byte; and three cells in a Slurm job, one of which fails on rank 1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shardbench.harness.job import Job, current_job, detect_job, expand_nodelist
from shardbench.records import read_records
from tests.procs import with_environment

#: one worker runs this module and tests/test_run_end_to_end.py: the module-scoped jobs run once,
#: and the smoke suite's local run (conftest.py) once for both (pytest-xdist, loadgroup)
pytestmark = pytest.mark.xdist_group("smoke_suite")

TORCHRUN = {
    "RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "node01",
    "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_RESTART_COUNT": "2",
}  # fmt: skip
SLURM = {
    "SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16", "SLURM_LOCALID": "1",
    "SLURM_JOB_ID": "123456", "SLURM_NODELIST": "gpu[07-08]", "SLURM_NTASKS_PER_NODE": "8",
}  # fmt: skip


def test_torchrun_variables() -> None:
    assert detect_job(TORCHRUN) == Job(
        launcher="torchrun", rank=3, world_size=16, local_rank=3, master_addr="node01",
        master_port=29400, agent_store=True, attempt=2, ranks_per_node=8,
    )  # fmt: skip


def test_slurm_variables_rank_0_hosts_the_store_on_the_first_node() -> None:
    job = detect_job(SLURM)
    assert job == Job(
        launcher="slurm", rank=9, world_size=16, local_rank=1, master_addr="gpu07",
        master_port=15000 + 123456 % 10000, nodes=("gpu07", "gpu08"), ranks_per_node=8,
    )  # fmt: skip
    # the step's own count and list before the job's; MASTER_ADDR/PORT before the derived ones
    step = {**SLURM, "SLURM_STEP_NUM_TASKS": "12", "SLURM_STEP_NODELIST": "a[3-4]", "MASTER_PORT": "1234"}
    assert detect_job(step) == Job(
        launcher="slurm", rank=9, world_size=12, local_rank=1, master_addr="a3", master_port=1234,
        nodes=("a3", "a4"), ranks_per_node=8,
    )  # fmt: skip
    assert detect_job({**step, "MASTER_ADDR": "head"}).master_addr == "head"


def test_a_batch_script_or_an_salloc_shell_is_not_a_job() -> None:
    """They carry the job's SLURM_PROCID and SLURM_NTASKS but are one process: only the tasks
    srun starts (its SLURM_STEP_* variables) make a job."""
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NUM_TASKS"}
    assert detect_job({**batch, "SLURM_PROCID": "0"}) is None


def test_commands_without_cells_run_alone_inside_a_job(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """``list``, ``env``, ``report``, ``compare`` ... in a process of a job run at once, as on one
    machine: nothing joins the job's store (there is none listening here)."""
    from shardbench.cli import main

    for name in os.environ:
        if name.startswith(("SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    job = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    for name, value in job.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    assert main(["list"]) == 0
    assert time.monotonic() - started < 10 and "zero2" in capsys.readouterr().out


def test_ranks_bound_to_cores_of_their_own_do_not_share_them() -> None:
    """Four processes on one node: unbound (each may run on all 8 cores), a cell's ranks share
    the node's cores; bound by srun to 2 cores each, each rank has its own (no "more ranks than
    cores", and each rank's threads are its own cores)."""
    from shardbench.harness.job_link import JobLink

    link = JobLink.__new__(JobLink)  # the store's answers, without a store
    link.hosts = ["n1"] * 4
    link.cpus = [frozenset(range(8))] * 4
    assert [link.sharing_cores(r, range(4)) for r in range(4)] == [4, 4, 4, 4]
    assert link.sharing_cores(0, range(2)) == 2
    link.cpus = [frozenset({2 * r, 2 * r + 1}) for r in range(4)]
    assert [link.sharing_cores(r, range(4)) for r in range(4)] == [1, 1, 1, 1]
    link.hosts = ["n1", "n1", "n2", "n2"]
    link.cpus = [frozenset()] * 4  # not known: every process of the node shares its cores
    assert [link.sharing_cores(r, range(4)) for r in range(4)] == [2, 2, 2, 2]


def test_torchrun_started_by_srun_is_torchruns_job() -> None:
    assert detect_job({**SLURM, **TORCHRUN}).launcher == "torchrun"


def test_no_job_and_a_job_of_one_process_are_this_machine() -> None:
    assert detect_job({"PATH": "/bin", "LOCAL_RANK": "0"}) is None
    assert detect_job({"RANK": "0", "WORLD_SIZE": "2"}) is None  # no launcher's rendezvous in sight
    one = {**SLURM, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}
    assert detect_job(one).world_size == 1 and current_job(one) is None
    assert current_job(SLURM) == detect_job(SLURM)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({**TORCHRUN, "RANK": "x"}, "RANK='x': expected an integer >= 0"),
        ({**TORCHRUN, "RANK": "16"}, "RANK=16 is not below WORLD_SIZE=16"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000': expected a port from 1 to 65535"),
        ({**SLURM, "SLURM_NODELIST": "gpu[08-07]"}, "the range '08-07' runs backwards"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_NODELIST"}, "needs MASTER_ADDR"),
    ],
)
def test_unreadable_variables_are_named(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError) as e:
        detect_job(env)
    assert says in str(e.value)


def test_a_rank_with_an_unreadable_variable_ends_in_one_line(monkeypatch, tiny_cell) -> None:
    """The worker reads the launcher's variables as the job does: a bad one is named, with
    what it may hold, before anything of the cell runs."""
    from shardbench.harness import worker

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(SystemExit) as e:
        worker.main(["--cell", json.dumps(tiny_cell().to_json())])
    assert (
        str(e.value) == "python -m shardbench.harness.worker: LOCAL_WORLD_SIZE='0': expected an integer >= 1"
    )


def test_slurm_node_lists_expand_in_order() -> None:
    assert expand_nodelist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert expand_nodelist("localhost") == ["localhost"]
    assert expand_nodelist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert expand_nodelist("x[098-101]") == ["x098", "x099", "x100", "x101"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_nodelist("node[01-02")


#: three cells of the tiny transformer at N = 2; rank 1 raises at the first step of the middle one
FLAGS = ["--workload", "transformer", "--preset", "tiny", "--strategy", "ddp,zero1,zero2", "--world-size",
         "2", "--batch-size", "2", "--steps", "1", "--warmup", "0", "--timeout", "60"]  # fmt: skip
#: the jobs' reports are written without charts: what is compared is what they measured, and on
#: two busy cores the drawing is seconds of each job's rank 0
FAULT = "error:rank=1:strategy=zero2"
#: every job and the local run together, on two busy cores
JOBS_TIMEOUT_S = 400
#: the smoke suite's workloads each job runs. What a job adds is how its ranks meet, the same for
#: every cell, so each job runs the cheapest workload of a kind: the transformer (a Hugging Face
#: model, counted on fake tensors) and deepspeech2 (an LSTM, counted on real ones). The whole suite
#: in jobs would add imagegpt's cells and swav's (the suite's dearest on a 2-core CPU), and no path
#: that these two cells leave untaken
JOB_WORKLOADS = {"torchrun": ("deepspeech2",), "slurm": ("transformer",)}
#: how long a job's last processes may take to be gone once its launchers have exited (a rank's
#: fork server ends when the process that started it does)
LEFT_S = 5.0
#: what makes a process part of a job, in the environment of this test's own
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_job(launcher: str, argv: list[str], env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """Two processes of one job on this host running ``python -m shardbench *argv``: two
    torchrun agents (one per "node", one process each) meeting by c10d rendezvous, or two
    processes given the variables srun gives the tasks of a step."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    base = {k: v for k, v in base.items() if k not in LAUNCHER_VARIABLES}
    port = str(_free_port())
    if launcher == "torchrun":
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        commands = [
            [torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "-m", "shardbench", *argv]
            for node in (0, 1)
        ]  # fmt: skip
        envs = [{**base, **env}] * 2
    else:
        commands = [[sys.executable, "-m", "shardbench", *argv]] * 2
        slurm = dict(SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_NODELIST="localhost", MASTER_PORT=port)
        envs = [{**base, **env, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in (0, 1)]
    # a process group each: a job past its deadline is ended whole
    piped = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return [subprocess.Popen(command, env=e, **piped) for command, e in zip(commands, envs, strict=True)]


def _outcome(procs: list[subprocess.Popen[str]], deadline: float) -> dict[str, list]:
    """Each process's exit code and output, once it ends (by ``deadline``; killed past it)."""
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            outputs.append(f"(killed: still running after {JOBS_TIMEOUT_S} s)")
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return {"codes": [p.returncode for p in procs], "outputs": outputs}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, object]:
    """At once, on this host: the smoke suite split between a torchrun job of two processes and a
    Slurm job of two (its variables played), three cells in a Slurm job of two with rank 1 raising in
    one, and the smoke suite run locally (in this process, while the jobs run, unless the
    session ran it already: ``smoke_suite_run``)."""
    root = tmp_path_factory.mktemp("jobs")
    marker = uuid.uuid4().hex
    marked = {"SHARDBENCH_TEST_JOB": marker}
    smoke = ["run", "--suite", "smoke", "--no-charts", "--out"]
    started = {
        launcher: _start_job(
            launcher, [*smoke, str(root / launcher), "--workload", ",".join(JOB_WORKLOADS[launcher])], marked
        )
        for launcher in ("torchrun", "slurm")
    } | {
        "fault": _start_job(
            "slurm",
            ["run", *FLAGS, "--no-charts", "--out", str(root / "fault")],
            {**marked, "SHARDBENCH_FAULT": FAULT},
        ),
    }
    deadline = time.monotonic() + JOBS_TIMEOUT_S
    try:
        local = request.getfixturevalue("smoke_suite_run")
        ran = {name: {**_outcome(procs, deadline), "out": root / name} for name, procs in started.items()}
        left = _left_after(marker, LEFT_S)
    finally:
        for pid in with_environment("SHARDBENCH_TEST_JOB", marker):  # a job's own, left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for run in ran.values():
        run["records"] = {(r.workload, r.strategy): r for r in read_records([run["out"]])}
    ran["local"] = {**local, "records": {(r.workload, r.strategy): r for r in read_records([local["out"]])}}
    return {**ran, "left": left}


def _left_after(marker: str, wait_s: float) -> list[str]:
    """The command lines of the processes carrying ``marker`` still alive after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while (pids := with_environment("SHARDBENCH_TEST_JOB", marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [_command_line(pid) for pid in pids]


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"pid {pid} (gone)"


@pytest.fixture
def job_run(jobs) -> dict[str, object]:
    """The job of three cells, one failing on rank 1."""
    return {**jobs["fault"], "records": {s: r for (_, s), r in jobs["fault"]["records"].items()}}


def test_the_job_runs_every_cell_and_rank_0_writes_the_run(job_run) -> None:
    assert job_run["codes"] == [1, 1], job_run["outputs"]  # a cell failed: the run's exit code, on each
    records = job_run["records"]
    assert [records[s].status for s in ("ddp", "zero1", "zero2")] == ["ok", "ok", "error"], job_run["outputs"]
    assert all(r.world_size == 2 and not r.simulated and r.backend == "gloo" for r in records.values())
    out = job_run["out"]
    assert (out / "index.html").is_file() and (out / "table.md").is_file() and (out / "cells.json").is_file()
    assert not list(out.glob("*.png")) and "--no-charts" in (out / "index.html").read_text()
    assert "slurm job of 2 processes" in job_run["outputs"][0]
    assert job_run["outputs"][1] == ""  # the run is rank 0's to tell


def test_a_rank_that_raises_fails_only_its_cell_and_is_blamed(job_run) -> None:
    r = job_run["records"]["zero2"]
    assert r.failure["rank"] == 1 and r.failure["step"] == 0, r.error
    assert r.error.startswith("rank 1 at step 0: RuntimeError: injected error"), r.error


#: the jobs and the local run measured at once, on the same cores: what each cell's step time was
#: next to ddp's depended on which of the others ran beside it then, so the gate leaves that
#: ratio out; memory and bytes are gated (and asserted equal to the byte besides)
SHARED_CORES_RULES = """
[[ignore]]
metrics = ["step_time_vs_ddp"]
reason = "measured at once on the same cores as the run it is compared with"
"""


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_a_job_runs_the_smoke_suite_as_a_local_run_does(jobs, launcher: str, tmp_path: Path) -> None:
    """Every cell of the suite's workloads the job ran, ok, each measuring what the local run
    measured: memory equal to the byte on every rank and by category, the same collectives and
    bytes; and ``compare`` against the local run exits 0 (its step-time ratios aside:
    ``SHARED_CORES_RULES``)."""
    from shardbench.cli import main

    job, local = jobs[launcher], jobs["local"]
    assert job["codes"] == [0, 0] and local["code"] == 0, job["outputs"]
    told = f"shardbench run: {launcher} job of 2 processes (this is rank 0)"
    assert sum(told in o for o in job["outputs"]) == 1, job["outputs"]  # the run is rank 0's to tell
    cells = json.loads((job["out"] / "cells.json").read_text())
    suite = json.loads((local["out"] / "cells.json").read_text())
    ran_here = {key: r for key, r in local["records"].items()}
    ran_by_job = JOB_WORKLOADS[launcher]  # the suite's cells of the workloads this job ran
    suite["cells"] = [c for c in suite["cells"] if c["workload"] in ran_by_job]
    ran_here = {key: r for key, r in ran_here.items() if key[0] in ran_by_job}
    assert suite["cells"]
    assert cells["cells"] == suite["cells"] and cells["suite"] == "smoke"
    assert job["records"].keys() == ran_here.keys() and len(ran_here) == len(cells["cells"])
    for cell, ran in job["records"].items():
        here = local["records"][cell]
        assert ran.status == "ok" and ran.world_size == 2 and not ran.simulated, (cell, ran.error)
        assert ran.peak_mem_bytes["per_rank"] == here.peak_mem_bytes["per_rank"], cell
        assert ran.mem_breakdown_bytes == here.mem_breakdown_bytes, cell
        assert ran.model_state_bytes == here.model_state_bytes, cell
        tiers = ("ranks_per_node", "tiers")  # a job knows its nodes; the local run has one host
        assert {k: v for k, v in ran.comm_per_step.items() if k not in tiers} == here.comm_per_step, cell
        assert ran.comm_per_step["sent_per_rank"] > 0, cell
        if launcher == "torchrun":  # two agents of one process each: two nodes, every byte across
            assert ran.comm_per_step["ranks_per_node"] == 1, cell
            assert all(t["within_node"] == 0 for t in ran.comm_per_step["tiers"].values()), cell
    rules = tmp_path / "rules.toml"
    rules.write_text(SHARED_CORES_RULES)
    compared = ["compare", str(local["out"]), str(job["out"]), "--rules", str(rules), "--out", str(tmp_path)]
    assert main(compared) == 0


def test_no_process_of_the_jobs_is_left(jobs) -> None:
    """Every process of each job, theirs, and their ranks', gone once the launchers exited."""
    assert jobs["left"] == []


class _SilentPeer:
    """A stand-in for the job's store, seen from rank 0 of two: rank 1 never answers."""

    job = Job(launcher="slurm", rank=0, world_size=2, local_rank=0, master_addr="node0", master_port=1)

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def has(self, key: str) -> bool:
        return key in self.values

    def silent_for(self, rank: int) -> float:
        from shardbench.harness.job_cells import SILENT_S

        return SILENT_S + 1

    def host(self, rank: int) -> str:
        return f"node{rank}"


def test_a_process_gone_silent_ends_the_job_with_its_rank_blamed(monkeypatch, tiny_cell) -> None:
    """Rank 1's process dies outright: rank 0's own rank then fails in a collective, rank 1 sends
    nothing and its heartbeat stands still. The cell is recorded with rank 1 blamed, and the run
    is told to stop after it."""
    from shardbench.harness import job_cells
    from shardbench.harness.launch import CellEndsRun
    from shardbench.harness.result import RankResult
    from shardbench.harness.validate import plan_cells

    def own_rank(link, seq, cell, processes) -> RankResult:
        error = "rank 0: Connection closed by peer"
        return RankResult(rank=0, status="error", error=error, failed_at=time.time())

    monkeypatch.setattr(job_cells, "run_own_rank", own_rank)
    link = _SilentPeer()
    leader = job_cells.Leader(link)
    (cell,) = plan_cells([tiny_cell(strategy="zero2", timeout_s=1.0)])
    with pytest.raises(CellEndsRun, match=r"the job lost rank 1 \(node1\)") as stopped:
        leader.run_cell(cell, run_id="t")
    record = stopped.value.record
    assert record.status == "error" and record.failure["rank"] == 1, record.error
    assert record.error.startswith("rank 1: its process of the job (on node1) sent no result"), record.error
    assert leader.lost == [1]
    posted = json.loads(link.values["msg/0"])
    assert posted["seq"] == 0 and posted["processes"] == 2 and posted["cell"]["strategy"] == "zero2"


def test_a_cell_of_one_process_stays_on_rank_0(monkeypatch, tiny_cell) -> None:
    """Inside a job, a simulated cell (one process) is started here by the local launcher; a
    cell of two goes to the job."""
    from shardbench.harness import launch
    from shardbench.harness.validate import plan_cells

    class StartedHere(Exception):
        pass

    def local_world(*args, **kwargs):
        raise StartedHere

    from shardbench.harness.job_cells import Leader

    sent = []
    monkeypatch.setattr(launch, "RankWorld", local_world)
    monkeypatch.setattr(Leader, "_on_job", lambda self, r, plan, run_id: sent.append(r.cell) or "record")
    simulated, real = plan_cells([tiny_cell(simulate=True, world_size=8), tiny_cell()])
    leader = Leader(link=None)
    assert leader.run_cell(real, run_id="t") == "record"
    with pytest.raises(StartedHere):
        leader.run_cell(simulated, run_id="t")
    assert sent == [real]


def test_a_job_of_one_process_runs_its_cells_ranks_here(monkeypatch, tiny_cell) -> None:
    """``torchrun --nproc-per-node 1``: the process is this machine, and the ranks its cells
    start are not torchrun's workers. Its agent's variables (TORCHELASTIC_USE_AGENT_STORE would
    have torch's rendezvous join the agent's store at the cell's port, where nothing serves)
    do not reach them: a two-rank cell trains."""
    from shardbench.harness import launch
    from shardbench.harness.validate import plan_cells

    torchrun = {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}  # fmt: skip
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    assert current_job() is None
    [cell] = plan_cells([tiny_cell(steps=1, warmup=0, timeout_s=60)])
    record = launch.run_cell(cell, run_id="t")
    assert record.status == "ok" and record.world_size == 2, record.error
