"""A record's predicted step time (``bench/prediction/step_time.py``) from what the record carries:
its FLOPs, the device's peak, the optimizer elements the ZeRO formula gives the rank, and the
collectives of its step; over a network profile (``--network``: gloo measured here at the
cell's world size, or a named GPU one).

The bytes of each collective are ``metrics.analytic.predicted_comm``'s for the profile's backend
(gloo or nccl: a strategy reduces its gradients differently on each); the calls are those the
cell's own step issued (``comm_per_step``: on real ranks, or on a simulated rank's fake group),
matched by role (the gradients' reduction, the parameters' gathers), since the calls follow the
buckets and units, whatever the backend. Where our ZeRO's reducer reduces each bucket's chunks to
their owners (gloo, from ``GLOO_REDUCE_FROM`` ranks), a bucket's calls run at once: they count as
one ``reduce_to_owners`` per bucket, at the rate the gloo probe measured for that pattern.
Collectives outside the prediction (buffer broadcasts, flags) are costed as the step counted
them, but for those the model's loss issued itself where the compute is the cell's timed bare
pass, which holds them (``bare_compute.collectives``). That compute is the median over the
passes of this machine's newest cells of the same model at the same placement (``bare_pool``),
where kept.

The ``gloo`` profile, the update (its rate and per-tensor cost, or its replay over the rank's own
tensors, and the DTensor dispatch), the buffer-memory rates and the compute's replay are this
machine's probes (``machine_probes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardbench.metrics.analytic import Send, comm_sends
from shardbench.precision import MODEL_STATE_BYTES
from shardbench.prediction.cluster_network import ClusterNetwork, check_any_network, cluster_network
from shardbench.prediction.gloo_tiers import GlooTwoTier
from shardbench.prediction.machine_probes import MachineProbes
from shardbench.prediction.network_profiles import MEASURED, NAMED, LinkCost, NetworkProfile
from shardbench.prediction.step_time import EFFICIENCY, Collective, StepInputs, core_share, predict_step
from shardbench.prediction.update_probe import REPLAY_FROM
from shardbench.records import UNNAMED_DEVICE, Record, placement_of
from shardbench.step_figures import ComputeReplay, PredictedStep

if TYPE_CHECKING:
    from shardbench.strategies.base import Strategy

#: bytes AdamW moves per fp32 element it updates: it reads the parameter, its gradient and both
#: moments, and writes the parameter and the moments back
UPDATE_BYTES = 28
#: how a prediction reached its compute where the cell's ranks timed the bare model
BARE_SOURCE = "the model's own forward and backward, timed on the cell's ranks before the strategy wrapped it"
#: the share of a step's calls a replay may miss and still be its compute term; past it the model
#: counts compute from the FLOPs at a stated efficiency
UNREPLAYED_MAX = 0.05


def replay_usable(replayed: ComputeReplay | None) -> bool:
    """Whether a replay stands for the step: it replayed all but ``UNREPLAYED_MAX`` of the calls."""
    if not replayed or not replayed.calls:
        return False
    return replayed.unreplayed_calls <= UNREPLAYED_MAX * replayed.calls


def rank_threads(record: Record) -> int:
    """The threads one of the cell's ranks computes with: the record's own, but a simulated rank
    stands for N ranks on this host, each with the threads a real run would give it
    (``threads_per_rank``), whatever the one simulated process had."""
    if record.simulated and record.device == "cpu":
        from shardbench.harness.config import threads_per_rank

        return threads_per_rank(record.world_size)
    return record.threads_per_rank or 1


def replay_copies(record: Record) -> int:
    """How many copies of a rank's step to replay at once: the cell's ranks on this host (a
    simulated rank stands for N), as many as have their threads' cores. Ranks past the cores
    take turns on them, which the core share (``core_share``) counts instead of more copies."""
    from shardbench.harness.config import available_cores

    placed = placement_of(record)
    ranks = record.world_size if record.simulated else placed.get("ranks", record.world_size)
    cores = placed.get("cores") or available_cores()
    return max(1, min(ranks, cores // rank_threads(record)))


def _less_the_loss_own(
    counted: dict[str, dict[str, Any]], own: dict[str, dict[str, int]]
) -> dict[str, dict[str, Any]]:
    """The step's counted collectives without those its model's loss issued itself (``own``,
    counted in the bare pass, whose time holds them): a kind none of whose calls is left goes."""
    out = {}
    for kind, v in counted.items():
        mine = own.get(kind) or {}
        calls = int(v["calls"]) - int(mine.get("calls") or 0)
        if calls > 0:
            out[kind] = {**v, "calls": calls, "bytes": max(0, int(v["bytes"]) - int(mine.get("bytes") or 0))}
    return out


def collectives(
    record: Record, strategy: Strategy, backend: str, shape: Any | None, uses_bare: bool = False
) -> tuple[Collective, ...]:
    """The step's collectives on ``backend``, by role and group: predicted bytes, the cell's own
    calls. ``uses_bare``: the compute is the bare pass's, which holds the collectives the loss
    issued itself; they are left out here."""
    counted = _less_the_loss_own(
        (record.comm_per_step or {}).get("ops") or {},
        (record.bare_compute.collectives if record.bare_compute and uses_bare else None) or {},
    )
    target = strategy.communication(record.precision, backend)
    own = strategy.communication(record.precision, record.backend) if record.backend != "none" else None
    if target is None or own is None:  # a strategy whose communication is not declared: as counted
        return tuple(Collective(k, int(v["bytes"]), int(v["calls"])) for k, v in sorted(counted.items()))
    n, s = record.world_size, record.shard_group or record.world_size
    grouped = s < n
    own_grad = own.gradient_collective(s if grouped else n, grouped=grouped)
    own_kinds = {"gradients": own_grad, "replicas": own_grad, "parameters": own.parameters}
    param_role = "parameters-per-unit" if target.gathers > 1 else "parameters-after-step"
    roles = {"gradients": "gradients", "replicas": "gradients", "parameters": param_role}
    out = []
    for send in _sends(record, target, shape, s):
        calls = int((counted.get(own_kinds[send.purpose]) or {}).get("calls") or 1)
        if send.purpose != "parameters" and _reduces_to_owners(own, own_kinds[send.purpose]):
            calls = max(1, calls // s)  # one call per owner of each bucket: a bucket is one site
        kind = send.kind
        if send.purpose != "parameters" and _reduces_to_owners(target, kind):
            kind = "reduce_to_owners"
        ranks = tuple(send.group_ranks(n, s))
        out.append(Collective(kind, send.nbytes, calls, roles[send.purpose], ranks))
    claimed = {own_grad, own.parameters} | ({"all_reduce"} if grouped else set())
    for kind, v in sorted(counted.items()):  # small collectives outside the prediction
        if kind not in claimed:
            out.append(Collective(kind, int(v["bytes"]), int(v["calls"])))
    return tuple(out)


def _reduces_to_owners(communication: Any, kind: str) -> bool:
    """Whether ``kind`` is our ZeRO reducer's reduce of each bucket's chunks to their owners: one
    call per owner, issued back to back and waited together (``gloo_probe``'s
    ``reduce_to_owners``), rather than a strategy's single reduce of a tensor to one rank."""
    return kind == "reduce" and communication.gradients is None


