"""What ``--workload`` accepts besides the built-in names, resolved to a ``Workload``.

* ``hf:<ArchitectureClass>``: a transformers architecture built from its config (``models/hf.py``);
* ``lightning:package.module:LitClass`` or ``lightning:path/to/file.py:LitClass``: a
  LightningModule class, its optimizer from ``configure_optimizers`` and its loss from
  ``training_step`` (``models/lightning.py``);
* ``package.module:factory`` or ``path/to/file.py:factory``: a callable returning a ``Workload``
  (or a ``Workload`` subclass), or a ``ModelSpec`` (an ``nn.Module`` factory plus its inputs,
  ``models/custom.py``);
* a name another installed package registers in the entry point group ``shardbench.workloads``
  (its value a ``module:attr`` as above).

A spec is resolved in every process that runs a cell (the ranks import the same module or file
the parent did), so everything it needs must be importable there: a file path is resolved
against the directory the command runs in (the launcher tells the ranks which:
``SHARDBENCH_CALLER_CWD``) and imported as ``python file.py`` would run it, its own directory
first on ``sys.path`` (so it can import the packages beside it, a ``models`` of its own
included); a module must be installed or on ``PYTHONPATH``. Every error is one line naming
what is wrong and what is allowed, raised before anything runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardbench.models.user_code import no_exit

if TYPE_CHECKING:  # torch: ``shardbench list`` reads the registered names without importing it
    from shardbench.models.base import Workload

ENTRY_POINT_GROUP = "shardbench.workloads"
FORMS = (
    "hf:<ArchitectureClass>, package.module:factory, path/to/file.py:factory or "
    "lightning:package.module:LitClass (or lightning:path/to/file.py:LitClass)"
)


def registered() -> dict[str, str]:
    """``{name: "module:attr"}`` of the workloads installed packages register."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def is_spec(name: str) -> bool:
    """Whether ``name`` is a spec this module resolves (not a built-in name)."""
    return ":" in name or name in registered()


def rank_imports(spec: str) -> tuple[str, ...]:
    """The modules a rank of ``spec`` imports to resolve it, beyond what every rank imports, that
    a fork server can import once for all of them: Lightning for a ``lightning:`` spec (about
    1.7 s a rank on the 2-core CPU). Not the user's own module, which is theirs to run."""
    return ("shardbench.models.lightning",) if spec.startswith("lightning:") else ()


@functools.cache
def resolve(spec: str) -> Workload:
    """The workload ``spec`` names (cached: a rank resolves it once); ValueError if it cannot."""
    if spec.startswith("hf:"):
        from shardbench.models.hf import HFWorkload

        return HFWorkload(spec.removeprefix("hf:"))
    if spec.startswith("lightning:"):
        from shardbench.models.lightning import lightning_workload

        where, attr = _split(spec.removeprefix("lightning:"), spec)
        return lightning_workload(spec, _attribute(where, attr, spec))
    target = registered().get(spec, spec)
    where, attr = _split(target, spec)
    return _as_workload(_attribute(where, attr, spec), spec)


def _split(target: str, spec: str) -> tuple[str, str]:
    """``module:attr`` or ``file.py:attr`` as (where, attr)."""
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"workload {spec!r} is not a built-in name, {FORMS}")
    return where, attr


def _attribute(where: str, attr: str, spec: str) -> Any:
    obj = getattr(_load(where, spec), attr, None)
    if obj is None:
        raise ValueError(f"workload {spec!r}: {where!r} has no attribute {attr!r}")
    return obj


def _load(where: str, spec: str) -> Any:
    if where.endswith(".py"):
        path = (Path(os.environ.get("SHARDBENCH_CALLER_CWD", os.getcwd())) / where).resolve()
        if not path.is_file():
            raise ValueError(f"workload {spec!r}: no file {str(path)!r}")
        name = f"shardbench_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        loader_spec = importlib.util.spec_from_file_location(name, path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # before running it: dataclasses and pickling look it up
        try:
            with no_exit(f"workload {spec!r}: importing {str(path)!r}"):
                loader_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise ValueError(f"workload {spec!r}: importing {str(path)!r}: {type(e).__name__}: {e}") from e
        return module
    try:
        with no_exit(f"workload {spec!r}: importing {where!r}"):
            return importlib.import_module(where)
    except ModuleNotFoundError as e:
        raise ValueError(f"workload {spec!r}: no module {e.name!r} (installed? on PYTHONPATH?)") from e
    except Exception as e:
        raise ValueError(f"workload {spec!r}: importing {where!r}: {type(e).__name__}: {e}") from e


def _as_workload(obj: Any, spec: str) -> Workload:
    from shardbench.models.base import Workload
    from shardbench.models.custom import ModelSpec, ModuleWorkload

    if callable(obj):  # a factory, or a Workload subclass (its constructor)
        try:
            with no_exit(f"workload {spec!r}: the factory"):
                made: Any = obj()
        except Exception as e:
            raise ValueError(f"workload {spec!r}: calling the factory failed: {type(e).__name__}: {e}") from e
    else:
        raise ValueError(
            f"workload {spec!r} is a {type(obj).__name__}, not callable: name a factory returning a "
            "Workload or a ModelSpec"
        )
    if isinstance(made, Workload):
        if not getattr(made, "name", ""):
            made.name = spec
        return made
    if isinstance(made, ModelSpec):
        return ModuleWorkload(spec, made, factory=obj)
    raise ValueError(
        f"workload {spec!r}: the factory returned a {type(made).__name__}; allowed: a Workload or a "
        "ModelSpec (shardbench.models.custom: an nn.Module factory plus its inputs)"
    )
