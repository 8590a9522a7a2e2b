"""Per-rank peak memory, by category, on CPU and CUDA.

CPU has no allocator counter, and RSS mixes in the interpreter, libraries and allocator caches,
so on every device we track *tensor* memory with PyTorch's ``MemTracker`` (a dispatch mode that
follows each tensor storage and types it as parameter, buffer, gradient, activation, temporary or
optimizer state). Its peak snapshot is the breakdown at the moment total tracked memory peaked.
On CUDA we also read the allocator's ``max_memory_allocated`` / ``max_memory_reserved`` and the
retry and OOM counters, which include what the tracker cannot see (workspace, fragmentation).

Model state created before tracking starts (parameters, gradients, optimizer state, buckets) is
registered with ``track_external``; that is why the default train step clears gradients at the
*start* of a step: between steps they still exist and are seen as gradients, which is also what
attributes DDP's gradient buckets (with ``gradient_as_bucket_view`` the gradients are views of
them) to gradients rather than activations.

``comm`` is what a strategy holds for communication: our sharded strategies' gradient buckets
waiting for (or in) their reduction and the reduce-scatter outputs beyond the first. MemTracker
has no such type (it calls them "Other"), so the probe keeps its own weak set of those storages
and, whenever the tracker records a new peak, how many of their bytes were alive then; at the
peak they move from "other" to "comm". Buffers a library allocates inside its own code (DDP's
buckets when they are not gradient views, FSDP2's all-gather and reduce-scatter buffers) are
typed by the tracker as it sees them, not as comm.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from shardbench.metrics import shape_propagation

CATEGORIES = ("params", "grads", "optimizer", "activations", "comm", "other")

# MemTracker's reference types -> our categories.
_CATEGORY_OF = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "activations",  # autograd temporaries (gradients of activations) count as activations
    "Buffer": "other",
    "Other": "other",
}


def _mem_tracker_class() -> type:
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as e:  # private API: fail with a clear message, not a deep traceback
        raise RuntimeError(
            f"this torch ({torch.__version__}) lacks torch.distributed._tools.mem_tracker.MemTracker, "
            "which shardbench needs to measure tensor memory by category (torch >= 2.5)"
        ) from e
    if not all(hasattr(MemTracker, name) for name in ("_update_peak_stats", "_track")):
        return MemTracker  # internals changed: keep the stock (slower) tracker
    return _GlobalPeakTracker.of(MemTracker)


class _GlobalPeakTracker:
    """MemTracker that keeps only the global peak (and the comm bytes alive at it). The stock
    tracker also updates the peak of every module seen so far on every operator, O(ops x
    modules): measured 49 of 66 s for bert-large under ``--fake``. We read per-module peaks only
    for ``--memory-snapshot``'s per-module table (``per_module = True`` on the instance); else
    that work is skipped, and the global peak and its snapshot are updated as the stock code does."""

    _cache: dict[type, type] = {}

    @classmethod
    def of(cls, base: type) -> type:
        if base not in cls._cache:
            methods = {**_peak_overrides(base), **_module_overrides(base), **_dispatch_override(base)}
            cls._cache[base] = type("GlobalPeakMemTracker", (base,), methods)
        return cls._cache[base]


def _peak_overrides(base: type) -> dict[str, Any]:
    """The global peak kept alone (the comm bytes alive at it beside), and a registered comm
    buffer kept out of the gradients."""
    from copy import deepcopy

    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, _MemRefType

    def _update_peak_stats(self: Any, peak_state: Any) -> None:
        if getattr(self, "per_module", False):
            before = dict(self._peak_mem)
            base._update_peak_stats(self, peak_state)
            for dev, peak in self._peak_mem.items():
                if peak != before.get(dev):
                    self.peak_comm[dev] = comm_bytes(self, dev)
            return
        for dev, dev_snap in self._curr_mem_snap.items():
            total = int(dev_snap.get(_TOTAL_KEY, 0))  # the tracker keeps the sum there
            if self._peak_mem.get(dev, 0) < total:
                self._peak_mem[dev] = total
                self._peak_mem_snap[dev] = deepcopy(dev_snap)
                self.peak_comm[dev] = comm_bytes(self, dev)

    def _update_and_maybe_create_winfos(
        self: Any, t: torch.Tensor, reftype: Any, update_existing: bool = False
    ) -> Any:
        # a registered comm buffer stays "Other" (then comm): a library that makes its
        # parameters' .grad views of its reduce bucket (DeepSpeed's contiguous gradients)
        # would otherwise have the tracker's gradient hook retype the whole bucket
        if reftype is _MemRefType.GRAD and t is not None and (comm := getattr(self, "comm_storages", None)):
            if any(st in comm for st in get_untyped_storages(t)):
                reftype = _MemRefType.OTH
        return base._update_and_maybe_create_winfos(self, t, reftype, update_existing)

    return {
        "_update_peak_stats": _update_peak_stats,
        "_update_and_maybe_create_winfos": _update_and_maybe_create_winfos,
    }


def _module_overrides(base: type) -> dict[str, Any]:
    """A frozen parameter counted without a gradient hook, and a module's forward run again
    within one step tracked as one more call."""

    def _track_module_params_and_buffers(self: Any, module: Any, install_grad_hooks: bool = True) -> Any:
        # the stock tracker registers a gradient hook on every parameter of a module,
        # and torch refuses one on a parameter that takes no gradient (a frozen layer):
        # such a parameter is marked as hooked already, so it is counted, never hooked
        handles = getattr(self, "_param_to_grad_hook_handles", None)
        if install_grad_hooks and handles is not None:
            for param in module.parameters():
                if not param.requires_grad and handles.get(param) is None:
                    handles[param] = (_NO_HOOK, _NO_HOOK)
        return base._track_module_params_and_buffers(self, module, install_grad_hooks)

    def _pre_fw_hook(self: Any, module: Any, inputs: Any) -> None:
        # a forward that runs again within one step: the root called from inside itself
        # (Lightning's wrapper forward runs training_step, which calls self(...)), or
        # called twice (two views of a batch). The stock tracker takes any second
        # forward of the root for the next iteration and refuses it; the probe ends
        # every step itself (next_step), so here it is one more call, tracked as the
        # stock tracker tracks a shared submodule's second call
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            _track_forward_again(self, module, inputs)
            return
        base._pre_fw_hook(self, module, inputs)

    return {
        "_track_module_params_and_buffers": _track_module_params_and_buffers,
        "_pre_fw_hook": _pre_fw_hook,
    }


def _dispatch_override(base: type) -> dict[str, Any]:
    """The stock dispatch, with its outputs typed directly rather than through a pytree map."""
    from functools import partial

    from torch.distributed._tools.mem_tracker import _MemRefType, _ModState
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map_only

    wait_tensor = torch.ops._c10d_functional.wait_tensor.default

    def __torch_dispatch__(
        self: Any, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if shape_propagation.running():  # DTensor's metadata, not the rank's memory
            return func(*args, **(kwargs or {}))
        if func is wait_tensor or any(t is DTensor for t in types):
            return base.__torch_dispatch__(self, func, types, args, kwargs)
        # the stock dispatch, whose walk over the outputs (a pytree map that builds a
        # wrapper on every call) is about 15% of a tracked step's CPU; an operator returns
        # a tensor or a flat tuple of them, typed here directly, in the same order
        res = func(*args, **(kwargs or {}))
        if self._in_opt:
            reftype = _MemRefType.OPT
        elif self._mod_tracker.is_bw and not self._in_ac:
            reftype = _MemRefType.TEMP
        else:
            reftype = _MemRefType.ACT
        if isinstance(res, torch.Tensor):
            self._track(reftype, res)
        elif type(res) in (tuple, list) and all(isinstance(x, torch.Tensor | None) for x in res):
            for x in res:
                if x is not None:
                    self._track(reftype, x)
        else:
            tree_map_only(torch.Tensor, partial(self._track, reftype), res)
        self._update_peak_stats(_ModState.PEAK_BW if self._mod_tracker.is_bw else _ModState.PEAK_FW)
        return res

    return {"__torch_dispatch__": __torch_dispatch__}


def _track_forward_again(tracker: Any, module: Any, inputs: Any) -> None:
    """The stock tracker's bookkeeping for a module's forward run again in the same step: its
    inputs, and a fresh local peak and forward snapshot for the per-module table."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, _ModState

    stats = tracker.memory_tracking[module]
    stats.mod_fqn = tracker._mod_tracker.get_known_fqn(module)
    stats.input_mem = tracker._track_inputs_or_outputs(inputs)
    snapshot = tracker.get_tracker_snapshot()
    stats.local_peak = {dev: dev_snap[_TOTAL_KEY] for dev, dev_snap in snapshot.items()}
    stats.snapshots.setdefault(_ModState.PEAK_FW, []).append(snapshot)
    stats.snapshots.setdefault(_ModState.PRE_FW, []).append(copy.deepcopy(snapshot))


