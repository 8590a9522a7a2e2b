"""A cell with what its names stand for, its strategy and its workload, each resolved once where
the cell starts and handed down.

The record's assembly and the predictions made for it then read the same objects, rather than
each resolving the cell's names again (a workload named ``hf:``, ``lightning:`` or ``file.py:``
imports code to be found, and a strategy's name passes through its aliases).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardbench.harness.config import CellConfig

if TYPE_CHECKING:
    from shardbench.models.base import Workload
    from shardbench.strategies.base import Strategy
    from shardbench.strategies.catalog import WorldPlan


@dataclass(frozen=True)
class ResolvedCell:
    cell: CellConfig
    strategy: Strategy

    @classmethod
    def of(cls, cell: CellConfig | ResolvedCell) -> ResolvedCell:
        """``cell`` resolved (itself, when it already is): callers that hold a bare cell, a
        plan or a test, get the same answers as a cell's own path."""
        if isinstance(cell, ResolvedCell):
            return cell
        from shardbench.strategies.registry import get_strategy

        return cls(cell, get_strategy(cell.strategy))

    def world_plan(self) -> WorldPlan:
        """``CellConfig.world_plan``, of the strategy already resolved."""
        cell = self.cell
        return self.strategy.plan_world(cell.world_size, cell.device, cell.simulate)

    @functools.cached_property
    def workload(self) -> Workload:
        """Resolved on first use: the launcher of a cell whose ranks reported their figures
        never needs it, and resolving it there would import the workload's code."""
        from shardbench.models.registry import get_workload

        return get_workload(self.cell.workload)