def _sends(record: Record, target: Any, shape: Any | None, shard_size: int) -> list[Send]:
    """What the record's rank sends on the target backend: from the model's shape where known,
    else the record's own predicted bytes per kind (over the world)."""
    n = record.world_size
    if shape is not None:
        return comm_sends(target, shape, n, shard_size)
    predicted = (record.predicted_comm or {}).get("ops") or {}
    grad_kind = target.gradient_collective(n)
    return [
        Send(kind, int(v["bytes"]), n, "world", "gradients" if kind == grad_kind else "parameters")
        for kind, v in sorted(predicted.items())
        if kind in (grad_kind, target.parameters)
    ]


def _bare_seconds(bare: Any) -> float:
    """The compute of timed bare passes: the pooled median where kept, else the cell's own."""
    return bare.pooled_seconds or bare.seconds


def _bare_source(bare: Any) -> str:
    """How a prediction reached its compute from timed bare passes: the cell's own, or the
    median over this machine's newest cells' passes of the same model (``bare_pool``)."""
    if bare.pooled_seconds and (bare.pooled_cells or 0) > 1:
        newest = f"this machine's newest {bare.pooled_cells} cells"
        if not bare.pooled_passes:  # a record whose pool held each cell's median
            return f"{BARE_SOURCE}: the median of {newest}' timings of it"
        return f"{BARE_SOURCE}: the median of {bare.pooled_passes} passes over {newest}"
    return BARE_SOURCE


