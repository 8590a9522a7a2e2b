"""A small model and a training loop that does what people's own loops do to a wrapped model:
ranks that initialise their own weights, a frozen embedding unfrozen mid-training, a block frozen
and unfrozen again, a param group added live, every clip norm, an LR scheduler, eval forwards
between steps, a closure, accumulation with and without ``no_sync``. ``train_reference`` runs it
in one process with plain AdamW over the global batch; ``train_sharded`` runs it on a rank of our
ZeRO at a stage; with exact arithmetic both compute the same parameters."""

from __future__ import annotations

import math

import torch
from torch import nn

from shardbench.strategies.sharded import ShardedDataParallel, ShardedOptimizer

VOCAB, DIM, TOKENS, PER_RANK, STEPS = 16, 8, 3, 4, 6
#: SGD with momentum: a step proportional to the gradient, so a wrong average shows (Adam's
#: update is blind to the gradient's scale), and state (the momentum) that must survive
OPTIMIZER, HYPER = torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1}
#: the clip norm of each step: every norm type in turn
NORMS = (2.0, 1.0, math.inf)
CLIP = 1e6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.norm(self.linear(x)))


class Net(nn.Module):
    """An embedding (frozen at first), two blocks (stage 3's units), a head."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.embed.weight.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).mean(1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(step: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ``PER_RANK`` rows per rank."""
    g = torch.Generator().manual_seed(1000 + step)
    rows = PER_RANK * world_size
    return torch.randint(0, VOCAB, (rows, TOKENS), generator=g), torch.randn(rows, 2, generator=g)


def groups(model: Net, *, live_group: bool) -> list[dict]:
    """The optimizer's groups; with ``live_group`` the embedding is not in any until step 2 adds
    it with a learning rate of its own."""
    rest = [p for n, p in model.named_parameters() if not n.startswith("embed")]
    if live_group:
        return [{"params": rest}]
    return [{"params": rest}, {"params": [model.embed.weight], "lr": 3e-3}]


def change_trainability(model: Net, opt: torch.optim.Optimizer, step: int, *, live_group: bool) -> None:
    """Between steps (after ``step``'s update): unfreeze the embedding after step 1 (adding its
    group then, if ``live_group``), freeze the first block after step 3 and unfreeze it after
    step 4 (its optimizer state resumes, as a plain optimizer keeps it)."""
    if step == 1:
        model.embed.weight.requires_grad_(True)
        if live_group:
            opt.add_param_group({"params": [model.embed.weight], "lr": 3e-3})
    elif step == 3:
        model.blocks[0].requires_grad_(False)
    elif step == 4:
        model.blocks[0].requires_grad_(True)


def _loss(model: nn.Module, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(tokens), target)


def train_reference(world_size: int, *, live_group: bool) -> dict[str, torch.Tensor]:
    model = Net(seed=0)
    opt = OPTIMIZER(groups(model, live_group=live_group), **HYPER)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for step in range(STEPS):
        tokens, target = batch(step, world_size)
        opt.zero_grad(set_to_none=True)
        _loss(model, tokens, target).backward()
        trainable = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(trainable, CLIP, norm_type=NORMS[step % 3])
        opt.step()
        sched.step()
        change_trainability(model, opt, step, live_group=live_group)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def wrap(model: Net, opt: ShardedOptimizer, stage: int) -> ShardedDataParallel:
    return ShardedDataParallel(model, opt, stage=stage)


def train_sharded(
    rank: int, world_size: int, stage: int, *, live_group: bool, accumulate: bool
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s model after ``STEPS`` steps, whole. Each rank initialises its own weights
    (seed = rank): the wrapper must start every rank from rank 0's, the frozen embedding too."""
    model = Net(seed=rank)
    opt = ShardedOptimizer(groups(model, live_group=live_group), optim=OPTIMIZER, **HYPER)
    wrapped = wrap(model, opt, stage)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for step in range(STEPS):
        tokens, target = (t[rows] for t in batch(step, world_size))
        with torch.no_grad():  # an eval forward between steps changes nothing
            wrapped.eval()
            wrapped(tokens)
            wrapped.train()
        opt.zero_grad(set_to_none=True)
        if accumulate:  # two micro-batches, the first under no_sync (DDP-style)
            half = PER_RANK // 2
            with wrapped.no_sync():
                (_loss(wrapped, tokens[:half], target[:half]) / 2).backward()
            (_loss(wrapped, tokens[half:], target[half:]) / 2).backward()
        else:
            _loss(wrapped, tokens, target).backward()
        opt.clip_grad_norm_(CLIP, norm_type=NORMS[step % 3])
        if step == 2:  # a closure, as FairScale's OSS supports
            opt.step(closure=lambda: 0.0)
        else:
            opt.step()
        sched.step()
        change_trainability(model, opt, step, live_group=live_group)
    state = wrapped.full_state_dict()
    wrapped.close()
    return state


class OddNet(nn.Module):
    """Parameters FairScale's suites single out: a 1-element one (fewer elements than ranks), a
    float64 one beside the float32 ones (a bucket per dtype), and a frozen integer one."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(DIM, 2)
        self.scale = nn.Parameter(torch.ones(1))
        self.shift = nn.Parameter(torch.randn(2, dtype=torch.float64))
        self.counts = nn.Parameter(torch.arange(3) + seed, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.linear(x) * self.scale).double() + self.shift + self.counts.sum()


def odd_batch(step: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + step)
    rows = PER_RANK * world_size
    return torch.randn(rows, DIM, generator=g), torch.randn(rows, 2, generator=g, dtype=torch.float64)


def train_odd_reference(world_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    model = OddNet(seed=seed)
    opt = OPTIMIZER(model.parameters(), **HYPER)
    for step in range(3):
        x, y = odd_batch(step, world_size)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_odd_sharded(rank: int, world_size: int, stage: int, group: object, members: list[int]) -> dict:
    """``OddNet`` trained by the ranks ``members`` of the world, over their process group."""
    model = OddNet(seed=rank)
    opt = ShardedOptimizer(model.parameters(), optim=OPTIMIZER, process_group=group, **HYPER)
    wrapped = ShardedDataParallel(model, opt, stage=stage)
    me = members.index(rank)
    rows = slice(me * PER_RANK, (me + 1) * PER_RANK)
    for step in range(3):
        x, y = (t[rows] for t in odd_batch(step, len(members)))
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        opt.step()
    state = wrapped.full_state_dict()
    wrapped.close()
    return state
