"""Size families (models/presets/family.py): every shape a max-size search walks is counted
exactly, grows along each knob, and the named reference presets are shapes of their family."""

from __future__ import annotations

import pytest

from shardbench.models.base import Workload
from shardbench.models.registry import get_workload, workload_names

#: named presets and the family shape that is the same model
SAME_MODEL = {
    "transformer": {"base": "h768-l12", "large": "h1024-l24", "h2048-l32": "h2048-l32"},
    "imagegpt": {"igpt-s": "e512-l24"},
    "swav": {"rn50": "w64-s6", "rn50-w2": "w128-s6", "rn50-w5": "w320-s6"},
    "deepspeech2": {"paper": "h1024-l5", "h1536": "h1536-l5", "h2048-l7": "h2048-l7"},
}


@pytest.mark.parametrize("name", workload_names())
def test_named_presets_are_shapes_of_the_family(name: str) -> None:
    presets = get_workload(name).presets
    for named, shape in SAME_MODEL[name].items():
        assert presets[named] == presets.family.preset(shape)


@pytest.mark.parametrize("name", workload_names())
def test_members_grow_and_each_knob_grows_the_count(name: str) -> None:
    w = get_workload(name)
    family = w.size_family()
    counts = [c for c, _ in family.members]
    assert counts == sorted(set(counts)) and len(counts) > 500
    first = {k: r[0] for k, r in family.knobs.items()}
    for knob, allowed in family.knobs.items():
        along = [w.param_count(family.name(**{**first, knob: v})) for v in allowed[:6]]
        assert along == sorted(set(along)), knob


@pytest.mark.parametrize("name", workload_names())
def test_the_count_of_a_shape_equals_its_model_on_the_meta_device(name: str) -> None:
    """Small, middle and odd shapes of each family, built on the meta device."""
    w = get_workload(name)
    members = w.size_family().members
    for count, shape in (members[0], members[len(members) // 8], members[len(members) // 3]):
        assert Workload.param_count(w, shape) == count == w.param_count(shape), shape


def test_a_shape_off_the_knobs_steps_is_refused_naming_the_spelling() -> None:
    w = get_workload("transformer")
    assert "h832-l20" in w.presets and "h830-l20" not in w.presets and "h832-l0" not in w.presets
    with pytest.raises(ValueError, match=r"h\{hidden\}-l\{layers\} \(hidden 128\.\.8192 in steps of 64"):
        w.check_preset("h830-l20")
    assert list(w.presets) == list(w.presets.named)  # listing shows the named presets only