def _compute_source(replay: ComputeReplay | None, used: ComputeReplay | None) -> str:
    """How the prediction reached its compute, and why not by the replay where one was made."""
    if used:
        return "op replay"
    if replay:
        missed = f"{replay.unreplayed_calls:,} of {replay.calls:,}"
        return f"FLOPs at peak x efficiency (the op replay missed {missed} calls)"
    return "FLOPs at peak x efficiency"


def predict_record(
    record: Record,
    *,
    network: str,
    peak: dict[str, Any] | None = None,
    shape: Any | None = None,
    probes: MachineProbes | None = None,
    strategy: Strategy | None = None,
    ranks_per_node: int | None = None,
    timed_compute: bool = True,
) -> tuple[PredictedStep | None, str | None]:
    """The record's ``predicted_step_time`` (seconds and how they were reached), or None and why
    not. ``peak``: the device's (default: the record's own); ``shape``: the model's
    ``CommShape`` (default: the record's predicted bytes, on its own backend); ``probes``: this
    machine's (default: those cached in the user's results home); ``strategy``: the record's
    (default: from its name); ``ranks_per_node``: the nodes' size a two-tier network places the
    ranks by (default: the named cluster's); ``timed_compute``: False predicts as a plan would,
    from the replay, even where the cell timed its own forward and backward (the model's check
    of the prediction ``plan`` makes)."""
    check_any_network(network, ranks_per_node)
    counted = record.flops_per_step
    peak = peak or record.peak_flops_per_s
    if why := _cannot_predict(record, peak, network):
        return None, why
    cpu = record.device == "cpu"
    probes = probes if probes is not None else MachineProbes()
    share = _core_share(record) if cpu else 1.0
    efficiency = EFFICIENCY.get(peak.get("kind", "measured"), 1.0)
    rate = peak["flops_per_s"] * efficiency * share
    bare = record.bare_compute if cpu and timed_compute else None
    replayed = record.compute_replay if cpu and not bare and replay_usable(record.compute_replay) else None
    strategy = strategy or _strategy_of(record)
    replayed_update = _replayed_update(record, share, probes)
    if replayed_update is None:
        elements, spe = _update(record, strategy, peak, share, probes)
        tensors, spt = _update_tensors(record, share, probes)
    else:  # the replay stands for the rate and the per-tensor cost: neither is probed
        elements, spe, tensors, spt = 0, 0.0, 0, 0.0
    dispatch = _dtensor_dispatch(record, share, probes)
    profile, backend = _profile(record, network, probes, ranks_per_node)
    n = record.world_size
    sent = collectives(record, strategy, backend, shape, uses_bare=bool(bare)) if n > 1 else ()
    copied, fresh, per_copied, per_fresh = _buffer_memory(record, strategy, sent, peak, share, probes)
    inputs = StepInputs(
        flops=counted.hardware,
        rate=rate,
        compute_s=_bare_seconds(bare) if bare else replayed.seconds / share if replayed else None,
        update_elements=elements,
        seconds_per_element=spe,
        update_s=replayed_update,
        update_tensors=tensors,
        seconds_per_tensor=spt,
        dtensor_dispatch_s=dispatch,
        collectives=sent,
        world_size=n,
        copied_bytes=copied,
        seconds_per_copied_byte=per_copied,
        fresh_bytes=fresh,
        seconds_per_fresh_byte=per_fresh,
    )
    seconds = predict_step(inputs, profile)
    step, tokens = seconds["step"], counted.tokens_per_sample
    return PredictedStep(
        **seconds,
        tokens_per_s=record.batch_size_per_rank * n * tokens / step if tokens and step else None,
        mfu=counted.model / step / peak["flops_per_s"] if step else None,
        peak_flops_per_s=peak["flops_per_s"],
        shares_compute=profile.shares_compute,
        network=profile.name,
        network_source=profile.source if isinstance(profile, NetworkProfile) else profile.describe(),
        compute_source=_bare_source(bare) if bare else _compute_source(record.compute_replay, replayed),
        compute_basis="measured" if bare else "replayed" if replayed else "flops",
        rate_flops_per_s=None if replayed or bare else rate,
        peak_kind=peak.get("kind"),
        efficiency=None if replayed or bare else efficiency,
        core_share=share,
        seconds_per_update_element=spe if replayed_update is None else _per_element(record, replayed_update),
    ), None


