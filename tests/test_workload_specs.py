"""``--workload`` beyond the built-in names (``models/specs.py``, ``models/custom.py``,
``models/hf.py``): each way in builds, trains a step under ddp and zero2 on two real ranks and
plans under ``--fake``; each bad spec is one line and exit 2."""

from __future__ import annotations

import pytest
import torch

from shardbench.cli import main
from shardbench.harness.config import available_cores
from shardbench.models.custom import Input, ModelSpec, ModuleWorkload, loss_from_output
from shardbench.models.presets.config_string import format_model_config, parse_model_config
from shardbench.models.registry import get_workload, workload_names
from tests.cells import run_cell_here, tiny_cell

FILE_FACTORY = """
from torch import nn
from shardbench.models.custom import Input, ModelSpec

def factory():
    net = lambda: nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(8 * 6, 3))
    return ModelSpec(build=net, inputs={"input": Input((6,), high=50)})
"""

#: hf architectures at tiny sizes: (spec, preset)
HF_TINY = [
    ("hf:GPT2LMHeadModel", "n_embd=32:n_layer=2:n_head=2:vocab_size=100:n_positions=64:seq_len=16"),
    (
        "hf:LlamaForCausalLM",
        "hidden_size=32:intermediate_size=64:num_hidden_layers=2:num_attention_heads=4:"
        "num_key_value_heads=2:vocab_size=100:seq_len=16",
    ),
    (
        "hf:BertForSequenceClassification",
        "hidden_size=32:intermediate_size=64:num_hidden_layers=2:num_attention_heads=2:vocab_size=100:seq_len=16",
    ),
]


def _trains_and_plans(workload: str, preset: str) -> None:
    for strategy in ("ddp", "zero2"):
        record = run_cell_here(tiny_cell(workload=workload, preset=preset, strategy=strategy, steps=1))
        assert record.status == "ok", record.error
        assert record.loss is not None and torch.isfinite(torch.tensor(record.loss["last"]))
        assert record.flops_per_step, record.note  # Llama's grouped-query attention counted too
        # where its ranks ran: two processes on this host's cores (records.oversubscription)
        assert record.placement == {"ranks": 2, "cores": available_cores()}
    planned = run_cell_here(
        tiny_cell(workload=workload, preset=preset, strategy="zero3", world_size=8, fake=True, simulate=True)
    )
    assert planned.status == "ok", planned.error
    assert planned.peak_mem_bytes["max"] > 0
    assert planned.placement == {"ranks": 1, "cores": available_cores()}  # a simulated world: one process


def test_module_factory() -> None:
    workload = get_workload("tests.user_models:tiny_net")
    assert isinstance(workload, ModuleWorkload) and list(workload.presets) == ["default"]
    _trains_and_plans("tests.user_models:tiny_net", "default")


def test_factory_returning_a_workload() -> None:
    assert get_workload("tests.user_models:own_workload").name == "transformer"


def test_file_factory(tmp_path) -> None:
    path = tmp_path / "mymodel.py"
    path.write_text(FILE_FACTORY)
    _trains_and_plans(f"{path}:factory", "default")


@pytest.mark.parametrize("spec, preset", HF_TINY, ids=[s for s, _ in HF_TINY])
def test_hf_architecture(spec: str, preset: str) -> None:
    _trains_and_plans(spec, preset)


def test_entry_point(tmp_path, monkeypatch) -> None:
    dist = tmp_path / "mypkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[shardbench.workloads]\nmynet = tests.user_models:tiny_net\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "mynet" in workload_names()
    assert isinstance(get_workload("mynet"), ModuleWorkload)
    record = run_cell_here(
        tiny_cell(workload="mynet", preset="default", strategy="zero2", world_size=2, simulate=True)
    )
    assert record.status == "ok", record.error


def test_model_config_round_trip() -> None:
    values = parse_model_config("hidden_size=64,num_hidden_layers=2,tie_word_embeddings=False,act=gelu")
    assert values == {"hidden_size": 64, "num_hidden_layers": 2, "tie_word_embeddings": False, "act": "gelu"}
    assert parse_model_config(format_model_config(values)) == values
    assert format_model_config({}) == "default"


def test_model_config_flags_write_the_preset(tmp_path) -> None:
    from shardbench.cli import build_parser
    from shardbench.cli.run import resolve_cells

    args = build_parser().parse_args(
        [
            "run",
            "--workload",
            "hf:GPT2LMHeadModel",
            "--model-config",
            "n_embd=32,n_layer=1,n_head=2",
            "--seq-len",
            "8",
            "--strategy",
            "ddp",
            "--world-size",
            "1",
        ]
    )
    _, cells = resolve_cells(args)
    assert [c.preset for c in cells] == ["n_embd=32:n_layer=1:n_head=2:seq_len=8"]


