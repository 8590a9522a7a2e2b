"""A record's predicted step time (``bench/prediction/step_time.py``) from what the record carries:
its FLOPs, the device's peak, the optimizer elements the ZeRO formula gives the rank, and the
collectives of its step; over a network profile (``--network``: gloo measured here at the
cell's world size, or a named GPU one).

The bytes of each collective are ``analytic.predicted_comm``'s for the profile's backend (gloo or
nccl: a strategy reduces its gradients differently on each); the calls are those the cell's own
step issued (``comm_per_step``: on real ranks, or on a simulated rank's fake group), matched by
role (the gradients' reduction, the parameters' gathers), since the calls follow the buckets and
units, whatever the backend. Collectives outside the prediction (buffer broadcasts, flags) are
costed as the step counted them.

The ``gloo`` profile and the update rate are probed once per machine, torch version, world size
and threads per rank, and cached in the results home (``peaks/network.json``,
``peaks/update.json``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardbench.metrics.analytic import predicted_comm
from shardbench.precision import MODEL_STATE_BYTES
from shardbench.prediction.network_profiles import MEASURED, NAMED, LinkCost, NetworkProfile, check_network
from shardbench.prediction.step_time import EFFICIENCY, Collective, StepInputs, core_share, predict_step
from shardbench.records import UNNAMED_DEVICE, Record, placement_of
from shardbench.wording import count

#: bytes AdamW moves per fp32 element it updates: it reads the parameter, its gradient and both
#: moments, and writes the parameter and the moments back
UPDATE_BYTES = 28
#: the share of a step's calls a replay may miss and still be its compute term; past it the model
#: counts compute from the FLOPs at a stated efficiency
UNREPLAYED_MAX = 0.05
#: replays made or read by this process, by ``compute_key``: a process that assembles many cells
#: (a suite, the tests' runs) replays each step once
_REPLAYED: dict[str, dict[str, Any]] = {}
#: probes as the caches call them: (world size, threads) -> figures; (threads, elements,
#: copies) -> figures
NetworkMeasure = Callable[[int, int], dict[str, Any]]
UpdateMeasure = Callable[[int, int, int], dict[str, Any]]


def gloo_profile(
    world_size: int,
    threads: int,
    device_name: str,
    torch_version: str,
    *,
    home: Path | None = None,
    measure: NetworkMeasure | None = None,
) -> NetworkProfile:
    """The gloo profile of this machine at ``world_size`` ranks of ``threads`` threads each."""
    from shardbench.harness.config import available_cores
    from shardbench.prediction.probe_cache import cached

    if measure is None:
        from shardbench.prediction.gloo_probe import probe as measure
    key = network_key(world_size, threads, device_name, torch_version, available_cores())
    entry = cached("network", key, lambda: measure(world_size, threads), home)
    kinds = {k: LinkCost(v["latency_s"], v["bandwidth"]) for k, v in entry["kinds"].items()}
    default = kinds.get("all_reduce") or next(iter(kinds.values()))
    return NetworkProfile(
        MEASURED,
        default,
        f"gloo probe at N={world_size}, {count(threads, 'thread')} per rank, "
        f"measured {entry.get('measured_at')}",
        by_kind=kinds,
        shares_compute=True,
    )


def network_key(world_size: int, threads: int, device_name: str, torch_version: str, cores: int) -> str:
    """What makes two gloo probes the same measurement: the CPU, torch (gloo comes with it), the
    ranks, their threads and the cores they share."""
    return f"{device_name} | torch {torch_version} | {world_size} ranks | {threads} threads | {cores} cores"


def update_rate(
    threads: int,
    elements: int,
    copies: int,
    device_name: str,
    torch_version: str,
    *,
    home: Path | None = None,
    measure: UpdateMeasure | None = None,
) -> float:
    """Seconds per element of an AdamW step on this CPU at ``threads`` for a rank that updates
    ``elements``, ``copies`` ranks at once (``update_probe``)."""
    from shardbench.harness.config import available_memory
    from shardbench.prediction.probe_cache import cached
    from shardbench.prediction.update_probe import size_for

    if measure is None:
        from shardbench.prediction.update_probe import probe as measure
    size = size_for(elements, copies, available_memory())
    key = update_key(threads, size, copies, device_name, torch_version)
    return cached("update", key, lambda: measure(threads, size, copies), home)["seconds_per_element"]


def update_key(threads: int, size: int, copies: int, device_name: str, torch_version: str) -> str:
    """What makes two update probes the same measurement: the CPU, torch, the threads, the
    elements probed and the copies at once."""
    return f"{device_name} | torch {torch_version} | {threads} threads x {copies} | {size} elements"


def replayed_compute(
    trace: list[list[Any]],
    threads: int,
    copies: int,
    device_name: str,
    torch_version: str,
    *,
    home: Path | None = None,
) -> dict[str, Any]:
    """One rank's forward and backward replayed op by op on this CPU at ``threads``, ``copies``
    at once (``op_replay``; ``replay_copies``): its compute ``seconds`` and how the replay went,
    cached by the step's calls in the results home and for the life of the process."""
    from shardbench.prediction.op_calls import signature
    from shardbench.prediction.op_replay import replay
    from shardbench.prediction.probe_cache import cached

    def measure() -> dict[str, Any]:
        return {**replay(trace, threads=threads, device="cpu", copies=copies), "threads": threads}

    key = compute_key(signature(trace), threads, copies, device_name, torch_version)
    if key not in _REPLAYED:
        _REPLAYED[key] = cached("compute", key, measure, home)
    return _REPLAYED[key]


