"""``FileChanges``: a wait that ends when some files in a directory are written (Linux inotify).

The SQLite wakeup uses it to sleep until a commit lands in the database or
its WAL, instead of polling. inotify is reached through ctypes (it is in
every Linux libc); elsewhere ``of()`` returns None and the caller polls.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import sys
import time
from pathlib import Path


class FileChanges:
    """Linux inotify on a directory, filtered to some file names: a wait that ends on a write."""

    IN_MODIFY, IN_CREATE, IN_MOVED_TO = 0x2, 0x100, 0x80
    IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000

    def __init__(self, fd: int, names: set[str]) -> None:
        self.fd = fd
        self.names = names

    @classmethod
    def of(cls, directory: Path, names: set[str]) -> FileChanges | None:
        """Watch ``directory`` for writes to ``names``; None where inotify is unavailable."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(cls.IN_NONBLOCK | cls.IN_CLOEXEC)
            if fd < 0:
                return None
            mask = cls.IN_MODIFY | cls.IN_CREATE | cls.IN_MOVED_TO
            if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
                os.close(fd)
                return None
        except (OSError, AttributeError):
            return None
        return cls(fd, names)

    def wait(self, timeout: float) -> bool:
        """Block until one of the names was written (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready and self._touched():
                return True
        return False

    def _touched(self) -> bool:
        touched = False
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return False
        offset = 0
        while offset + 16 <= len(data):
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", data, offset)
            name = data[offset + 16 : offset + 16 + length].rstrip(b"\0").decode(errors="replace")
            touched = touched or name in self.names
            offset += 16 + length
        return touched

    def close(self) -> None:
        os.close(self.fd)