def _cannot_predict(record: Record, peak: dict[str, Any] | None, network: str) -> str | None:
    """Why the record's step time cannot be predicted on ``network``, or None when it can."""
    counted = record.flops_per_step
    if not counted or not counted.hardware:
        return "no step time predicted (no FLOPs counted)"
    if not peak:
        return "no step time predicted (no peak FLOP/s for the device)"
    if network == MEASURED and record.device != "cpu":
        return "no step time predicted (the gloo profile is this CPU's: use a named --network on CUDA)"
    return None


def _strategy_of(record: Record) -> Strategy:
    from shardbench.strategies.registry import get_strategy

    return get_strategy(record.strategy)


def _machine(record: Record) -> tuple[str, str]:
    """The record's CPU and torch, which the probes are keyed by."""
    return record.env.get("device_name") or UNNAMED_DEVICE, record.env.get("torch") or "?"


def _core_share(record: Record) -> float:
    """A CPU rank's share of its threads' cores; a simulated rank stands for N ranks on this
    host: they share its cores as a real run would."""
    n = record.world_size
    placed = placement_of(record)
    ranks = n if record.simulated else placed.get("ranks", n)
    return core_share(ranks, placed.get("cores"), rank_threads(record))


def _update(
    record: Record, strategy: Strategy, peak: dict[str, Any], share: float, probes: MachineProbes
) -> tuple[int, float]:
    """The optimizer elements the rank updates and the seconds each takes: on a CPU the update
    probe's, at the rank's size beside the other ranks and on its share of the cores; elsewhere
    (memory-bound) the bytes AdamW moves per element over the datasheet's memory bandwidth."""
    held = (record.predicted_mem_bytes or {}).get("optimizer") or 0
    precision = strategy.model_state_precision(record.precision)
    elements = held // MODEL_STATE_BYTES[precision].optimizer
    if record.device == "cpu":
        threads, copies = rank_threads(record), replay_copies(record)
        return elements, probes.update_rate(threads, elements, copies, *_machine(record)) / share
    memory = peak.get("memory_bytes_per_s")
    return elements, UPDATE_BYTES / memory if memory else 0.0


def _replayed_update(record: Record, share: float, probes: MachineProbes) -> float | None:
    """The rank's update replayed over its own tensors' sizes on this CPU, over its core share
    (``update_probe.replay``); None on CUDA, on a record that did not list them, on a rank that
    updates fewer than ``REPLAY_FROM`` elements, or where the copies would not fit in memory
    (the update is then the rate probe's and the per-tensor cost)."""
    sizes = record.optimizer_tensor_elements
    if record.device != "cpu" or not sizes or sum(sizes) < REPLAY_FROM:
        return None
    seconds = probes.replayed_update(sizes, rank_threads(record), replay_copies(record), *_machine(record))
    return None if seconds is None else seconds / share


def _per_element(record: Record, update_s: float) -> float:
    """A replayed update's seconds per element the rank updates (what ``plan`` shows)."""
    return update_s / max(1, sum(record.optimizer_tensor_elements or ()))


def _update_tensors(record: Record, share: float, probes: MachineProbes) -> tuple[int, float]:
    """The tensors the rank's optimizer steps over and the fixed seconds each costs: on a CPU the
    per-tensor probe's over the rank's core share; none counted elsewhere (CUDA's implementation
    updates a device's tensors in a few launches) or on a record that did not count them."""
    tensors = record.optimizer_tensors or 0
    if record.device != "cpu" or not tensors:
        return 0, 0.0
    return tensors, probes.update_tensor_seconds(rank_threads(record), *_machine(record)) / share


