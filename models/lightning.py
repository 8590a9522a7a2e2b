"""A LightningModule as a workload: ``--workload lightning:package.module:LitClass`` or
``--workload lightning:path/to/file.py:LitClass`` (resolved as the other own-model forms are,
``models/specs.py``), measured under every strategy without the user's Trainer code.

- The model is ``LitClass()``; its keyword arguments are the presets' keys, as for a factory
  (``--model-config n_layer=4``: ``LitClass(n_layer=4)``).
- The optimizer is the one ``configure_optimizers`` returns (exactly one; LR schedulers are not
  stepped: a measurement lasts a few steps).
- A batch comes from ``train_dataloader()`` when the module defines one (after
  ``setup("fit")``): ``batch_size`` samples of its dataset, drawn as a function of (seed, step,
  rank) and joined by the loader's ``collate_fn``, and the loss is ``training_step(batch, 0)``
  (a tensor, or a dict's ``"loss"``), run through the strategy's wrapper. Without one, the batch
  is random data shaped as ``example_input_array`` with ``batch_size`` rows (floats standard
  normal, integers below the example's largest value plus one), passed to ``forward`` as Lightning
  passes it, and the loss is read off the output as for a ``ModelSpec``
  (``models/custom.py``).

The module is built for its data on the meta device (no parameters allocated), or for real when
its data turned out to be made at construction (a meta tensor in a sample). ``prepare_data`` is
not called: a workload never downloads anything.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from shardbench.models.base import Inputs, batch_generator
from shardbench.models.custom import ModelSpec, ModuleWorkload, loss_from_output
from shardbench.models.user_code import no_exit

try:
    import lightning.pytorch as pl
except ModuleNotFoundError as e:  # the optional 'lightning' extra
    if (e.name or "").split(".")[0] != "lightning":
        raise
    pl = None  # type: ignore[assignment]

MISSING = "needs Lightning, the 'lightning' extra: pip install 'shardbench[lightning]'"
#: how many wrappers deep the LightningModule may sit (DDP, ours, an engine, FSDP's inner ones)
_MAX_DEPTH = 8


def lightning_workload(spec: str, obj: Any) -> LightningWorkload:
    """The workload of ``obj``, the attribute ``spec`` names; ValueError if it is no
    LightningModule class."""
    if pl is None:
        raise ValueError(f"workload {spec!r} {MISSING}")
    if not (isinstance(obj, type) and issubclass(obj, pl.LightningModule)):
        raise ValueError(
            f"workload {spec!r} is a {type(obj).__name__ if not isinstance(obj, type) else obj.__name__}, "
            "not a LightningModule subclass: name the class (lightning:module:LitClass)"
        )
    return LightningWorkload(spec, obj)


def _defines(cls: type, hook: str) -> bool:
    return getattr(cls, hook) is not getattr(pl.LightningModule, hook)


class LightningWorkload(ModuleWorkload):
    """``LitClass`` as a ``Workload`` (see the module docstring)."""

    def __init__(self, name: str, cls: type) -> None:
        self.cls = cls
        super().__init__(name, ModelSpec(build=cls, inputs={}), factory=cls)
        self._sources: dict[str, _Source] = {}
        self._structure: pytree.TreeSpec | None = None
        self._forward_only = False  # the batch is example_input_array's: forward, not training_step

    def spec_for(self, preset: str) -> ModelSpec:
        if preset not in self._specs:
            self._specs[preset] = ModelSpec(
                build=functools.partial(self.cls, **self.keywords(preset)), inputs={}
            )
        return self._specs[preset]

    def check_preset(self, preset: str) -> None:
        """Besides the meta build: what a batch is made from, and exactly one optimizer (its
        parameters on the meta device), so a module lacking either is one line before any
        cell starts."""
        super().check_preset(preset)
        self._source(preset)
        self._optimizer(self._meta_model(preset))

    def check_inputs(self, preset: str, model: nn.Module) -> None:
        """Nothing to match: a batch goes to ``training_step`` whole, not to ``forward`` by name
        (``_source`` checks what a batch is made from)."""

    # ----- the optimizer -----------------------------------------------------------------------
    def optimizer_factory(self) -> Callable[[nn.Module], torch.optim.Optimizer]:
        return self._optimizer

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        try:
            with no_exit(f"workload {self.name!r}: configure_optimizers"):
                conf = model.configure_optimizers()
        except Exception as e:
            raise ValueError(
                f"workload {self.name!r}: configure_optimizers failed without a Trainer: "
                f"{type(e).__name__}: {e}"
            ) from e
        found = _optimizers_in(conf)
        if len(found) != 1:
            raise ValueError(
                f"workload {self.name!r}: configure_optimizers returned {len(found)} optimizers; "
                "a workload is measured with exactly one"
            )
        return found[0]

    # ----- batches -----------------------------------------------------------------------------
    def batch(
        self,
        preset: str,
        batch_size: int,
        *,
        seed: int,
        step: int,
        rank: int,
        device: torch.device | str = "cpu",
    ) -> Inputs:
        with _real_tensors() as fake:
            made = self._source(preset).sample(batch_size, batch_generator(seed=seed, step=step, rank=rank))
        leaves, structure = pytree.tree_flatten(made)
        if not all(isinstance(t, torch.Tensor) for t in leaves):
            kinds = sorted({type(t).__name__ for t in leaves if not isinstance(t, torch.Tensor)})
            raise ValueError(
                f"workload {self.name!r}: a batch holds {', '.join(kinds)}; only tensors can be measured"
            )
        self._structure = structure
        self._forward_only = isinstance(self._source(preset), _Example)
        if fake is not None:
            leaves = [fake.from_tensor(t) for t in leaves]
        return {f"batch.{i}": t.to(device) for i, t in enumerate(leaves)}

    def _source(self, preset: str) -> _Source:
        if preset not in self._sources:
            self._sources[preset] = self._make_source(preset)
        return self._sources[preset]

    def _make_source(self, preset: str) -> _Source:
        for device in ("meta", "cpu"):
            with torch.device(device):
                module = self.build(preset)
            source = self._source_of(module)
            if not any(isinstance(t, torch.Tensor) and t.is_meta for t in pytree.tree_leaves(source.probe())):
                return source  # (else its data was made at construction, on the meta device)
        raise ValueError(f"workload {self.name!r}: its data stays on the meta device")  # (never: cpu built)

    def _source_of(self, module: nn.Module) -> _Source:
        what = f"workload {self.name!r}"
        if _defines(self.cls, "train_dataloader"):
            try:
                with no_exit(f"{what}: train_dataloader"):
                    module.setup("fit")
                    loader = module.train_dataloader()
            except Exception as e:
                raise ValueError(f"{what}: train_dataloader() failed: {type(e).__name__}: {e}") from e
            dataset = getattr(loader, "dataset", None)
            if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
                raise ValueError(
                    f"{what}: train_dataloader() must return a DataLoader over a map-style dataset "
                    "(with __len__ and __getitem__); or define example_input_array instead"
                )
            if len(dataset) == 0:
                raise ValueError(f"{what}: train_dataloader()'s dataset is empty")
            collate = getattr(loader, "collate_fn", None) or torch.utils.data.default_collate
            return _Dataset(dataset, collate)
        example = module.example_input_array
        if example is None:
            raise ValueError(
                f"{what}: {self.cls.__name__} defines neither train_dataloader() nor example_input_array, "
                "so nothing says what a batch is"
            )
        return _Example(example)

    # ----- the loss ----------------------------------------------------------------------------
    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        if self._structure is None:
            raise RuntimeError(f"workload {self.name!r}: loss before any batch")
        batch = pytree.tree_unflatten([inputs[f"batch.{i}"] for i in range(len(inputs))], self._structure)
        with warnings.catch_warnings():  # self.log() without a Trainer warns at every call
            warnings.filterwarnings("ignore", message=r".*self\.log\(\)")
            if self._forward_only:
                return loss_from_output(_call_forward(model, batch), {})
            return _loss_of(_redirect(model, "training_step", batch, 0), self.name)


class _Source:
    def sample(self, batch_size: int, generator: torch.Generator) -> Any:
        raise NotImplementedError

    def probe(self) -> Any:
        """What the data is made from, to see where its tensors live."""
        raise NotImplementedError


class _Dataset(_Source):
    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.collate = dataset, collate

    def sample(self, batch_size: int, generator: torch.Generator) -> Any:
        picks = torch.randint(0, len(self.dataset), (batch_size,), generator=generator).tolist()
        return self.collate([self.dataset[i] for i in picks])

    def probe(self) -> Any:
        return self.dataset[0]


class _Example(_Source):
    def __init__(self, example: Any) -> None:
        self.example = example

    def sample(self, batch_size: int, generator: torch.Generator) -> Any:
        def like(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                return t
            shape = (batch_size, *t.shape[1:])
            if t.is_floating_point():
                return torch.randn(shape, generator=generator).to(t.dtype)
            if t.dtype == torch.bool:
                return torch.randint(0, 2, shape, generator=generator).bool()
            return torch.randint(0, max(int(t.max()) + 1, 1), shape, generator=generator).to(t.dtype)

        return pytree.tree_map(like, self.example)

    def probe(self) -> Any:
        return self.example


@contextlib.contextmanager
def _real_tensors() -> Iterator[Any]:
    """Real tensors inside, even under ``--fake`` (a dataset indexes real data); yields the fake
    mode that was active (None: none), to make the results fake again."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # no fake tensors in this torch: nothing to unset
        yield None
        return
    with unset_fake_temporarily() as mode:
        yield mode


