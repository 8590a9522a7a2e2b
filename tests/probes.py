"""Stand-ins for the probes a cell's predicted step time reads (``bench/prediction/machine_probes.py``),
cached in a results home before a test's cells run there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: the gloo profile every test's cell is predicted over: a stand-in, so that no test pays the
#: probe's few seconds of forked ranks (tests/test_step_time.py tests the probe's fit)
STAND_IN_GLOO = {"all_reduce": {"latency_s": 2e-4, "bandwidth": 1e9}}
#: and what each call costs inside a step beyond its aligned time
STAND_IN_IN_STEP = {"seconds_per_call": 3e-4}
#: the AdamW update rate likewise: measured, it moves with the load of the minute (3-21 ns per
#: element on the 2-core machine), and so would a plan's fastest strategy in a test about reserves
STAND_IN_UPDATE_S_PER_ELEMENT = 5e-9
#: and its fixed cost per tensor (tens of microseconds measured on the 2-core machine)
STAND_IN_UPDATE_S_PER_TENSOR = 2e-5
#: and a communication buffer's byte copied, and first touched where freshly allocated (each
#: about 4 GB/s on the 2-core machine)
STAND_IN_BUFFER_MEMORY = {"seconds_per_copied_byte": 2.5e-10, "seconds_per_fresh_byte": 2.5e-10}


def seed_probes(home: Path) -> None:
    """Cache ``STAND_IN_GLOO``, the update rate, its per-tensor cost and the buffer-memory rates in
    ``home`` for every world size, thread count, size and copies a test runs."""
    from shardbench.harness.config import available_cores
    from shardbench.prediction.machine_probes import (
        buffer_memory_key,
        network_key,
        update_key,
        update_tensor_key,
    )
    from shardbench.prediction.probe_cache import cached
    from shardbench.prediction.update_probe import SIZES
    from shardbench.records import UNNAMED_DEVICE, capture_env

    env = capture_env("cpu")
    cores = available_cores()
    device = env.get("device_name") or UNNAMED_DEVICE
    for threads in range(1, cores + 1):
        for n in range(2, 9):
            key = network_key(n, threads, device, env["torch"], cores)
            stand_in = {"kinds": STAND_IN_GLOO, "in_step": STAND_IN_IN_STEP, "stand_in": True}
            cached("network", key, stand_in.copy, home, load=_settled)
        rate = {"seconds_per_element": STAND_IN_UPDATE_S_PER_ELEMENT, "stand_in": True}
        for size in SIZES:
            for copies in range(1, cores + 1):
                key = update_key(threads, size, copies, device, env["torch"])
                cached("update", key, rate.copy, home, load=_settled)
        buffers = {**STAND_IN_BUFFER_MEMORY, "stand_in": True}
        for copies in range(1, cores + 1):
            key = buffer_memory_key(threads, copies, device, env["torch"])
            cached("update", key, buffers.copy, home, load=_settled)
        per_tensor = {"seconds_per_tensor": STAND_IN_UPDATE_S_PER_TENSOR, "stand_in": True}
        key = update_tensor_key(threads, device, env["torch"])
        cached("update", key, per_tensor.copy, home, load=_settled)


def _settled() -> None:
    """A stand-in is no measurement: no load to say it was taken under (never provisional)."""
    return None


def stand_in_update_replay(sizes: list[int], threads: int, copies: int) -> dict[str, float | bool]:
    """The update replayed over a rank's tensors, as the stand-in rate and per-tensor cost make
    it (``update_probe.replay``, which each distinct model would pay seconds of processes for)."""
    seconds = sum(sizes) * STAND_IN_UPDATE_S_PER_ELEMENT + len(sizes) * STAND_IN_UPDATE_S_PER_TENSOR
    return {"seconds": seconds, "stand_in": True}


#: what each DTensor adds to an update's step (about 0.1 ms measured on the 2-core machine)
STAND_IN_DTENSOR_S_PER_TENSOR = 1e-4


def stand_in_dtensor_update(shapes: list[list[int]], threads: int) -> dict[str, float | bool]:
    """The DTensor dispatch over a rank's shapes (``dtensor_update_probe``, a process of its own
    for each distinct model), at a stand-in cost per tensor."""
    return {"dispatch_seconds": len(shapes) * STAND_IN_DTENSOR_S_PER_TENSOR, "stand_in": True}


def plain_probes(home: Path, **measures: Any) -> Any:
    """A ``MachineProbes`` over ``home`` whose probes answer round stand-ins (a 0.1 ms, 1 GB/s
    all-reduce, 10 ns an updated element, 20 µs an updated tensor, free buffers), ``measures``
    replacing any of them: for a test's arithmetic on one term."""
    from shardbench.prediction.machine_probes import MachineProbes

    link = {"all_reduce": {"latency_s": 1e-4, "bandwidth": 1e9}}
    stand_ins: dict[str, Any] = {
        "measure_network": lambda n, threads: {"kinds": link},
        "measure_update": lambda threads, size, copies: {"seconds_per_element": 1e-8},
        "measure_update_per_tensor": lambda threads: {"seconds_per_tensor": 2e-5},
        "measure_buffer_memory": lambda threads, copies: {
            "seconds_per_copied_byte": 0.0,
            "seconds_per_fresh_byte": 0.0,
        },
    }
    return MachineProbes(home=home, **{**stand_ins, **measures})
