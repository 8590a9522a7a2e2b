"""SwAV on a ResNet: multi-crop views, a projection head, prototypes, and the swapped
prediction loss with Sinkhorn-Knopp codes (Caron et al., 2020).

The trunk is a bottleneck ResNet-50 whose every width is multiplied by w (SwAV's RN50-w2/w4/w5,
~94M / 375M / 586M trunk parameters); at w=1 it has exactly torchvision's ResNet-50 layers
(checked in the tests); ``tiny`` is the same network at 1/8 width. Head: 2048w -> 2048 (BN,
ReLU) -> 128, L2-normalised features, 3000 prototypes (a bias-free linear layer whose rows are
re-normalised before every forward). Multi-crop as in the paper: 2 x 224 + 6 x 96 (tiny:
2 x 32 + 2 x 16). Loss: for each of the two global crops, codes q from Sinkhorn-Knopp (3
iterations, epsilon 0.05) over the batch, computed across all ranks as SwAV does (an all-reduce
of the normalisers); every other crop predicts them through a softmax at temperature 0.1.
Optimizer: AdamW substitutes for SwAV's LARS (LARS needs whole-tensor norms; see the sharded
optimizer). Under FSDP2 the prototype re-normalisation acts on the gathered copy only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from shardbench.models.base import BuiltinWorkload, Inputs, batch_generator
from shardbench.models.presets import swav as presets_module


class WideResNet50Trunk(nn.Module):
    """ResNet-50 (bottleneck, 3-4-6-3) whose stem has ``width`` channels (64 in ResNet-50, 64w
    in SwAV's RN50-wN) and every later width scaled with it; no fc."""

    def __init__(self, width: int = 64, depths: tuple[int, ...] = presets_module.DEPTHS) -> None:
        from torchvision.models.resnet import Bottleneck  # torchvision: imported only to build

        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        inplanes = width
        for i, (depth, stride) in enumerate(zip(depths, (1, 2, 2, 2), strict=True)):
            planes = width * 2**i
            for j in range(depth):
                s = stride if j == 0 else 1
                down = None
                if j == 0 and (s != 1 or inplanes != planes * Bottleneck.expansion):
                    down = nn.Sequential(
                        nn.Conv2d(inplanes, planes * 4, 1, s, bias=False), nn.BatchNorm2d(planes * 4)
                    )
                blocks.append(Bottleneck(inplanes, planes, s, down))
                inplanes = planes * Bottleneck.expansion
        self.blocks = nn.ModuleList(blocks)  # a list: FSDP2 shards each block
        self.out_dim = inplanes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


class SwAV(nn.Module):
    def __init__(
        self,
        width: int,
        hidden: int,
        feat_dim: int,
        prototypes: int,
        depths: tuple[int, ...] = presets_module.DEPTHS,
    ) -> None:
        super().__init__()
        self.trunk = WideResNet50Trunk(width, depths)
        self.projection = nn.Sequential(
            nn.Linear(self.trunk.out_dim, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, feat_dim),
        )
        self.prototypes = nn.Linear(feat_dim, prototypes, bias=False)

    def forward(self, crops: list[torch.Tensor]) -> torch.Tensor:
        """Scores of every crop against the prototypes, crops concatenated along the batch."""
        with torch.no_grad():  # SwAV keeps prototypes on the unit sphere
            self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1))
        feats = []
        for size in sorted({c.shape[-1] for c in crops}, reverse=True):  # one trunk pass per resolution
            same = torch.cat([c for c in crops if c.shape[-1] == size])
            feats.append(self.trunk(same))
        z = F.normalize(self.projection(torch.cat(feats)), dim=1)
        return self.prototypes(z)


@torch.no_grad()
def sinkhorn(scores: torch.Tensor, *, epsilon: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """Sinkhorn-Knopp codes for a batch of scores (B x K), normalised over the global batch."""
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    q = torch.exp(scores.float() / epsilon).t()  # K x B
    batch = q.shape[1] * world
    total = q.sum()
    if world > 1:
        dist.all_reduce(total)
    q /= total
    k = q.shape[0]
    for _ in range(iterations):
        rows = q.sum(dim=1, keepdim=True)
        if world > 1:
            dist.all_reduce(rows)
        q /= rows
        q /= k
        q /= q.sum(dim=0, keepdim=True)
        q /= batch
    return (q * batch).t()


class SwAVWorkload(BuiltinWorkload):
    name = "swav"
    lr = 1e-4
    shapes = presets_module
    presets = presets_module.PRESETS
    ladder = presets_module.LADDER
    temperature = 0.1

    def build(self, preset: str, *, dropout: bool = True) -> nn.Module:
        self.check_preset(preset)
        p = self.presets[preset]
        return SwAV(p["width"], p["hidden"], p["feat_dim"], p["prototypes"], presets_module.depths(p))

    def checkpoint_units(self, model: nn.Module) -> list[nn.Module]:
        """Each ResNet bottleneck (``trunk.blocks[i]``); its BatchNorm statistics are kept from
        counting the batch twice by ``shardbench.models.checkpointing``."""
        assert isinstance(model, SwAV)
        return list(model.trunk.blocks)

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
        self.check_preset(preset)
        n_global, global_size, n_local, local_size = self.presets[preset]["crops"]
        g = batch_generator(seed=seed, step=step, rank=rank)
        crops = {}
        for i in range(n_global + n_local):
            size = global_size if i < n_global else local_size
            crops[f"crop{i}"] = torch.randn(batch_size, 3, size, size, generator=g).to(device)
        return crops

    def loss(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        crops = [inputs[k] for k in sorted(inputs, key=lambda k: int(k[4:]))]
        batch = crops[0].shape[0]
        scores = model(crops).float()  # crops in order: the global ones (largest) come first
        n_global = sum(1 for c in crops if c.shape[-1] == crops[0].shape[-1])
        views = scores.split(batch)
        total = scores.new_zeros(())
        for i in range(n_global):
            q = sinkhorn(views[i].detach())
            for v, pred in enumerate(views):
                if v != i:
                    total = total - (q * F.log_softmax(pred / self.temperature, dim=1)).sum(dim=1).mean()
        return total / (n_global * (len(views) - 1))