class _NoHook:
    """The handle of a hook never registered: removing it does nothing."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def comm_bytes(tracker: Any, device: torch.device) -> int:
    """Bytes of the registered communication buffers alive now on ``device`` (see the module
    docstring); 0 for a tracker the probe did not set up."""
    live = getattr(tracker, "comm_storages", None)
    if not live:
        return 0
    # a storage's device is the tensor's, registered with it (a fake tensor's storage is on meta)
    return sum(st.nbytes() for st, dev in list(live.items()) if dev == device)


def _is_total(key: Any) -> bool:
    return str(getattr(key, "value", key)) == "Total"


def breakdown_from_snapshot(dev_snap: dict[Any, int]) -> dict[str, int]:
    """Fold one device's MemTracker snapshot into our five categories."""
    out = dict.fromkeys(CATEGORIES, 0)
    for key, nbytes in dev_snap.items():
        if _is_total(key):
            continue
        name = str(getattr(key, "value", key))
        out[_CATEGORY_OF.get(name, "other")] += int(nbytes)
    return out


class MemoryProbe:
    """Context manager tracking tensor memory by category over the steps run inside it.

    ``external`` are objects created before tracking (the model, the optimizer, inputs, a
    strategy's own buffers); tensors among them that are not parameters, gradients or optimizer
    state count as "other".
    """

    def __init__(
        self,
        device: torch.device,
        external: Iterable[Any],  # modules, optimizers, tensors or pytrees of tensors (inputs)
        typed: dict[str, list[torch.Tensor]] | None = None,
        *,
        per_module: bool = False,
    ) -> None:
        self.device = device
        self._tracker = _mem_tracker_class()()
        self._tracker.per_module = per_module  # per-module peaks too (slower): --memory-snapshot
        from torch.utils.weak import WeakIdKeyDictionary

        self._tracker.comm_storages = WeakIdKeyDictionary()  # storage -> device: see the docstring
        self._tracker.peak_comm = {}  # device -> comm bytes alive at its peak
        self._tracker.track_external(*[e for e in external if e is not None])
        for category, tensors in (typed or {}).items():
            self._register(category, tensors)

    def _register(self, category: str, tensors: list[torch.Tensor]) -> None:
        """Type tensors a strategy holds outside params/grads/optimizer state (gradient shards,
        master weights). MemTracker's public API types such tensors only as "Other", so this
        uses its internal re-typing, which is what its own gradient hooks call."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; allowed: {', '.join(CATEGORIES)}")
        from torch.distributed._tools.mem_tracker import _MemRefType

        if category in ("other", "comm"):
            if category == "comm":
                for t in tensors:
                    self._tracker.comm_storages[t.untyped_storage()] = t.device
            self._tracker.track_external(*tensors)
            if category == "comm" and (
                retype := getattr(self._tracker, "_update_and_maybe_create_winfos", None)
            ):
                for t in tensors:  # already seen as a gradient (a .grad viewing it): "Other" again
                    retype(t, _MemRefType.OTH)
            return

        reftype = {
            "params": _MemRefType.PARAM,
            "grads": _MemRefType.GRAD,
            "optimizer": _MemRefType.OPT,
            "activations": _MemRefType.ACT,
        }[category]
        retype = getattr(self._tracker, "_update_and_maybe_create_winfos", None)
        if retype is None:
            raise RuntimeError(
                f"MemTracker in torch {torch.__version__} has no "
                "_update_and_maybe_create_winfos; cannot attribute strategy tensors"
            )
        for t in tensors:
            retype(t, reftype)

    def attribute(self, tensor: torch.Tensor, category: str) -> None:
        """Type a tensor a strategy just allocated (the tracker would call it a temporary).

        If that allocation set the peak, the peak's breakdown is refreshed so it shows the new
        type (the total is unchanged)."""
        self._register(category, [tensor])
        t = self._tracker
        for dev, snap in getattr(t, "_curr_mem_snap", {}).items():
            if snap.get("Total") == getattr(t, "_peak_mem", {}).get(dev):
                t._peak_mem_snap[dev] = copy.deepcopy(snap)
                t.peak_comm[dev] = comm_bytes(t, dev)

    def __enter__(self) -> MemoryProbe:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        # a module called from inside its own forward is tracked (see _pre_fw_hook), but torch's
        # module tracker warns at each such call that its hierarchy "may be messed up", and
        # swaps the process's warning format while doing so: both are kept to the probe
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        self._format = warnings.formatwarning
        warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")
        self._propagation = shape_propagation.untracked()
        self._propagation.__enter__()
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._tracker.__exit__(*exc)
        finally:
            self._propagation.__exit__(*exc)
            warnings.formatwarning = self._format
            self._warnings.__exit__(*exc)

    @property
    def tracker(self) -> Any:
        """The underlying MemTracker (its per-module table: ``drilldown.write_module_table``)."""
        return self._tracker

    def next_step(self) -> None:
        """Call between steps: MemTracker refuses a second forward of the root module otherwise."""
        self._tracker.reset_mod_stats()

    def peak(self) -> tuple[int, dict[str, int]]:
        """(peak tracked bytes, breakdown at that peak) on this rank's compute device. The peak
        is the tracker's own total, so a category the fold missed would show as a gap."""
        dev_snap = _device_entry(self._tracker.get_tracker_snapshot("peak"), self.device)
        total = sum(int(v) for k, v in dev_snap.items() if _is_total(k))
        breakdown = breakdown_from_snapshot(dev_snap)
        comm = next((v for d, v in self._tracker.peak_comm.items() if _same_device(d, self.device)), 0)
        breakdown["comm"] = min(comm, breakdown["other"])
        breakdown["other"] -= breakdown["comm"]
        return total, breakdown

    def current_model_state(self) -> dict[str, int]:
        """Parameters, gradients and optimizer state held right now (call it after a step and
        before the next ``zero_grad``: the model states a rank keeps, to set against the
        analytic prediction), with their total."""
        dev_snap = _device_entry(self._tracker.get_tracker_snapshot("current"), self.device)
        breakdown = breakdown_from_snapshot(dev_snap)
        out = {k: breakdown[k] for k in ("params", "grads", "optimizer")}
        out["total"] = sum(out.values())
        # everything still allocated between steps: model states plus what a strategy keeps
        # beside them (DDP's gradient buckets, flat buffers) and the prepared inputs. A persistent
        # extra buffer shows here even when it does not move the peak (which can sit mid-backward).
        out["held"] = sum(breakdown.values())
        return out


def _same_device(dev: torch.device, device: torch.device) -> bool:
    return dev.type == device.type and (device.index is None or dev.index in (None, device.index))


def _device_entry(snap: dict[torch.device, dict[Any, int]], device: torch.device) -> dict[Any, int]:
    return next((dev_snap for dev, dev_snap in snap.items() if _same_device(dev, device)), {})


def cuda_allocator_stats(device: torch.device) -> dict[str, int] | None:
    """The allocator's peaks since the last reset, or None off CUDA."""
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return {
        "max_allocated": int(torch.cuda.max_memory_allocated(device)),
        "max_reserved": int(torch.cuda.max_memory_reserved(device)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def reset_cuda_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
