"""The child's stdout and stderr, drained by the parent and capped.

A kernel may print without end (a 100 MB flood filled a 2 GiB log before). The child writes into a pipe that
a thread of the parent drains at once, so the child never blocks on it and never meets a file-size limit;
the parent keeps the first HEAD_BYTES and the last TAIL_BYTES and counts what it dropped between them."""

from __future__ import annotations

import os
import threading

HEAD_BYTES = 16 * 1024
TAIL_BYTES = 64 * 1024


class OutputCapture:
    def __init__(self, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES) -> None:
        self._head_max, self._tail_max = head_bytes, tail_bytes
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self._lock = threading.Lock()
        self._read_fd, self.write_fd = os.pipe()
        self._thread = threading.Thread(target=self._drain, name="sandbox-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._read_fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            with self._lock:
                self.total += len(chunk)
                room = self._head_max - len(self._head)
                if room > 0:
                    self._head += chunk[:room]
                    chunk = chunk[room:]
                self._tail += chunk
                if len(self._tail) > self._tail_max:
                    del self._tail[: len(self._tail) - self._tail_max]
        os.close(self._read_fd)

    def child_started(self) -> None:
        """The child holds its own copy of the write end now: the parent's must go, or the drain never ends."""
        os.close(self.write_fd)
        self.write_fd = -1

    @property
    def dropped(self) -> int:
        with self._lock:
            return self.total - len(self._head) - len(self._tail)

    def text(self, n: int = 4000) -> str:
        """At most the last `n` bytes of what was kept, with a line saying how much was dropped, if any."""
        with self._lock:
            head, tail, total = bytes(self._head), bytes(self._tail), self.total
        dropped = total - len(head) - len(tail)
        if dropped <= 0:
            return (head + tail)[-n:].decode(errors="replace")
        note = (
            f"\n[kernel-audit: {dropped} bytes of the submission's output dropped; output is capped at "
            f"{(self._head_max + self._tail_max) // 1024} KiB]\n"
        ).encode()
        keep_head = max(0, n - len(note) - min(len(tail), n // 2))
        return (head[:keep_head] + note + tail[-(n - keep_head - len(note)) :]).decode(errors="replace")

    def close(self, timeout_s: float = 5.0) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1
        self._thread.join(timeout_s)
