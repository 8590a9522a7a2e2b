"""The repeated blocks of a model: the modules that sharding strategies gather as units (zero3,
FSDP2, FairScale's FSDP) and that activation checkpointing recomputes, unless a workload names
others.

On the ground floor because both sides need the same answer: the workloads (``models/``) say
which blocks they checkpoint, and the strategies which units they gather, so the two agree
without either importing the other.
"""

from __future__ import annotations

from torch import nn


def repeated_blocks(root: nn.Module, *, frozen_too: bool = False) -> list[nn.Module]:
    """Every child of an ``nn.ModuleList`` or ``nn.Sequential`` (a repeated block: a
    transformer layer, a ResNet block) that holds trainable parameters (``frozen_too``: any
    parameters), outermost only, in module order.

    Outermost only: a block's own small Sequential (a ResNet downsample's conv and norm) would
    be gathered inside its block's forward, when the block is already gathered, so making it a
    unit of its own adds a collective per use and saves no memory."""
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        containers = isinstance(module, nn.ModuleList | nn.Sequential)
        for child in module.children():
            # a ModuleList/ModuleDict has no forward of its own (no hook would ever fire on it):
            # its children are the blocks
            callable_block = not isinstance(child, nn.ModuleList | nn.ModuleDict)
            held = [p for p in child.parameters() if frozen_too or p.requires_grad]
            if containers and callable_block and held:
                found.append(child)
            else:
                visit(child)

    visit(root)
    return found
