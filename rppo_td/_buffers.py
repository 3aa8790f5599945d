"""OutputPool: output memory reused once nothing holds it, so large outputs skip fresh pages.

Not a transform: ``SequencePadder`` and the samplers own one each (``_layout`` fills it).

Writing a large output into fresh memory costs the kernel's first touch of every page, which
on some machines is far slower than the copy itself (benchmarks/pipeline.py prints both). A
pool keeps the memory of its last outputs and hands it out again for the next one, but only
when no tensor outside the pool still uses it: every output is a *view* of a pooled buffer,
so each live output, each view of it and each tensor autograd saved from it counts as a use
of the buffer's storage. A buffer in use is never written, so reuse is invisible to callers:
outputs kept alive (``list(sampler(td))``, a graph not yet backwarded) simply get new memory.
A buffer moved to shared memory (an output sent to another process through
``torch.multiprocessing``, which moves its storage there) may still be read by that process
when no tensor here uses it: the pool drops it and never writes it again.

CPU only: CUDA's caching allocator already reuses freed blocks.
"""

from __future__ import annotations

import math
import sys
import threading

import torch
from tensordict import NestedKey

__all__ = ["OutputPool", "storage_uses"]

# buffers kept per key: an output and its successor are alive at once in
# ``x = pad(next_rollout)``, so two let every call after the second reuse memory
SLOTS = 2
# capacity over the request, so that the next outputs, a few rows larger, still fit
HEADROOM = 1.25
# smaller outputs mostly come from the allocator's heap, whose pages are touched already
# (glibc serves allocations from fresh mmap'd pages above a threshold that rises to at most
# 32 MiB); measured on the 2-core VM, a pooled 64 MiB gather took 10 ms against 70 ms into
# fresh memory, at 4-16 MiB the two were even, and below 1 MiB the pool only adds overhead
MIN_BYTES = 8 << 20


def _probe(buffer: torch.Tensor) -> tuple[int, int]:
    """The storage's C++ use count and its Python object's reference count, as probed."""
    storage = buffer.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)


# the Python references of a storage object made for the probe alone
_PROBE_REFS = _probe(torch.empty(1))[1] if hasattr(torch._C, "_storage_Use_Count") else 0


def storage_uses(buffer: torch.Tensor) -> int:
    """References to the tensor's storage (its own tensor included, the probe excluded).

    The probe's storage object is one use of its own, unless it was alive already: torch
    hands out the storage object a caller holds (``t.untyped_storage()``, ``t.storage()``),
    and that object's use is the caller's.
    """
    uses, refs = _probe(buffer)
    return uses - 1 if refs <= _PROBE_REFS else uses


class OutputPool:
    """Hands out ``[*shape]`` tensors in memory that earlier outputs used, when it is free.

    ``empty(key, shape, like)`` is ``like.new_empty(shape)`` in effect: uninitialised, of
    ``like``'s dtype and device. On CPU, for outputs of at least 8 MiB (smaller ones mostly
    come from touched heap memory anyway), it is a view of one of up to two buffers kept for
    ``key``, chosen among those no tensor outside the pool uses and large enough; a buffer is
    (re)allocated with 25% headroom when none fits. A buffer found in shared memory (an output
    sent to another process) is dropped, never reused: the other process may still read it.
    Outside CPU, or where torch does not expose storage use counts, it is ``new_empty``; so is
    an output of a tensor that requires grad (written with ``out=``, it would leave autograd's
    graph), or one made in inference mode (its buffer could not be written outside it).

    Example:
        >>> pool = OutputPool()
        >>> a = pool.empty("x", (2048, 1024), torch.zeros(1))  # 8 MiB
        >>> b = pool.empty("x", (2048, 1024), torch.zeros(1))  # a is alive: other memory
        >>> a.data_ptr() != b.data_ptr()
        True
        >>> ptr = a.data_ptr()
        >>> del a
        >>> pool.empty("x", (2048, 1024), torch.zeros(1)).data_ptr() == ptr  # a's memory again
        True
    """

    enabled = hasattr(torch._C, "_storage_Use_Count")

    def __init__(self) -> None:
        self._buffers: dict[tuple[NestedKey, torch.dtype], list[torch.Tensor]] = {}
        # two threads asking at once (one sampler iterated from two) must not get one buffer
        self._lock = threading.Lock()

    def wants(self, like: torch.Tensor, numel: int) -> bool:
        """Whether an output of ``numel`` elements like ``like`` is pooled (else: allocate it).

        Callers that make many small outputs ask first, sparing them ``empty``'s overhead.
        """
        return (
            numel * like.element_size() >= MIN_BYTES
            and like.device.type == "cpu"
            and not like.requires_grad  # out= ops are not recorded by autograd
            # a buffer made in inference mode could not be written outside it later
            and not torch.is_inference_mode_enabled()
            and self.enabled
        )

    def empty(self, key: NestedKey, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised ``shape`` tensor of ``like``'s dtype and device (see the class)."""
        numel = math.prod(shape)
        if not self.wants(like, numel):
            return like.new_empty(shape)
        with self._lock:
            return self._take(key, shape, numel, like)

    def _take(
        self, key: NestedKey, shape: tuple[int, ...], numel: int, like: torch.Tensor
    ) -> torch.Tensor:
        slots = self._buffers.setdefault((key, like.dtype), [])
        # an output sent to another process moved its buffer to shared memory: that process
        # may read it whatever this one holds, so the buffer is left to it
        slots[:] = [b for b in slots if not b.is_shared()]
        free = [b for b in slots if storage_uses(b) == 1]
        fits = [b for b in free if b.numel() >= numel]
        if fits:
            buffer = min(fits, key=torch.Tensor.numel)
        else:
            buffer = like.new_empty(max(int(numel * HEADROOM), 1))
            if len(slots) < SLOTS:
                slots.append(buffer)
            elif free:  # replace a free buffer that is too small
                slots[next(i for i, b in enumerate(slots) if b is free[0])] = buffer
            else:  # every kept buffer is in use: this output is not pooled
                return like.new_empty(shape)
        return buffer[:numel].view(shape)

    def __getstate__(self) -> dict:
        # a copy (deepcopy, pickle) of an owner starts with an empty pool, not the buffers
        return {}

    def __setstate__(self, state: dict) -> None:
        self._buffers = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Drops the kept buffers (their memory is freed once no output uses it)."""
        self._buffers.clear()
