"""``release``: free a tensor's memory at a fixed point of the program, whoever else holds it.

A finished collective's tensors are held by its work until the process group's own thread lets
go of it too: gloo's worker thread, which needs the GIL to drop the last reference to a tensor
Python knows, so it waits for the main thread to release the GIL; NCCL's watchdog. A buffer freed
by dropping our references then dies at a moment thread scheduling decides: on a loaded machine,
after the next buffer or gradient shard was allocated, with the peak raised by the whole buffer,
so the same cell twice would not give the same bytes. Emptying its storage frees the bytes where
the code says (the storage, now of no bytes, goes whenever its last holder lets go).
"""

from __future__ import annotations

import torch


def release(tensor: torch.Tensor) -> None:
    """Free ``tensor``'s memory now; it (and every view of it) must not be read again."""
    tensor.untyped_storage().resize_(0)
