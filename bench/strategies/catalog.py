"""Every strategy's declaration, importable without torch.

A strategy's implementation needs torch (2 s to import on the CI machine); what a user lists,
what a record is validated and planned against, and what a report draws (name, aliases,
description, what it shards, how it is shown) does not. So each strategy is declared here once,
as a ``StrategyCard``, and its class in ``bench/strategies/<file>.py`` takes these fields from its
card (``class DDPStrategy(Strategy, card="ddp")``): ``shardbench list``, ``report`` and
argument validation never import torch, and there is still one place a declaration lives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from shardbench.metrics.analytic import REPLICATED, ZERO1, ZERO2, ZERO3, Sharding

Role = Literal["baseline", "ours", "peer"]


@dataclass(frozen=True, kw_only=True)
class Display:
    """How reports show a strategy, declared on its card so a new strategy needs no report edit."""

    #: place in bar groups and legends, by ZeRO stage: 10 x stage, + 1 for a peer, so each
    #: peer sits right after ours at the same stage (dp 0, ddp 10, zero1 20, torch-zero1 21, ...)
    order: int
    #: matplotlib colour: ours saturated, the peer at the same stage a lighter shade of it
    color: str
    #: what the strategy is to the comparison: a baseline, our implementation, or a peer's
    role: Role
    #: the unsharded baseline every memory saving is measured against (one strategy sets it)
    reference: bool = False


@dataclass(frozen=True)
class WorldPlan:
    """What a requested world size becomes for a strategy on a device.

    ``processes`` ranks are launched; ``world_size`` is what the record reports (the number of
    devices/ranks that really share the work). ``note`` explains any difference from the request.
    """

    processes: int
    world_size: int
    note: str = ""
    #: one process plays rank 0 of a fake world of ``world_size`` (PyTorch's fake process group).
    simulated: bool = False

    def reported_world_size(self, processes: int) -> int:
        """The world size a cell run with ``processes`` ranks reports: the plan's, when it was
        launched as planned; the ranks really started otherwise (torchrun with another count)."""
        return self.world_size if processes == self.processes else processes


@dataclass(frozen=True, kw_only=True)
class StrategyCard:
    """What a strategy is, without its implementation."""

    name: str
    #: "module:Class" of the implementation, imported only when the strategy is run
    implementation: str
    description: str
    #: what is partitioned across ranks; the analytic memory prediction is computed from it
    sharding: Sharding
    #: how reports order, colour and label it
    display: Display
    aliases: tuple[str, ...] = ()
    #: can run as rank 0 of a fake world of N (simulated world sizes)
    simulatable: bool = True
    #: needs torch.distributed initialised in every rank
    needs_process_group: bool = True
    #: the import names of the packages it needs beyond the base install, and the optional
    #: extra (``pip install shardbench[peers]``; ``scripts/setup.sh`` installs it) that has them
    requires: tuple[str, ...] = ()
    extra: str | None = None
    #: runs only on CUDA devices (the reason is in ``deviations``)
    cuda_only: bool = False
    #: why it trains fp16 only on CUDA ("" when fp16 runs wherever the strategy does)
    fp16_needs_cuda: str = ""
    #: on a CPU it trains fp16 only where oneDNN has fp16 kernels for this CPU (why, or "")
    fp16_needs_cpu_kernels: str = ""
    #: where it cannot follow the reference optimizer exactly, or cannot run somewhere, and why
    deviations: str = ""
    #: its tracked memory is the same to the byte whenever the same cell runs again (every
    #: buffer allocated and freed in program order, none freed by a background stream or
    #: thread), so the regression gate allows it only the device's small floor; a strategy
    #: without it (FSDP2, FairScale: their peaks moved by up to 0.25 MiB, 4.8 %, between runs of
    #: the same code on the CPU) is allowed 1 MiB
    exact_memory: bool = False
    #: shards within groups of S ranks and replicates across the N/S groups when a cell gives a
    #: shard width (``shard_group``; hybrid sharding); a strategy without it shards over all N
    shard_group: bool = False
    #: modules its ranks import while they set it up, beyond what every rank imports: a run that
    #: forks its ranks has the fork server import them once (``launch.import_for``), so no rank
    #: pays them again
    rank_imports: tuple[str, ...] = ()

    @property
    def not_simulatable_because(self) -> str:
        """Why it cannot be a simulated rank (meaningful only when ``simulatable`` is False)."""
        if not self.needs_process_group:
            return "it has no process group to fake"
        return "its library runs its own communication, which a simulated rank cannot stand in for"


#: FairScale's fp16 loss scaler is built on torch.cuda.amp's
FAIRSCALE_FP16_NEEDS_CUDA = (
    "FairScale's ShardedGradScaler turns itself off without CUDA, so fp16 would train with no loss scaling"
)
#: DeepSpeed's CPU accelerator lists fp16 among its dtypes only where oneDNN has fp16 kernels
DEEPSPEED_FP16_NEEDS_CPU_KERNELS = (
    "DeepSpeed's CPU accelerator refuses fp16 where oneDNN has no fp16 kernels for the CPU"
)
#: what every DeepSpeed stage does differently from single-process AdamW (parity tests pin it)
_DEEPSPEED_NO_SIMULATION = (
    "no simulated or planned (--simulate, --fake) world: the engine needs its own communication backend"
)
#: stages 1-2: a flat partition has no "no gradient"
DEEPSPEED_DEVIATIONS = (
    "a parameter that gets no gradient in a step (an unused branch) is stepped with a zero "
    "gradient, its flat partition having no 'no gradient' (AdamW's moments and weight decay "
    "still move it; torch AdamW skips it); " + _DEEPSPEED_NO_SIMULATION
)
#: stage 3 keeps each parameter's gradient partition between steps and does not clear it
DEEPSPEED_ZERO3_DEVIATIONS = (
    "a parameter that gets no gradient in a step (an unused branch) is stepped with the gradient "
    "it got the last time it was used, its gradient partition not being cleared (torch AdamW "
    "skips it); " + _DEEPSPEED_NO_SIMULATION
)


def _deepspeed_card(stage: int, sharding: Sharding, order: int, color: str) -> StrategyCard:
    """DeepSpeed's engine at one ZeRO stage: the same implementation, extra and limits."""
    return StrategyCard(
        name=f"deepspeed-zero{stage}",
        implementation=f"shardbench.strategies.deepspeed_zero:DeepSpeedZero{stage}Strategy",
        description=f"peer: DeepSpeed engine, zero_optimization stage {stage}",
        sharding=sharding,
        display=Display(order=order, color=color, role="peer"),
        simulatable=False,
        requires=("deepspeed",),
        extra="peers",
        # the engine's optimizer check imports DeepSpeed's Muon optimizer, which imports torch's
        # inductor: 1.3-1.6 s a rank on the 2-core CPU. Not DeepSpeed itself, whose import
        # would print its accelerator warning on the launcher's terminal
        rank_imports=("torch._inductor.compile_fx",),
        fp16_needs_cpu_kernels=DEEPSPEED_FP16_NEEDS_CPU_KERNELS,
        deviations=DEEPSPEED_ZERO3_DEVIATIONS if stage == 3 else DEEPSPEED_DEVIATIONS,
    )


