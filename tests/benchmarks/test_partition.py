"""Partitioning a 1.28B-parameter model (transformer ``1b``) into flat buckets for 8 ranks.

Built on the meta device: the layout needs only shapes, so the benchmark measures our bucketing
arithmetic on real parameter shapes and order, not memory allocation. Every rank's partition is
computed, as the 8 ranks of a job would, so the result can be checked for exact coverage.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardbench.models.registry import get_workload
from shardbench.strategies.sharded.layout import Bucket, build_buckets

#: one worker runs this module: its module-scoped fixture runs once (pytest-xdist, loadgroup)
pytestmark = pytest.mark.xdist_group("test_partition")

WORLD_SIZE = 8
CAP_NUMEL = 25 * 2**20 // 4  # ShardedOptimizer's default 25 MB buckets of fp32


@pytest.fixture(scope="module")
def params_1b() -> list[nn.Parameter]:
    with torch.device("meta"):
        model = get_workload("transformer").build("1b")
    return [p for p in model.parameters() if p.requires_grad]


def partition_all_ranks(params: list[nn.Parameter]) -> list[list[Bucket]]:
    return [
        build_buckets(params, world_size=WORLD_SIZE, rank=r, cap_numel=CAP_NUMEL) for r in range(WORLD_SIZE)
    ]


@pytest.mark.benchmark(group="sharded")
def test_partition_1b_model_for_8_ranks(benchmark, params_1b) -> None:
    per_rank = benchmark(partition_all_ranks, params_1b)
    total = sum(p.numel() for p in params_1b)
    assert total == get_workload("transformer").param_count("1b") > 1_000_000_000
    owned = [sum(pc.numel for b in buckets for pc in b.pieces) for buckets in per_rank]
    assert sum(owned) == total  # every element owned by exactly one rank
    n_buckets = len(per_rank[0])
    assert n_buckets > 100 and all(len(b) == n_buckets for b in per_rank)
    # balanced to the element: a rank owns total/N plus less than one element per bucket
    assert max(owned) - min(owned) < n_buckets
    for bucket in per_rank[0]:
        assert bucket.numel <= CAP_NUMEL or len(bucket.params) == 1  # only an oversized param exceeds the cap
        assert bucket.padded % WORLD_SIZE == 0 and bucket.padded - bucket.numel < WORLD_SIZE
