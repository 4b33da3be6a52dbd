"""A client's shared-memory region (client/region.cc): a memfd sealed against shrinking and
growing, mapped read-write here and registered with warmpoold once per connection, so that large
tensors travel as offsets and the daemon never copies them. The worker that runs a request reads
the input from the region and writes the output into it."""

import fcntl
import mmap
import os

import numpy as np

from ._errors import resource_exhausted

_F32 = np.dtype("<f4")


class SharedRegion:
    """A sealed memfd of ``size`` bytes mapped here; ``id`` is the daemon's once registered."""

    def __init__(self, size):
        if size <= 0:
            raise ValueError("a region needs at least one byte")
        self.size = size
        self.id = 0
        self.fd = os.memfd_create("warmpool-client-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            # The daemon requires F_SEAL_SHRINK: a region that could shrink under a worker that
            # maps it would kill the worker.
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException as error:
            # Whatever stops it (an interrupt included), a region half made leaks no memfd.
            os.close(self.fd)
            self.fd = -1
            if not isinstance(error, OSError):
                raise
            raise resource_exhausted(
                f"cannot create a shared-memory region of {size} bytes: {error.strerror}"
            ) from None

    def write_matrix(self, offset, matrix):
        """Copies a float32 (rows, cols) matrix to offset."""
        view = np.frombuffer(self._map, dtype=_F32, count=matrix.size, offset=offset)
        view[:] = matrix.reshape(-1)
        del view

    def read_matrix(self, offset, rows, cols):
        """A copy of the rows x cols float32 matrix at offset."""
        view = np.frombuffer(self._map, dtype=_F32, count=rows * cols, offset=offset)
        out = view.reshape(rows, cols).copy()
        del view
        return out

    def close(self):
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            self.id = 0
            try:
                self._map.close()
            finally:
                os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to release into
            pass


def round_up(value, to):
    return (value + to - 1) // to * to
