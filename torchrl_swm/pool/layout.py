"""Where each leaf of a pool lives in its flat byte buffer (see :mod:`.buffers`).

Kept free of torch: worker processes unpickle the layout to attach to the shared
buffer, and a spawned worker that imported torch would take seconds more to start
and to exit.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["BufferLayout", "LeafSlot"]

Key = tuple[str, ...]
_ALIGN = 64


def _numpy_dtype(dtype) -> np.dtype:
    torch = sys.modules.get("torch")  # a torch dtype implies torch is imported
    if torch is not None and isinstance(dtype, torch.dtype):
        from ..specs import numpy_dtype

        return numpy_dtype(dtype)
    return np.dtype(dtype)


@dataclass(frozen=True)
class LeafSlot:
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    nbytes: int


class BufferLayout:
    """Where each leaf lives in the flat buffer. Picklable, so workers can attach to it.

    Args:
        leaves: ``{nested key tuple: (shape, dtype)}`` with the batch dim first.
    """

    def __init__(self, leaves: Mapping[Key, tuple[tuple[int, ...], np.dtype]]):
        self.slots: dict[Key, LeafSlot] = {}
        offset = 0
        for key, (shape, dtype) in leaves.items():
            dtype = _numpy_dtype(dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.slots[key] = LeafSlot(tuple(int(s) for s in shape), dtype, offset, nbytes)
            offset += -(-nbytes // _ALIGN) * _ALIGN
        self.nbytes = max(offset, _ALIGN)

    def views(self, flat: np.ndarray) -> dict[Key, np.ndarray]:
        """Numpy views of every leaf inside ``flat`` (a uint8 array of ``nbytes``)."""
        return {
            key: flat[s.offset : s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
            for key, s in self.slots.items()
        }
