"""The step-time model: one rank's predicted step from its FLOPs, its optimizer update, the
collectives it issues and a network profile.

    step = compute + update + exposed communication + call overhead + buffer memory

* ``compute``: the rank's forward and backward. On a CPU it is measured: where the cell ran, the
  model's own forward and backward timed on its ranks before the strategy wrapped it
  (``bare_compute``); else (a plan) the step's own operator calls replayed one by one at the
  rank's threads (``op_replay``), over the rank's core share (the cores a rank gets over the cores
  its threads ask for, below 1 only where ranks outnumber cores). Elsewhere (a GPU, planned from
  its datasheet) it is ``hardware FLOPs / rate``, ``rate = peak x efficiency``: the FLOPs of
  ``flops.py`` (recompute included) at a stated fraction (``EFFICIENCY``) of the peak.
* ``update = elements updated x seconds per element + tensors stepped x seconds per tensor
  (or a replay of the rank's own update) + DTensor dispatch``: AdamW is memory-bound, so its
  time follows the optimizer-state elements a rank holds (all of them under ddp, 1/N under
  ZeRO), at the rate ``update_probe`` measured on a CPU (over the rank's
  core share, as its compute), or AdamW's bytes per element over the datasheet's memory bandwidth
  on CUDA; and on a CPU, whose pinned loop implementation launches a dozen kernels per tensor,
  each tensor the rank's optimizer steps over costs the fixed time ``update_probe`` measured.
  Where the record lists the sizes of the tensors the rank's optimizer steps over, a CPU's
  update of ``update_probe.REPLAY_FROM`` elements or more is instead replayed over tensors of
  those sizes (``update_probe.replay``): the rate follows each tensor's size, as a large one's
  temporaries are mapped afresh at every step.
  Where those tensors are DTensors (FSDP2's shards), each op is also dispatched through DTensor's
  sharding propagation: ``dtensor_update_probe`` steps over DTensors of the rank's own shapes, in
  its order, and the step pays what that took beyond plain tensors (over the core share).
* communication: each collective over its group (the world, or hybrid sharding's shard and
  replica groups) at the profile's ``calls x latency + ring bytes / bandwidth``
  (``network_profiles``), or each tier's share on a two-tier cluster (``cluster_network``), and
  how much of it is *exposed*, by these rules:

  - gradient reduction (DDP's buckets, ZeRO's reduce of each bucket) runs under backward: all but
    its last call is hidden behind backward compute (two thirds of ``compute``); what exceeds
    backward, and the last call, are exposed;
  - the parameters gathered *after* the optimizer step (ZeRO-1/2's all-gather, torch-zero1's
    broadcasts) wait for the update and are exposed;
  - the parameters gathered *before each unit* (ZeRO-3, FSDP2: in forward and again in
    backward) are prefetched while the previous unit computes: all but the first call are hidden
    behind compute; what exceeds it is exposed;
  - anything else (buffer broadcasts, flags) is exposed;
  - a profile whose collectives share the compute's cores (``shares_compute``: gloo on a CPU)
    hides nothing: every collective is exposed.
* call overhead: what each call costs inside a step beyond its barrier-aligned time, where the
  profile measured it (``in_step_call_s``: gloo's probe times calls inside steps of compute):
  each rank reaches a call when its own compute ends, so the call waits for the last rank, and
  the group's threads must win a core back from the compute. It counts every call over a group
  of more than one rank.
* buffer memory: what a strategy's communication buffers cost beyond their collectives, as it
  declares them. Where each gather writes into memory allocated for it and freed after its
  unit (zero3, FSDP2), every byte gathered is first touched afresh; where it then copies the
  gathered parameters out into memory of their own and the gradients into a reduce-scatter
  buffer (FSDP2), those bytes are copied and first touched too; where each gradient is copied
  into a bucket kept across steps before it is reduced (DDP, our ZeRO, DeepSpeed), its bytes
  are copied. ``copied bytes x seconds per
  copied byte + fresh bytes x seconds per fresh byte``: on a CPU the buffer-memory probe's
  (``update_probe.probe_buffer_memory``); on CUDA a read and a write of each copied byte at the
  datasheet's memory bandwidth, and no first touch (the caching allocator keeps freed blocks).

What it leaves out: where compute is FLOPs over a rate, the elementwise work and memory traffic
the FLOPs do not count (``EFFICIENCY`` stands for them); where it is replayed, what ``op_replay``
leaves out (the autograd engine between ops, fresh memory for activations); copies into and out
of the communication buckets beyond the gradients' copy in, the data loader, stragglers, and
contention on a link shared by more ranks than the profile's figure assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardbench.prediction.cluster_network import ClusterNetwork
from shardbench.prediction.network_profiles import NetworkProfile

#: the fraction of the peak a training step's counted FLOPs run at, by where the peak comes from,
#: where the compute was not replayed. Against a CPU's GEMM probe: 0.3, the order the committed
#: 2-rank CPU records of igpt-s reached once their update and communication are taken out (the
#: softmax, normalisation and elementwise work the FLOPs leave out run far below the GEMM rate).
#: Against a datasheet figure, a boost-clock ceiling: 0.5, the order large dense training steps
#: reach on such GPUs, stated.
EFFICIENCY = {"measured": 0.3, "datasheet": 0.5}
#: backward's share of a step's compute: twice forward's FLOPs (a gradient for the input and one
#: for the weight per product)
BACKWARD_SHARE = 2 / 3
ROLES = ("gradients", "parameters-after-step", "parameters-per-unit", "other")


@dataclass(frozen=True)
class Collective:
    """The collectives of one kind a rank issues in a step: full-tensor bytes in all, the calls,
    and their role (``ROLES``), which decides what overlaps them."""

    kind: str
    nbytes: int
    calls: int
    role: str = "other"
    #: the global ranks of the group it runs over (hybrid sharding's shard or replica group);
    #: empty: the whole world
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepInputs:
    flops: float  # hardware FLOPs of one rank's forward and backward
    rate: float  # FLOP/s one rank achieves
    #: the forward and backward's seconds where they were measured (an op replay on this CPU):
    #: taken over ``flops / rate``
    compute_s: float | None = None
    update_elements: int = 0
    seconds_per_element: float = 0.0
    #: the update's seconds where they were measured (a replay over the rank's own tensors):
    #: taken over ``update_elements x seconds_per_element`` and the per-tensor cost
    update_s: float | None = None
    #: the tensors the rank's optimizer steps over, and the fixed seconds each costs
    update_tensors: int = 0
    seconds_per_tensor: float = 0.0
    #: the seconds the update's DTensor dispatch adds to a step (none over plain tensors)
    dtensor_dispatch_s: float = 0.0
    collectives: tuple[Collective, ...] = ()
    world_size: int = 1
    #: the bytes the step copies through its communication buffers, the bytes of buffers it
    #: allocates afresh, and the seconds each costs
    copied_bytes: int = 0
    seconds_per_copied_byte: float = 0.0
    fresh_bytes: int = 0
    seconds_per_fresh_byte: float = 0.0


def core_share(ranks: int, cores: int | None, threads: int | None) -> float:
    """The fraction of its threads' cores a rank gets: ``cores / (ranks x threads)``, at most 1."""
    if not cores or not ranks:
        return 1.0
    return min(1.0, cores / (ranks * max(1, threads or 1)))