def replay_usable(replayed: dict[str, Any] | None) -> bool:
    """Whether a replay stands for the step: it replayed all but ``UNREPLAYED_MAX`` of the calls."""
    if not replayed or not replayed.get("calls"):
        return False
    return replayed.get("unreplayed_calls", 0) <= UNREPLAYED_MAX * replayed["calls"]


def compute_key(trace_signature: str, threads: int, copies: int, device_name: str, torch_version: str) -> str:
    """What makes two replays the same measurement: the step's calls, the CPU, torch, the
    threads and the copies replayed at once."""
    return f"{device_name} | torch {torch_version} | {threads} threads x {copies} | step {trace_signature}"


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


def collectives(record: Record, backend: str, shape: Any | None) -> tuple[Collective, ...]:
    """The step's collectives on ``backend``, by role: predicted bytes, the cell's own calls."""
    from shardbench.strategies.registry import get_strategy

    strategy = get_strategy(record.strategy)
    counted = (record.comm_per_step or {}).get("ops") or {}
    target = strategy.communication(record.precision, backend)
    own = strategy.communication(record.precision, record.backend) if record.backend != "none" else None
    if target is None or own is None:  # a strategy whose communication is not declared: as counted
        return tuple(Collective(k, int(v["bytes"]), int(v["calls"])) for k, v in sorted(counted.items()))
    n = record.world_size
    if shape is not None:
        predicted = predicted_comm(target, shape, n)["ops"]
    else:
        predicted = (record.predicted_comm or {}).get("ops") or {}
    grad_kind, own_grad = target.gradient_collective(n), own.gradient_collective(n)
    param_role = "parameters-per-unit" if target.gathers > 1 else "parameters-after-step"
    roles = {grad_kind: ("gradients", own_grad), target.parameters: (param_role, own.parameters)}
    out = []
    for kind, (role, own_kind) in roles.items():
        if kind is None or kind not in predicted:
            continue
        calls = int((counted.get(own_kind) or {}).get("calls") or 1)
        out.append(Collective(kind, int(predicted[kind]["bytes"]), calls, role))
    claimed = {own_grad, own.parameters}
    for kind, v in sorted(counted.items()):  # small collectives outside the prediction
        if kind not in claimed:
            out.append(Collective(kind, int(v["bytes"]), int(v["calls"])))
    return tuple(out)


