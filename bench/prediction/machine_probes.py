"""This machine's probes as the step-time model asks for them: the ``gloo`` network profile
(``gloo_probe``), AdamW's update rate (``update_probe``; over DTensors, ``dtensor_update_probe``)
and a step's op replay (``op_replay``).

Each is measured once per machine, torch version and what else makes two probes the same
measurement (the keys below), and cached in the results home (``probe_cache``:
``peaks/network.json``, ``peaks/update.json``, ``peaks/compute.json``). A ``MachineProbes``
holds the replays it made or read besides, for the life of its owner (the assembly of a run's
records, a command): an owner never inherits another's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.prediction.network_profiles import MEASURED, LinkCost, NetworkProfile
from shardbench.step_figures import ComputeReplay
from shardbench.step_figures import from_json as figures
from shardbench.wording import count

if TYPE_CHECKING:
    from shardbench.prediction.gloo_tiers import GlooTwoTier
    from shardbench.prediction.op_calls import OpCall

#: probes as the caches call them: (world size, threads[, groups probed at once]) -> figures;
#: (threads, elements, copies) -> figures
NetworkMeasure = Callable[..., dict[str, Any]]
UpdateMeasure = Callable[[int, int, int], dict[str, Any]]


def network_key(world_size: int, threads: int, device_name: str, torch_version: str, cores: int) -> str:
    """What makes two gloo probes the same measurement: the CPU, torch (gloo comes with it), the
    ranks, their threads, the cores they share and how they sit on them (``core_binding``), and
    the kinds timed, the calls timed at each size (a figure of fewer calls is another, noisier
    measurement) and how a step's calls are timed (``gloo_probe.in_step``)."""
    from shardbench.core_binding import binding_key
    from shardbench.prediction.gloo_probe import IN_STEP_CALLS, IN_STEP_COMPUTE_S, KINDS, REPEATS

    calls = "/".join(str(REPEATS[size]) for size in sorted(REPEATS))
    return (
        f"{device_name} | torch {torch_version} | {world_size} ranks | {threads} threads | {cores} cores"
        f" | {binding_key(world_size)} | {'/'.join(KINDS)} | {calls} calls"
        f" | in a step {IN_STEP_CALLS} calls in {IN_STEP_COMPUTE_S * 1e3:g} ms"
    )


def update_key(threads: int, size: int, copies: int, device_name: str, torch_version: str) -> str:
    """What makes two update probes the same measurement: the CPU, torch, the threads, the
    elements probed and the copies at once, and how the copies sit on the cores."""
    from shardbench.core_binding import binding_key

    return (
        f"{device_name} | torch {torch_version} | {threads} threads x {copies} | {binding_key(copies)}"
        f" | {size} elements"
    )


def update_tensor_key(threads: int, device_name: str, torch_version: str) -> str:
    """What makes two per-tensor update probes the same measurement: the CPU, torch, the threads."""
    return update_key(threads, 0, 1, device_name, torch_version) + " | per tensor"


def buffer_memory_key(threads: int, copies: int, device_name: str, torch_version: str) -> str:
    """What makes two buffer-memory probes the same measurement: as the update probe's, at no
    size."""
    return update_key(threads, 0, copies, device_name, torch_version) + " | buffer memory"


def _digest(items: Sequence[Any]) -> str:
    return hashlib.sha1(json.dumps(list(items)).encode()).hexdigest()[:12]


def update_replay_key(
    sizes: Sequence[int], threads: int, copies: int, device_name: str, torch_version: str
) -> str:
    """What makes two replays of an update the same measurement: as the update probe's, and the
    tensors' sizes in their order (by digest)."""
    machine = update_key(threads, sum(sizes), copies, device_name, torch_version)
    return f"{machine} | replayed over {count(len(sizes), 'tensor')} {_digest(sizes)}"


def dtensor_update_key(
    shapes: Sequence[Sequence[int]], threads: int, device_name: str, torch_version: str
) -> str:
    """What makes two DTensor update probes the same measurement: as the per-tensor probe's,
    and the shapes in their order (by digest)."""
    digest = _digest([list(s) for s in shapes])
    shown = f"{count(len(shapes), 'DTensor')} of {count(len(set(map(tuple, shapes))), 'shape')}"
    machine = update_key(threads, 0, 1, device_name, torch_version)
    return f"{machine} | DTensor dispatch over {shown} {digest}"


def compute_key(calls_signature: str, threads: int, copies: int, device_name: str, torch_version: str) -> str:
    """What makes two replays the same measurement: the step's calls, the CPU, torch, the
    threads and the copies replayed at once, and how the copies sit on the cores."""
    from shardbench.core_binding import binding_key

    return (
        f"{device_name} | torch {torch_version} | {threads} threads x {copies} | {binding_key(copies)}"
        f" | step {calls_signature}"
    )


