"""Measure the CUDA context of one training process: the device memory in use outside the
caching allocator once CUDA, cuBLAS and an optimizer step have run (what `plan`'s reserve adds
to the allocator's overhead). Run it alone on an idle card; prints JSON, e.g. into
results/gpu/<date>/cuda-context.json, which scripts/derive_cuda_reserve.py reads.
"""

from __future__ import annotations

import json

import torch


def main() -> None:
    assert torch.cuda.is_available(), "needs a CUDA device"
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):  # kernels, cuBLAS handle and workspace, the optimizer's path: all loaded
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    print(
        json.dumps(
            {
                "context_bytes": total - free - reserved,
                "device_used_bytes": total - free,
                "allocator_reserved_bytes": reserved,
                "device_name": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "note": "device memory in use outside the caching allocator; the card was to be idle",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
