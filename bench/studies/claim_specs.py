"""What ``shardbench claim`` runs, per device: one preset per workload where model states matter,
the world size, the budget, and how step time is measured.

The seed claim was made at about one billion parameters on 8 GPUs. A 2-core CPU cannot train
that, so the CPU spec scales the presets down to ~100M parameters (model states still dominate
for three of the four workloads at these batches) and says so in the report; the CUDA spec uses
the paper presets on one card (simulated N=8, an emulated card budget).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

#: the per-rank batch of a workload of your own, where ``claim --batch-size`` does not set one
OWN_BATCH = 1
#: where a claim's folder goes unless ``--out`` says (``default_out``)
CLAIMS_DIR = Path("results/claim")


@dataclass(frozen=True)
class ClaimWorkload:
    name: str
    preset: str
    batch_size: int  # per rank, equal for every strategy
    #: presets for the max-size search (None: the workload's size family, to 3%)
    ladder: tuple[str, ...] | None = None
    activation_checkpointing: bool = False

    @property
    def label(self) -> str:
        """The workload as a verdict names it: ``imagegpt`` or ``imagegpt +AC``."""
        return self.name + (" +AC" if self.activation_checkpointing else "")


@dataclass(frozen=True)
class ClaimSpec:
    name: str
    device: str
    workloads: tuple[ClaimWorkload, ...]
    world_size: int = 8  # simulated: real per-rank memory of a world of N, one process
    budget: str = "2GiB"  # per rank, for the max-size search
    #: ``--reserve``: a fixed size kept beside each peak in the search, instead of the device's
    #: reserve (``plan_reserve.policy``: none on the CPU, the allocator's cache on CUDA)
    reserve_bytes: int | None = None
    #: real ranks for step time (communication included); 0: take the simulated runs' step time,
    #: which excludes communication (one GPU cannot host a multi-rank NCCL world)
    timing_world_size: int = 2
    #: every cell's precision (``claim --precision``); the formula's bytes per element follow it
    precision: str = "fp32"
    peers: tuple[str, ...] = ("torch-zero1", "fsdp2-zero2")
    #: peers that cannot be a simulated rank (they run their own communication): measured on
    #: real ranks at ``timing_world_size``, beside ddp and zero2 at the same N, each with its own
    #: verdict line; none where the spec has no real ranks
    real_peers: tuple[str, ...] = ()
    #: our further ZeRO stages, measured like zero2 (peak and largest model) to show how far
    #: sharding goes; the verdict stays about zero2, the stage the claim was made for
    further: tuple[str, ...] = ("zero3",)
    #: timed steps of the step-time cells (memory cells time one, unless they are the timing);
    #: enough for a median and MAD that ``compare``'s rule (>= 5 steps) can judge
    steps: int = 10
    warmup: int = 1
    scale_note: str = ""
    #: each workload is measured once per value: without and with activation checkpointing (users
    #: who shard models this size checkpoint activations; without it, activations ZeRO does not
    #: shard can decide the verdict)
    activation_checkpointing: tuple[bool, ...] = (False, True)

    @property
    def title(self) -> str:
        """The spec as a report names it: ``cpu``, or ``cpu, fp16`` away from fp32."""
        return self.name + (f", {self.precision}" if self.precision != "fp32" else "")

    def variants(self) -> tuple[ClaimWorkload, ...]:
        """Every (workload, activation checkpointing) the claim measures, in report order."""
        return tuple(
            replace(w, activation_checkpointing=ac)
            for w in self.workloads
            for ac in self.activation_checkpointing
        )


SPECS: dict[str, ClaimSpec] = {
    "cpu": ClaimSpec(
        name="cpu",
        device="cpu",
        workloads=(
            ClaimWorkload("transformer", "base", 2),
            ClaimWorkload("imagegpt", "igpt-s", 1),
            ClaimWorkload("swav", "rn50", 1),
            ClaimWorkload("deepspeech2", "paper", 1),
        ),
        peers=(),  # --peers adds torch-zero1 and fsdp2-zero2 (~3 more minutes on 2 cores)
        scale_note=(
            "CPU scale: presets of ~30-110M parameters instead of the claim's ~1B, a 2 GiB per-rank "
            "budget instead of a GPU's, world size 8 simulated (rank 0 of a fake world: real memory, "
            "no communication); step time from real gloo ranks at N=2 on 2 cores."
        ),
    ),
    "cuda": ClaimSpec(
        name="cuda",
        device="cuda",
        workloads=(
            ClaimWorkload("transformer", "1b", 8),
            ClaimWorkload("imagegpt", "igpt-l", 4),
            ClaimWorkload("swav", "rn50-w5", 16),
            ClaimWorkload("deepspeech2", "h2048-l7", 16),
        ),
        budget="16GiB",
        timing_world_size=0,
        scale_note=(
            "One GPU: world size 8 simulated on one card (real memory and kernels, no communication); "
            "max-size probes on an emulated 16 GiB card (allocator fraction); step time excludes "
            "communication."
        ),
    ),
    "tiny": ClaimSpec(
        name="tiny",
        device="cpu",
        workloads=tuple(
            ClaimWorkload(w, "tiny", 2, ladder=("tiny",))
            for w in ("transformer", "imagegpt", "swav", "deepspeech2")
        ),
        world_size=4,
        budget="64MiB",
        timing_world_size=0,
        peers=(),
        steps=1,
        warmup=1,
        scale_note="tiny presets: a test of the pipeline, not a measurement of the claim.",
    ),
}


def own_workloads(spec: ClaimSpec) -> list[str]:
    """The workloads of ``spec`` that the spec of its name lacks: one's own (``--workload``)."""
    theirs = {w.name for w in SPECS[spec.name].workloads} if spec.name in SPECS else set()
    return [w.name for w in spec.workloads if w.name not in theirs]