def predict_step(inputs: StepInputs, profile: NetworkProfile | ClusterNetwork) -> dict[str, float]:
    """The step's predicted seconds: ``step`` and its terms ``compute``, ``update``, ``comm``
    (every collective's time), ``exposed_comm`` (the part the rules above leave exposed),
    ``call_overhead`` (each call's in-step cost beyond its aligned time) and ``buffer_memory``
    (what the communication buffers cost beyond their collectives)."""
    if inputs.compute_s is not None:
        compute = inputs.compute_s
    else:
        compute = inputs.flops / inputs.rate if inputs.rate > 0 else 0.0
    if inputs.update_s is not None:
        update = inputs.update_s + inputs.dtensor_dispatch_s
    else:
        per_element = inputs.update_elements * inputs.seconds_per_element
        update = per_element + inputs.update_tensors * inputs.seconds_per_tensor + inputs.dtensor_dispatch_s
    backward = BACKWARD_SHARE * compute
    total = exposed = overhead = 0.0
    for c in inputs.collectives:
        group = c.ranks or tuple(range(inputs.world_size))
        t = profile.collective_seconds(c.kind, c.nbytes, c.calls, group)
        total += t
        if len(group) > 1:
            overhead += max(0, c.calls) * profile.in_step_call_s
        if profile.shares_compute or c.role in ("parameters-after-step", "other") or c.calls < 1:
            exposed += t
            continue
        first = t / c.calls  # the last bucket's reduce, or the first unit's gather
        under = backward if c.role == "gradients" else compute
        exposed += first + max(0.0, t - first - under)
    buffers = (
        inputs.copied_bytes * inputs.seconds_per_copied_byte
        + inputs.fresh_bytes * inputs.seconds_per_fresh_byte
    )
    return {
        "step": compute + update + exposed + overhead + buffers,
        "compute": compute,
        "update": update,
        "comm": total,
        "exposed_comm": exposed,
        "call_overhead": overhead,
        "buffer_memory": buffers,
    }
