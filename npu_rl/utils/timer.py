"""Wall-clock timing of the step's phases, synchronised with the device so queued kernels are counted."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict


class PhaseTimer:
    """``with timer("gen"): ...`` accumulates seconds under ``timing_s/gen``."""

    def __init__(self, synchronize=None, around=None):
        self._sync = synchronize or (lambda: None)
        self._around = around  # name -> context manager entered inside the timed region (e.g. a profiler's phase)
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        self._sync()
        start = time.perf_counter()
        try:
            with self._around(name) if self._around is not None else contextlib.nullcontext():
                yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start

    def metrics(self, num_tokens: dict[str, int] | None = None) -> dict[str, float]:
        """``timing_s/<phase>``, and ``timing_per_token_ms/<phase>`` for phases given a token count."""
        out = {f"timing_s/{k}": v for k, v in self.seconds.items()}
        for name, tokens in (num_tokens or {}).items():
            if name in self.seconds and tokens > 0:
                out[f"timing_per_token_ms/{name}"] = 1000.0 * self.seconds[name] / tokens
        return out

    def reset(self) -> None:
        self.seconds.clear()
