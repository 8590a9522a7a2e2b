"""Skip marks for the optional extras, decided without importing them: Lightning alone takes
seconds to import, and every pytest worker collects every module, so a module-level
``importorskip`` would make each worker pay for it whether or not it ran a test that needs it."""

from __future__ import annotations

import importlib.util

import pytest


def needs(module: str, reason: str) -> pytest.MarkDecorator:
    """Skip where ``module`` is not installed; found, it is imported by the tests that use it."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=reason)


LIGHTNING = needs("lightning", "the 'lightning' extra is not installed")
TRANSFORMERS = needs("transformers", "hf: workloads need transformers")