def default_out(spec: ClaimSpec) -> Path:
    """The claim's folder unless ``--out`` says: ``<spec>``, then ``-<workloads>`` of one's own
    (``hf:GPT2LMHeadModel`` -> ``hf-GPT2LMHeadModel``), then ``-<precision>`` away from fp32:
    each a claim of its own, beside the spec's rather than over it."""
    own = "-".join(re.sub(r"[^A-Za-z0-9]+", "-", n).strip("-") for n in own_workloads(spec))
    precision = spec.precision if spec.precision != "fp32" else ""
    return CLAIMS_DIR / "-".join(part for part in (spec.name, own, precision) if part)


def claim_command(spec: ClaimSpec, out: Path | None = None) -> str:
    """The ``shardbench claim`` command that measures ``spec`` into ``out``: its name, each flag
    by which it differs from the spec of that name (precision, peers, workloads and the shape
    and batch of one's own, world size, budget, reserve), and ``--out`` where ``out`` is not the
    default folder. Read from the spec, not from a command line, so a report says how to
    reproduce exactly what it shows."""
    from shardbench.models.presets.config_string import DEFAULT_PRESET

    base = SPECS.get(spec.name, spec)
    words = ["shardbench", "claim", "--spec", spec.name]
    if spec.precision != base.precision:
        words += ["--precision", spec.precision]
    if (spec.peers, spec.real_peers) != (base.peers, base.real_peers):
        words.append("--peers")
    names = [w.name for w in spec.workloads]
    if names != [w.name for w in base.workloads]:
        words += ["--workload", ",".join(names)]
    own = [w for w in spec.workloads if w.name in own_workloads(spec)]
    if own and own[0].preset != DEFAULT_PRESET:  # one --model-config shapes all of one's own
        words += ["--model-config", own[0].preset]
    if own and own[0].batch_size != OWN_BATCH:
        words += ["--batch-size", str(own[0].batch_size)]
    if spec.world_size != base.world_size:
        words += ["--world-size", str(spec.world_size)]
    if spec.budget != base.budget:
        words += ["--budget", spec.budget]
    if spec.reserve_bytes is not None:
        words += ["--reserve", _size_flag(spec.reserve_bytes)]
    if out is not None and Path(out) != default_out(spec):
        words += ["--out", str(out)]
    return shlex.join(words)


def _size_flag(nbytes: int) -> str:
    """``nbytes`` as a size flag reads it back exactly: ``2GiB``, ``512MiB``, else ``1000B``."""
    unit = next((u for u in ("GiB", "MiB", "KiB") if nbytes and not nbytes % _BINARY[u]), "B")
    return f"{nbytes // _BINARY.get(unit, 1)}{unit}"


_BINARY = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}
