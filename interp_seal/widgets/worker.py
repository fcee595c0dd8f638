"""One computation at a time, off the kernel's main thread, so that clicks keep arriving.

A Jupyter kernel handles one message at a time: while a click's handler computes, the next
click waits unseen in the kernel's queue, and the page shows nothing until the update ends.
``Worker`` runs the dashboard's computations (accuracy updates, channel maps) on one background
thread in the order they were asked for, so a click's handler returns at once: it marks the
grid cell and says "queued" while the running update finishes, and its own update follows.
Widget changes made from the worker reach the page as usual (ipykernel sends them from any
thread). ``background=False`` runs each job at once in the caller's thread: scripts and tests
see the finished state when a call returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Worker:
    """Runs jobs one at a time, in submission order.

    Args:
        background: run them on a daemon thread (the caller returns at once); False runs each
            in the caller's thread before ``submit`` returns.
        on_error: called with the exception of a job that raised (in background mode the
            worker then goes on with the next job; in the caller's thread it is re-raised).
    """

    def __init__(self, *, background: bool, on_error: Callable[[Exception], None]):
        self.background, self.on_error = background, on_error
        self._jobs: queue.Queue = queue.Queue()
        self._pending = 0  # jobs submitted and not finished
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._idle:
            return self._pending

    def submit(self, job: Callable[[], None]) -> None:
        with self._idle:
            self._pending += 1
        if not self.background:
            try:
                self._run(job, reraise=True)
            finally:
                self._done()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dashboard", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted job has finished; False if ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                self._run(job, reraise=False)
            finally:
                self._done()

    def _run(self, job: Callable[[], None], *, reraise: bool) -> None:
        try:
            job()
        except Exception as err:  # a failed job is reported on the page, never lost silently
            self.on_error(err)
            if reraise:
                raise

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()
