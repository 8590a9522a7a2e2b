"""Does our ZeRO-2 keep its saving inside Lightning? The example GPT LightningModule
(``examples/lightning_gpt.py``) on two gloo ranks, measured two ways:

- inside a Trainer, ``DDPStrategy(gradient_as_bucket_view=True)`` (the harness's DDP setting)
  against ``strategy="shardbench_zero2"``: step time (median over the timed steps, training_step
  to the end of the optimizer step) and the tracked peak per rank over two steady steps, with the
  harness's own ``MemoryProbe`` (the same tensors typed as ``shardbench run`` types them);
- ``shardbench run --workload lightning:examples/lightning_gpt.py:GPTLit --strategy ddp,zero2``.

    .venv/bin/python scripts/measure_lightning.py [--model-config width=256,depth=4] [--out DIR]

It prints a table and whether the bytes zero2 saves inside Lightning are within 5% of what
``shardbench run`` measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ and examples/ of this checkout

from shardbench.models.presets.config_string import parse_model_config
from shardbench.records import read_records
from tests.dist import run_distributed

WARMUP, STEPS, TRACKED = 2, 5, 2  # as the run below is given


def rank_fn(rank: int, world_size: int, shape: dict[str, Any]) -> dict[str, Any]:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    import shardbench.integrations.lightning  # noqa: F401
    from examples.lightning_gpt import GPTLit
    from shardbench.metrics.memory import MemoryProbe
    from shardbench.strategies.sharded import ShardedDataParallel
    from tests.lightning_models import in_rank, trainer

    class Measure(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.probe: MemoryProbe | None = None
            self.peak = 0

        def on_train_batch_start(self, t: Any, module: Any, batch: Any, i: int) -> None:
            if i == WARMUP + STEPS:  # the tracked steps: set up as the harness sets its probe up
                model, optimizer = t.strategy.model, t.optimizers[0]
                typed: dict[str, list[torch.Tensor]] = {}
                if isinstance(model, ShardedDataParallel):
                    typed = {**optimizer.memory_tensors(), **model.memory_tensors()}
                self.probe = MemoryProbe(torch.device("cpu"), [model, optimizer], typed=typed)
                if isinstance(model, ShardedDataParallel):
                    model.memory_observer = self.probe.attribute
                self.probe.__enter__()
            elif self.probe is not None:
                self.probe.next_step()
            self.start = time.perf_counter()

        def on_train_batch_end(self, t: Any, module: Any, outputs: Any, batch: Any, i: int) -> None:
            if WARMUP <= i < WARMUP + STEPS:
                self.times.append(time.perf_counter() - self.start)
            if i == WARMUP + STEPS + TRACKED - 1 and self.probe is not None:
                self.probe.__exit__(None, None, None)
                self.peak = self.probe.peak()[0]

    out = {}
    with in_rank(rank, world_size):
        for name, strategy in (("ddp", DDPStrategy(gradient_as_bucket_view=True)), ("zero2", "shardbench_zero2")):
            torch.manual_seed(0)
            measure = Measure()
            t = trainer(strategy, world_size, max_steps=WARMUP + STEPS + TRACKED, callbacks=[measure])
            t.fit(GPTLit(**shape))
            out[name] = {"peak": measure.peak, "step_s": statistics.median(measure.times)}
    return out


def shardbench_run(config: str, batch: int, out: Path) -> dict[str, dict[str, float]]:
    cmd = [
        sys.executable, "-m", "shardbench.cli", "run",
        "--workload", "lightning:examples/lightning_gpt.py:GPTLit", "--model-config", config,
        "--strategy", "ddp,zero2", "--world-size", "2", "--batch-size", str(batch),
        "--steps", str(STEPS), "--warmup", str(WARMUP), "--out", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return {
        r.strategy: {"peak": r.peak_mem_bytes["max"], "step_s": r.step_time_s["median"]}
        for r in read_records([out])
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", default="vocab=8192,width=256,depth=4,heads=4,seq=128,batch_size=8")
    parser.add_argument("--out", type=Path, default=None, help="where the run's records and a summary go")
    args = parser.parse_args()
    shape = parse_model_config(args.model_config)
    out = args.out or Path(tempfile.mkdtemp(prefix="lightning-measure-"))
    ranks = run_distributed(rank_fn, 2, shape, timeout_s=1800)
    inside = {s: {"peak": max(r[s]["peak"] for r in ranks), "step_s": max(r[s]["step_s"] for r in ranks)}
              for s in ("ddp", "zero2")}  # fmt: skip
    run = shardbench_run(args.model_config, int(shape.get("batch_size", 8)), out / "run")
    mib = 2**20
    print(f"GPTLit {args.model_config}, N=2 gloo, fp32, max over ranks")
    print("| measured by | strategy | peak per rank (MiB) | step time (ms) |")
    print("|---|---|---:|---:|")
    for label, figures in (("Lightning Trainer", inside), ("shardbench run", run)):
        for s in ("ddp", "zero2"):
            print(f"| {label} | {s} | {figures[s]['peak'] / mib:.1f} | {figures[s]['step_s'] * 1e3:.0f} |")
    saved = {k: f["ddp"]["peak"] - f["zero2"]["peak"] for k, f in (("lightning", inside), ("run", run))}
    ratio = saved["lightning"] / saved["run"]
    print(
        f"zero2 saves {saved['lightning'] / mib:.1f} MiB per rank inside Lightning, {saved['run'] / mib:.1f} MiB "
        f"under shardbench run: {ratio:.3f} of it ({'within' if abs(ratio - 1) <= 0.05 else 'NOT within'} 5%)"
    )
    (out / "summary.json").write_text(json.dumps({"inside": inside, "run": run, "ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
