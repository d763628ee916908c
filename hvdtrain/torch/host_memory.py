"""Large zeroed CPU buffers on transparent huge pages.

A freshly allocated CPU tensor of tens of MiB costs its page faults when it is first written: one
per 4 KiB page. For the flat buffers of the sharded optimizer (a whole model's gradients allocated
again before every backward pass under ZeRO-2, 22.7 M float32 for MiniLM) that was 32-40 ms per
update on this machine, against 5 ms when the same buffer lies on 2 MiB huge pages
(``benchmarks/workers/zero2_collectives.py``, variants ``realloc`` and ``rezero``).
:func:`huge_page_zeros` asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``, which works where
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``); where the kernel
has none to give, the mapping falls back to ordinary pages, zeroed all the same. Freeing the tensor
(and every view of it) unmaps the memory: it goes back to the system, as ``torch.zeros``'s would.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

#: A transparent huge page on x86-64 and arm64 (4 KiB base pages).
HUGE_PAGE = 2 << 20


def huge_page_zeros(numel: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zeroed 1-D tensor of ``numel`` elements: on huge pages for a CPU buffer of at least one
    huge page, from ``torch.zeros`` otherwise (other devices, small buffers, no ``madvise``)."""
    device = torch.device(device)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(numel, dtype=dtype, device=device)
    # anonymous memory reads as zeros; one huge page more, so the buffer can start on a boundary
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages (EINVAL): ordinary pages, zeroed all the same
        pass
    start = -ctypes.addressof(ctypes.c_char.from_buffer(region)) % HUGE_PAGE
    # the tensor holds the mapping: unmapped when the last view of it is gone
    return torch.frombuffer(region, dtype=torch.uint8)[start:start + nbytes].view(dtype)