def _optimizers_in(conf: Any) -> list[torch.optim.Optimizer]:
    """The optimizers in any of the forms ``configure_optimizers`` may return."""
    if isinstance(conf, torch.optim.Optimizer):
        return [conf]
    if isinstance(conf, Mapping):
        return _optimizers_in(conf.get("optimizer"))
    if isinstance(conf, list | tuple):
        if len(conf) == 2 and isinstance(conf[0], list | tuple):  # ([optimizers], [schedulers])
            conf = conf[0]
        return [o for c in conf for o in _optimizers_in(c)]
    return []


def _lightning_module(model: nn.Module) -> nn.Module:
    """The LightningModule inside the strategies' wrappers (each keeps it as ``.module``)."""
    found = model
    for _ in range(_MAX_DEPTH):
        if isinstance(found, pl.LightningModule):
            return found
        found = getattr(found, "module", None)
        if not isinstance(found, nn.Module):
            break
    raise ValueError(f"no LightningModule inside the {type(model).__name__} the strategy built")


def _redirect(model: nn.Module, method: str, *args: Any) -> Any:
    """``lightning_module.<method>(*args)``, called through ``model``'s forward, as Lightning's
    strategies call ``training_step``: the wrapper's (and the module's own) forward hooks run
    around it, where DDP prepares its reduction and a sharding wrapper gathers the root's
    parameters."""
    module = _lightning_module(model)
    had_own = "forward" in module.__dict__
    original = module.forward

    def forward(*a: Any, **k: Any) -> Any:
        module.forward = original  # type: ignore[method-assign]  (the step may call self(...))
        return getattr(module, method)(*a, **k)

    module.forward = forward  # type: ignore[method-assign]
    try:
        return model(*args)
    finally:
        if had_own:
            module.forward = original  # type: ignore[method-assign]
        else:
            module.__dict__.pop("forward", None)


def _call_forward(model: nn.Module, example: Any) -> Any:
    """``forward`` on an example input, as Lightning reads ``example_input_array``."""
    if isinstance(example, Mapping):
        return model(**example)
    if isinstance(example, tuple | list):
        return model(*example)
    return model(example)


def _loss_of(output: Any, name: str) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(
            f"workload {name!r}: training_step returned {type(output).__name__}; a workload needs a scalar "
            "loss (a tensor, or a dict with 'loss')"
        )
    return loss


__all__ = ["LightningWorkload", "lightning_workload"]
