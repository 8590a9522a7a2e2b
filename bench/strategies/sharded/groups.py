"""The process groups our ZeRO runs over, held so that none outlives ``destroy_process_group``.

``destroy_process_group`` frees a gloo group, joining its worker threads, only if nothing else
references it. A group that survives into the interpreter's finalization keeps worker threads
that may still be releasing a finished collective's tensors, which takes the GIL; a thread
taking the GIL during finalization is killed inside a C++ destructor: SIGABRT, "terminate called
without an active exception". And a sharded optimizer can be kept alive longer than its owner
thinks (the first torch optimizer built in a process imports torch._dynamo, whose import keeps
the frames on the stack, ``self`` included, until the garbage collector runs), so its lifetime
must not decide a group's. So the default group is never held (collectives look it up per
call), and any other group only weakly: c10d holds it until it is destroyed.

Hybrid sharding (``shard_groups``): shard within groups of S consecutive ranks and replicate
across the N/S groups, as FSDP's HSDP and DeepSpeed's hpZ do. Rank r shards with the ranks of
its group (``r // S``) and averages its chunk with the ranks holding the same chunk in the other
groups (``r % S``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch.distributed as dist

from shardbench.metrics.topology import divisors, replica_group_ranks, shard_group_ranks

GONE = (
    "the process group this ZeRO part runs over was destroyed (destroy_process_group): build the "
    "ShardedOptimizer and ShardedDataParallel again after init_process_group"
)


def default_as_none(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """None for the default group (collectives look it up per call): it is never held."""
    return None if group is None or group is dist.group.WORLD else group


def held_weakly(group: dist.ProcessGroup | None) -> Callable[[], dist.ProcessGroup | None]:
    """A getter of ``group``: None for the default group; a group of its own through a weak
    reference, raising one line once it is destroyed."""
    group = default_as_none(group)
    if group is None:
        return lambda: None
    ref = weakref.ref(group)

    def get() -> dist.ProcessGroup:
        found = ref()
        if found is None:
            raise RuntimeError(GONE)
        return found

    return get


def global_rank(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (None: the default group, where they agree)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def shard_groups(shard_size: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """This rank's shard group (S consecutive ranks) and replica group (the ranks that hold
    the same chunk in the other shard groups), over the default group. A collective: every rank
    creates every group, in the same order. ValueError in one line for an S that does not divide
    the world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    check_shard_size(shard_size, world)
    shard = replicate = None
    for first in range(0, world, shard_size):  # each shard group, led by its first rank
        group = dist.new_group(shard_group_ranks(first, world, shard_size))
        if first == shard_group_ranks(rank, world, shard_size)[0]:
            shard = group
    for offset in range(shard_size):  # each replica group, led by its rank in the shard group
        group = dist.new_group(replica_group_ranks(offset, world, shard_size))
        if rank % shard_size == offset:
            replicate = group
    assert shard is not None and replicate is not None
    return shard, replicate


def check_shard_size(shard_size: object, world_size: int) -> None:
    """ValueError in one line unless ``shard_size`` is a whole divisor of ``world_size``."""
    allowed = divisors(world_size)
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size not in allowed:
        raise ValueError(
            f"shard_group_size must divide the world of {world_size} ranks, got {shard_size!r}; "
            f"allowed: {', '.join(map(str, allowed))}"
        )