def _compute_source(replay: dict[str, Any] | None, used: bool) -> str:
    """How the prediction reached its compute, and why not by the replay where one was made."""
    if used:
        return "op replay"
    if replay:
        missed = f"{replay.get('unreplayed_calls', 0):,} of {replay.get('calls', 0):,}"
        return f"FLOPs at peak x efficiency (the op replay missed {missed} calls)"
    return "FLOPs at peak x efficiency"


def predict_record(
    record: Record,
    *,
    network: str,
    peak: dict[str, Any] | None = None,
    shape: Any | None = None,
    home: Path | None = None,
    measure_network: NetworkMeasure | None = None,
    measure_update: UpdateMeasure | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The record's ``predicted_step_time`` (seconds and how they were reached), or None and why
    not. ``peak``: the device's (default: the record's own); ``shape``: the model's
    ``CommShape`` (default: the record's predicted bytes, on its own backend)."""
    from shardbench.strategies.registry import get_strategy

    check_network(network)
    flops = (record.flops_per_step or {}).get("hardware")
    peak = peak or record.peak_flops_per_s
    if not flops:
        return None, "no step time predicted (no FLOPs counted)"
    if not peak:
        return None, "no step time predicted (no peak FLOP/s for the device)"
    name = record.env.get("device_name") or UNNAMED_DEVICE
    torch_version = record.env.get("torch") or "?"
    cpu = record.device == "cpu"
    threads = rank_threads(record)
    n = record.world_size
    placed = placement_of(record)
    # a simulated rank stands for N ranks on this host: they share its cores as a real run would
    ranks = n if record.simulated else placed.get("ranks", n)
    share = core_share(ranks, placed.get("cores"), threads) if cpu else 1.0
    efficiency = EFFICIENCY.get(peak.get("kind", "measured"), 1.0)
    rate = peak["flops_per_s"] * efficiency * share
    replayed = record.compute_replay if cpu and replay_usable(record.compute_replay) else None
    strategy = get_strategy(record.strategy)
    held = (record.predicted_mem_bytes or {}).get("optimizer") or 0
    per_element = MODEL_STATE_BYTES[strategy.model_state_precision(record.precision)].optimizer
    elements = held // per_element
    if cpu:  # the rank's size, beside the other ranks, on the rank's share of the cores
        copies = replay_copies(record)
        spe = update_rate(threads, elements, copies, name, torch_version, home=home, measure=measure_update)
        spe /= share
    else:  # memory-bound: the bytes AdamW moves per element over the datasheet's memory bandwidth
        memory = peak.get("memory_bytes_per_s")
        spe = UPDATE_BYTES / memory if memory else 0.0
    if network == MEASURED:
        if not cpu:
            return (
                None,
                "no step time predicted (the gloo profile is this CPU's: use a named --network on CUDA)",
            )
        profile = NetworkProfile(MEASURED, LinkCost(0.0, float("inf")), "one rank", shares_compute=True)
        if n > 1:
            profile = gloo_profile(n, threads, name, torch_version, home=home, measure=measure_network)
        backend = "gloo"
    else:
        profile, backend = NAMED[network], "nccl"
    inputs = StepInputs(
        flops=flops,
        rate=rate,
        compute_s=replayed["seconds"] / share if replayed else None,
        update_elements=elements,
        seconds_per_element=spe,
        collectives=collectives(record, backend, shape) if n > 1 else (),
        world_size=n,
    )
    seconds = predict_step(inputs, profile)
    step = seconds["step"]
    tokens = (record.flops_per_step or {}).get("tokens_per_sample")
    return {
        **seconds,
        "tokens_per_s": record.batch_size_per_rank * n * tokens / step if tokens and step else None,
        "mfu": record.flops_per_step["model"] / step / peak["flops_per_s"] if step else None,
        "peak_flops_per_s": peak["flops_per_s"],
        "shares_compute": profile.shares_compute,
        "network": profile.name,
        "network_source": profile.source,
        "compute_source": _compute_source(record.compute_replay if cpu else None, replayed is not None),
        "rate_flops_per_s": None if replayed else rate,
        "peak_kind": peak.get("kind"),
        "efficiency": None if replayed else efficiency,
        "core_share": share,
        "seconds_per_update_element": spe,
    }, None