def _dtensor_dispatch(record: Record, share: float, probes: MachineProbes) -> float:
    """The seconds a step's update spends dispatching its ops through DTensor's sharding
    propagation, over the rank's core share: on a CPU the DTensor update probe's over the shapes
    the rank's optimizer stepped (``dtensor_update_probe``); none on CUDA (whose update the model
    counts by bytes alone, as it counts no per-tensor cost there) or where the optimizer steps
    over no DTensor."""
    shapes = record.optimizer_dtensor_shapes
    if record.device != "cpu" or not shapes:
        return 0.0
    return probes.dtensor_dispatch_seconds(shapes, rank_threads(record), *_machine(record)) / share


def _buffer_memory(
    record: Record,
    strategy: Strategy,
    sent: tuple[Collective, ...],
    peak: dict[str, Any],
    share: float,
    probes: MachineProbes,
) -> tuple[int, int, float, float]:
    """What the rank's communication buffers cost in a step beyond their collectives, as its
    strategy declares them (``Communication.gathers_into_fresh_memory``,
    ``copies_through_buffers``, ``copies_gradients_into_buckets``), over the bytes of its step's
    collectives ``sent``: the bytes copied (each gather's parameters copied out of its buffer,
    the gradients into a reduce-scatter buffer or into buckets kept across steps) and the bytes
    of buffers allocated afresh (each gather's, and those the copies out and in write); and the
    seconds per byte of each: this CPU's buffer-memory probe over the rank's core share, or on
    CUDA a read and a write at the datasheet's memory bandwidth and no first touch (its caching
    allocator keeps freed blocks)."""
    backend = record.backend if record.backend != "none" else "gloo"
    declared = strategy.communication(record.precision, backend)
    if declared is None:
        return 0, 0, 0.0, 0.0
    fresh_gathers = declared.gathers_into_fresh_memory
    gathered = sum(c.nbytes for c in sent if c.role.startswith("parameters")) if fresh_gathers else 0
    scattered = sum(c.nbytes for c in sent if c.role == "gradients" and c.kind == "reduce_scatter")
    through = gathered + scattered if declared.copies_through_buffers else 0
    bucketed = sum(c.nbytes for c in sent if c.role == "gradients")
    bucketed = bucketed if declared.copies_gradients_into_buckets else 0
    copied, fresh = through + bucketed, gathered + through
    if not copied and not fresh:
        return 0, 0, 0.0, 0.0
    if record.device == "cpu":
        copy_s, fresh_s = probes.buffer_memory_rates(
            rank_threads(record), replay_copies(record), *_machine(record)
        )
        return copied, fresh, copy_s / share, fresh_s / share
    memory = peak.get("memory_bytes_per_s")
    return copied, fresh, 2 / memory if memory else 0.0, 0.0


def _profile(
    record: Record, network: str, probes: MachineProbes, ranks_per_node: int | None = None
) -> tuple[NetworkProfile | ClusterNetwork | GlooTwoTier, str]:
    """The network profile the collectives are costed on, and the backend whose bytes they
    are: gloo's measured here (one rank alone sends nothing), or a named one over nccl: a flat
    link, or a cluster of two tiers (``cluster_network``)."""
    if (cluster := cluster_network(network, ranks_per_node)) is not None:
        return cluster, "nccl"
    if network != MEASURED:
        return NAMED[network], "nccl"
    n = record.world_size
    if n == 1:
        return NetworkProfile(MEASURED, LinkCost(0.0, float("inf")), "one rank", shares_compute=True), "gloo"
    if ranks_per_node and 1 < ranks_per_node < n and n % ranks_per_node == 0:  # nodes: two tiers
        return probes.gloo_two_tier(n, ranks_per_node, rank_threads(record), *_machine(record)), "gloo"
    return probes.gloo_profile(n, rank_threads(record), *_machine(record)), "gloo"