CARDS: tuple[StrategyCard, ...] = (
    StrategyCard(
        name="dp",
        implementation="shardbench.strategies.dp:DPStrategy",
        description="torch.nn.DataParallel (one process; real only with >= 2 CUDA devices)",
        sharding=REPLICATED,
        display=Display(order=0, color="#bdbdbd", role="baseline"),
        simulatable=False,
        needs_process_group=False,
    ),
    StrategyCard(
        name="ddp",
        implementation="shardbench.strategies.ddp:DDPStrategy",
        description="DistributedDataParallel (gradient_as_bucket_view=True), full replicas",
        sharding=REPLICATED,
        display=Display(order=10, color="#525252", role="baseline", reference=True),
        exact_memory=True,
    ),
    StrategyCard(
        name="zero1",
        shard_group=True,
        implementation="shardbench.strategies.zero1:Zero1Strategy",
        description="ours: ShardedOptimizer (ZeRO-1, element-balanced), grads reduce-scattered (gloo: DDP)",
        sharding=ZERO1,
        display=Display(order=20, color="#1f77b4", role="ours"),
        exact_memory=True,
    ),
    StrategyCard(
        name="zero2",
        shard_group=True,
        implementation="shardbench.strategies.zero2:Zero2Strategy",
        aliases=("sharded", "ddp_sharded"),
        description="ours: ShardedOptimizer + ShardedDataParallel (ZeRO-2, element-balanced)",
        sharding=ZERO2,
        display=Display(order=30, color="#e6550d", role="ours"),
        exact_memory=True,
    ),
    StrategyCard(
        name="zero3",
        shard_group=True,
        implementation="shardbench.strategies.zero3:Zero3Strategy",
        description="ours: ShardedOptimizer + ShardedDataParallel(stage=3) (ZeRO-3, per-unit gathers)",
        sharding=ZERO3,
        display=Display(order=40, color="#31a354", role="ours"),
        exact_memory=True,
    ),
    StrategyCard(
        name="torch-zero1",
        implementation="shardbench.strategies.torch_zero1:TorchZero1Strategy",
        description="peer: torch ZeroRedundancyOptimizer (whole-parameter partition) + DDP",
        sharding=Sharding(optimizer_state=True, whole_parameters=True),
        display=Display(order=21, color="#9ecae1", role="peer"),
        exact_memory=True,
        rank_imports=("torch.distributed.optim",),
    ),
    StrategyCard(
        name="fsdp2-zero2",
        implementation="shardbench.strategies.fsdp2:FSDP2Zero2Strategy",
        description="peer: FSDP2 fully_shard, reshard_after_forward=False (ZeRO-2-like)",
        sharding=ZERO2,
        display=Display(order=31, color="#fdae6b", role="peer"),
    ),
    StrategyCard(
        name="fsdp2-zero3",
        implementation="shardbench.strategies.fsdp2:FSDP2Zero3Strategy",
        description="peer: FSDP2 fully_shard, reshard_after_forward=True (ZeRO-3)",
        sharding=ZERO3,
        display=Display(order=41, color="#a1d99b", role="peer"),
    ),
    StrategyCard(
        name="fsdp2-hsdp",
        shard_group=True,
        implementation="shardbench.strategies.fsdp2_hsdp:FSDP2HSDPStrategy",
        description="peer: FSDP2 hybrid sharding (HSDP), fully_shard over a (N/S replicate, S shard) mesh",
        sharding=ZERO3,
        display=Display(order=44, color="#74c476", role="peer"),
    ),
    StrategyCard(
        name="fairscale-zero1",
        implementation="shardbench.strategies.fairscale_oss:FairScaleZero1Strategy",
        description="peer: FairScale OSS (whole-parameter partition) + DDP",
        sharding=Sharding(optimizer_state=True, whole_parameters=True),
        display=Display(order=22, color="#c6dbef", role="peer"),
        simulatable=False,
        requires=("fairscale",),
        fp16_needs_cuda=FAIRSCALE_FP16_NEEDS_CUDA,
        extra="peers",
    ),
    StrategyCard(
        name="fairscale-zero2",
        implementation="shardbench.strategies.fairscale_oss:FairScaleZero2Strategy",
        description=(
            "peer: FairScale OSS + ShardedDataParallel, the implementation behind Lightning's "
            "ddp_sharded and its 2x claim (gradients reduced to their owner)"
        ),
        sharding=Sharding(optimizer_state=True, gradients=True, whole_parameters=True),
        display=Display(order=32, color="#fdd0a2", role="peer"),
        simulatable=False,
        requires=("fairscale",),
        fp16_needs_cuda=FAIRSCALE_FP16_NEEDS_CUDA,
        extra="peers",
        deviations=(
            "reduce_buffer_size=0 (one reduce per parameter): with FairScale 0.4.13's reduce "
            "buckets on this torch the reduced gradients are wrong (parameters off by ~9e-4 after "
            "4 steps at N=2 on gloo), without them they match single-process AdamW"
        ),
    ),
    StrategyCard(
        name="fairscale-zero3",
        implementation="shardbench.strategies.fairscale_fsdp:FairScaleZero3Strategy",
        description="peer: FairScale FullyShardedDataParallel (ZeRO-3, per-block wrap)",
        sharding=ZERO3,
        display=Display(order=42, color="#c7e9c0", role="peer"),
        simulatable=False,
        requires=("fairscale",),
        fp16_needs_cuda=FAIRSCALE_FP16_NEEDS_CUDA,
        extra="peers",
        cuda_only=True,
        deviations=(
            "CUDA only: FairScale's FullyShardedDataParallel initialises CUDA when it wraps a "
            "model, so it does not run on CPU ranks; a frozen parameter beside trainable ones in "
            "one wrapped unit is refused by its flattening, so parameters are not flattened"
        ),
    ),
    *(
        _deepspeed_card(stage, sharding, order, color)
        for stage, sharding, order, color in (
            (1, ZERO1, 23, "#deebf7"),
            (2, ZERO2, 33, "#feedde"),
            (3, ZERO3, 43, "#e5f5e0"),
        )
    ),
    replace(
        _deepspeed_card(3, ZERO3, 45, "#006d2c"),
        name="deepspeed-zero3-hpz",
        shard_group=True,
        implementation="shardbench.strategies.deepspeed_hpz:DeepSpeedZero3HpZStrategy",
        description=(
            "peer: DeepSpeed ZeRO-3 with ZeRO++ hierarchical partitioning (zero_hpz_partition_size = S)"
        ),
    ),
)