@dataclass
class MachineProbes:
    """The probes one owner asks for. ``home``: the results home they are cached in (default:
    the user's); ``measure_network`` and ``measure_update``: the probes to run on a miss
    (default: ``gloo_probe.probe``, ``update_probe.probe``; a test gives stand-ins), and
    ``measure_update_per_tensor`` (default: ``update_probe.probe_per_tensor``),
    ``measure_buffer_memory`` (default: ``update_probe.probe_buffer_memory``),
    ``measure_update_replay`` (default: ``update_probe.replay``) and ``measure_dtensor_update``
    (default: ``dtensor_update_probe.probe_dtensor_update``)."""

    home: Path | None = None
    measure_network: NetworkMeasure | None = None
    measure_update: UpdateMeasure | None = None
    measure_update_per_tensor: Callable[[int], dict[str, Any]] | None = None
    measure_buffer_memory: Callable[[int, int], dict[str, Any]] | None = None
    measure_update_replay: Callable[[Sequence[int], int, int], dict[str, Any]] | None = None
    measure_dtensor_update: Callable[[Sequence[Sequence[int]], int], dict[str, Any]] | None = None
    #: the replays made or read so far, by ``compute_key``: many cells of one step replay it once
    _replayed: dict[str, ComputeReplay] = field(default_factory=dict, repr=False)
    #: the probes that failed so far, by key, and why: asked again, they fail at once
    _failed: dict[str, str] = field(default_factory=dict, repr=False)

    def gloo_profile(
        self,
        world_size: int,
        threads: int,
        device_name: str,
        torch_version: str,
        tier: tuple[str, int] | None = None,
    ) -> NetworkProfile:
        """The gloo profile of this machine at ``world_size`` ranks of ``threads`` threads each;
        with ``tier`` (``within`` or ``across``, and the ranks per node), that tier's groups
        probed at once (``gloo_probe.tier_groups``)."""
        from shardbench.harness.config import available_cores
        from shardbench.prediction.gloo_probe import tier_groups
        from shardbench.prediction.probe_cache import cached

        measure = self.measure_network
        if measure is None:
            from shardbench.prediction.gloo_probe import probe as measure
        key = network_key(world_size, threads, device_name, torch_version, available_cores())
        groups = tier_groups(world_size, tier[1], tier[0]) if tier else None
        if groups is not None:
            key += f" | {tier[0]} groups {groups}"

        def run_probe() -> dict[str, Any]:
            return measure(world_size, threads, groups) if groups else measure(world_size, threads)

        entry = cached("network", key, run_probe, self.home)
        kinds = {k: LinkCost(v["latency_s"], v["bandwidth"]) for k, v in entry["kinds"].items()}
        default = kinds.get("all_reduce") or next(iter(kinds.values()))
        probed = f"{len(groups)} groups of {len(groups[0])} at once" if groups else f"N={world_size}"
        threads_text = count(threads, "thread")
        in_step = (entry.get("in_step") or {}).get("seconds_per_call") or 0.0
        return NetworkProfile(
            MEASURED,
            default,
            f"gloo probe at {probed}, {threads_text} per rank, {in_step * 1e6:.0f} µs more per call"
            f" in a step, measured {entry.get('measured_at')}",
            by_kind=kinds,
            shares_compute=True,
            in_step_call_s=in_step,
        )

    def gloo_two_tier(
        self, world_size: int, ranks_per_node: int, threads: int, device_name: str, torch_version: str
    ) -> GlooTwoTier:
        """This machine's gloo in two tiers (``gloo_tiers``): the flat probe and both tiers'."""
        from shardbench.prediction.gloo_tiers import GlooTwoTier

        machine = (threads, device_name, torch_version)
        return GlooTwoTier(
            self.gloo_profile(world_size, *machine),
            self.gloo_profile(world_size, *machine, tier=("within", ranks_per_node)),
            self.gloo_profile(world_size, *machine, tier=("across", ranks_per_node)),
            ranks_per_node,
        )

    def update_rate(
        self, threads: int, elements: int, copies: int, device_name: str, torch_version: str
    ) -> float:
        """Seconds per element of an AdamW step on this CPU at ``threads`` for a rank that
        updates ``elements``, ``copies`` ranks at once (``update_probe``)."""
        from shardbench.harness.config import available_memory
        from shardbench.prediction.probe_cache import cached
        from shardbench.prediction.update_probe import size_for

        measure = self.measure_update
        if measure is None:
            from shardbench.prediction.update_probe import probe as measure
        size = size_for(elements, copies, available_memory())
        key = update_key(threads, size, copies, device_name, torch_version)
        return cached("update", key, lambda: measure(threads, size, copies), self.home)["seconds_per_element"]

    def replayed_update(
        self, sizes: Sequence[int], threads: int, copies: int, device_name: str, torch_version: str
    ) -> float | None:
        """Seconds of an AdamW step on this CPU over tensors of ``sizes`` elements at ``threads``,
        ``copies`` ranks at once (``update_probe.replay``), cached by the sizes; None where none
        is cached and the copies' optimizer state would not fit in half of the memory free."""
        from shardbench.harness.config import available_memory
        from shardbench.prediction.probe_cache import cached, read
        from shardbench.prediction.update_probe import BYTES_PER_ELEMENT

        key = update_replay_key(sizes, threads, copies, device_name, torch_version)
        memory = available_memory()
        if memory is not None and copies * sum(sizes) * BYTES_PER_ELEMENT > memory / 2:
            kept = read("update", self.home).get(key)  # a replay kept stands, whatever is free now
            return kept["seconds"] if kept else None
        measure = self.measure_update_replay
        if measure is None:
            from shardbench.prediction.update_probe import replay as measure
        return cached("update", key, lambda: measure(sizes, threads, copies), self.home)["seconds"]

    def update_tensor_seconds(self, threads: int, device_name: str, torch_version: str) -> float:
        """Seconds an AdamW step on this CPU spends per tensor it updates, at ``threads``
        (``update_probe.probe_per_tensor``): one copy, as that cost is each process's own Python
        and kernel launches, which the core share divides where ranks outnumber the cores."""
        from shardbench.prediction.probe_cache import cached

        measure = self.measure_update_per_tensor
        if measure is None:
            from shardbench.prediction.update_probe import probe_per_tensor as measure
        key = update_tensor_key(threads, device_name, torch_version)
        return cached("update", key, lambda: measure(threads), self.home)["seconds_per_tensor"]

    def buffer_memory_rates(
        self, threads: int, copies: int, device_name: str, torch_version: str
    ) -> tuple[float, float]:
        """Seconds per byte copied, and per byte of a fresh buffer first touched, on this CPU at
        ``threads``, ``copies`` ranks at once (``update_probe.probe_buffer_memory``)."""
        from shardbench.prediction.probe_cache import cached

        measure = self.measure_buffer_memory
        if measure is None:
            from shardbench.prediction.update_probe import probe_buffer_memory as measure
        key = buffer_memory_key(threads, copies, device_name, torch_version)
        entry = cached("update", key, lambda: measure(threads, copies), self.home)
        return entry["seconds_per_copied_byte"], entry["seconds_per_fresh_byte"]

    def dtensor_dispatch_seconds(
        self, shapes: Sequence[Sequence[int]], threads: int, device_name: str, torch_version: str
    ) -> float:
        """Seconds an AdamW step on this CPU at ``threads`` spends dispatching its ops over
        DTensors of ``shapes`` (in that order) beyond plain tensors
        (``dtensor_update_probe``), cached by the shapes."""
        from shardbench.prediction.probe_cache import cached

        measure = self.measure_dtensor_update
        if measure is None:
            from shardbench.prediction.dtensor_update_probe import probe_dtensor_update as measure
        key = dtensor_update_key(shapes, threads, device_name, torch_version)
        if key in self._failed:  # every cell of a model would pay the failing probe again
            raise RuntimeError(self._failed[key])
        try:
            return cached("update", key, lambda: measure(shapes, threads), self.home)["dispatch_seconds"]
        except RuntimeError as e:
            self._failed[key] = str(e)
            raise

    def replayed_compute(
        self, calls: Sequence[OpCall], threads: int, copies: int, device_name: str, torch_version: str
    ) -> ComputeReplay:
        """One rank's forward and backward replayed op by op on this CPU at ``threads``,
        ``copies`` at once (``op_replay``): its compute ``seconds`` and how the replay went,
        cached by the step's calls."""
        from shardbench.prediction.op_calls import signature
        from shardbench.prediction.op_replay import replay
        from shardbench.prediction.probe_cache import cached

        def measure() -> dict[str, Any]:
            return {**replay(calls, threads=threads, device="cpu", copies=copies), "threads": threads}

        key = compute_key(signature(calls), threads, copies, device_name, torch_version)
        if key not in self._replayed:
            self._replayed[key] = figures(ComputeReplay, cached("compute", key, measure, self.home))
        return self._replayed[key]