def test_loss_from_output() -> None:
    inputs = {"labels": torch.tensor([1, 0])}
    logits = torch.randn(2, 3)
    assert torch.equal(
        loss_from_output(logits, inputs), torch.nn.functional.cross_entropy(logits, inputs["labels"])
    )
    assert torch.equal(loss_from_output(torch.tensor(2.0), {}), torch.tensor(2.0))
    assert torch.equal(loss_from_output({"loss": torch.tensor(1.0)}, {}), torch.tensor(1.0))
    assert torch.equal(loss_from_output((logits,), {}), logits.pow(2).mean())


def test_inputs_are_deterministic_per_rank_and_step() -> None:
    w = ModuleWorkload(
        "x", ModelSpec(build=torch.nn.Identity, inputs={"a": Input((3,)), "t": Input((2,), high=7)})
    )
    one, again = (w.batch("default", 4, seed=0, step=1, rank=1) for _ in range(2))
    other = w.batch("default", 4, seed=0, step=1, rank=0)
    assert all(torch.equal(one[k], again[k]) for k in one) and not torch.equal(one["a"], other["a"])
    assert one["a"].shape == (4, 3) and one["t"].dtype == torch.int64 and int(one["t"].max()) < 7


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--workload", "no_such_module:factory"], "no module 'no_such_module'"),
        (["--workload", "tests.user_models:missing"], "has no attribute 'missing'"),
        (["--workload", "tests.user_models:not_callable"], "not callable"),
        (
            ["--workload", "tests.user_models:wrong_type"],
            "returned a int; allowed: a Workload or a ModelSpec",
        ),
        (["--workload", "tests.user_models:raises"], "calling the factory failed: RuntimeError"),
        (["--workload", "/no/such/file.py:f"], "no file"),
        (["--workload", "hf:NoSuchForCausalLM"], "has no model class 'NoSuchForCausalLM'"),
        (["--workload", "hf:BertModel"], "no training loss for this class"),
        (["--workload", "hf:GPT2LMHeadModel", "--model-config", "n_embdd=8"], "did you mean n_embd"),
        (["--workload", "hf:GPT2LMHeadModel", "--model-config", "n_embd"], "is not key=value"),
        (["--workload", "hf:GPT2LMHeadModel", "--model-config", "n_embd=30,n_head=4"], "divisible"),
        (
            ["--workload", "transformer", "--model-config", "hidden_size=8"],
            "built-in workloads take --preset",
        ),
        (
            ["--workload", "tests.user_models:sized_net", "--model-config", "widht=8"],
            "the factory has no keyword 'widht'; it takes width, depth",
        ),
        (
            ["--workload", "tests.user_models:tiny_net", "--model-config", "width=8"],
            "it takes no keyword arguments",
        ),
        (["--workload", "tests.user_models:sized_net", "--seq-len", "8"], "--seq-len applies to hf:"),
        (["--workload", "tests.user_models:not_a_module"], "ModelSpec.build returned int, not an nn.Module"),
        (
            ["--workload", "tests.user_models:no_blocks", "--activation-checkpointing"],
            "has no repeated blocks",
        ),
    ],
)
def test_bad_specs_exit_2_in_one_line(argv, needle, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["run", *argv, "--strategy", "ddp", "--world-size", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "command",
    [["run", "--strategy", "ddp", "--world-size", "1"], ["plan", "--world-size", "2", "--budget", "1GiB"]],
)
def test_inputs_forward_does_not_take_are_refused_before_anything_runs(command, tmp_path, capsys) -> None:
    """``ModelSpec(inputs={"x": ...})`` around an ``nn.Sequential`` (``forward(input)``) would
    fail every cell at its first step; it is one line naming what ``forward`` takes, exit 2."""
    out = tmp_path / "out"
    name, *flags = command
    argv = [name, "--workload", "tests.user_models:wrong_inputs", *flags, "--out", str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"shardbench {name}: error: workload 'tests.user_models:wrong_inputs': the ModelSpec inputs (x) do "
        "not fit Sequential.forward, which has no parameter 'x'; by name, forward takes input"
    ]
    assert not out.exists()


def test_a_relative_file_resolves_against_the_callers_directory(tmp_path, monkeypatch) -> None:
    """An exec'd (CUDA) rank starts in the project root: the launcher passes the command's
    directory (SHARDBENCH_CALLER_CWD), and a relative file spec is found from there."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "relnet.py").write_text(FILE_FACTORY)
    monkeypatch.setenv("SHARDBENCH_CALLER_CWD", str(tmp_path))
    monkeypatch.chdir("/")
    assert isinstance(get_workload("sub/relnet.py:factory"), ModuleWorkload)


def test_your_own_model_takes_its_own_preset_where_none_is_given() -> None:
    """The smoke suite's preset is ``tiny``; a model of one's own has ``default`` (or its hf shape)."""
    from shardbench.cli import build_parser
    from shardbench.cli.run import resolve_cells

    args = build_parser().parse_args(["run", "--workload", "transformer,tests.user_models:tiny_net"])
    _, cells = resolve_cells(args)
    assert {(c.workload, c.preset) for c in cells} == {
        ("transformer", "tiny"),
        ("tests.user_models:tiny_net", "default"),
    }
