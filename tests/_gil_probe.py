"""The GIL probe of the tests that check a native call releases the GIL (io/test_gil.py has
the harness's own checks): a thread that counts how often it gets the GIL during a call.
No timings are asserted: only how many times the other thread ran during the call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MIN_TURNS = 10  # turns the probe must get during a call that releases the GIL
MAX_TURNS_HELD = 3  # turns it can get around a call that holds the GIL


class Probe:
    """A thread that counts how often it gets the GIL while ``inside`` is set."""

    def __init__(self) -> None:
        self.inside = False
        self.turns = 0
        self.calls = 0
        self.per_call: list[int] = []  # turns counted during each call, in order
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop:
            time.sleep(0.0002)  # releases the GIL; needs it back to go on
            if self.inside:
                self.turns += 1

    def watch(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, with ``inside`` set for exactly the duration of each call."""

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            before = self.turns
            self.inside = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside = False
                self.per_call.append(self.turns - before)

        return watched


@contextmanager
def probe_thread() -> Iterator[Probe]:
    probe = Probe()
    probe._thread.start()
    time.sleep(0.01)  # let it reach its loop
    try:
        yield probe
    finally:
        probe._stop = True
        probe._thread.join(10)
        assert not probe._thread.is_alive()
