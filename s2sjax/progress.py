"""Progress of long work: items done, throughput and ETA, the same way for every command line.

On a terminal a tqdm bar redraws in place; anywhere else (CI, a pod's log, a file) a plain line is printed at most
every `every_s` seconds and once at the end, so logs stay readable. Only process 0 shows anything.
"""

from __future__ import annotations

import sys
import time

import jax


class Progress:
  def __init__(self, total: int, description: str = "scoring", unit: str = "rows", rate_unit: str = "tokens",
               every_s: float = 10.0, stream=None):
    """total: items to do; `update(items, work)` also counts `work` (tokens, bytes) for the rate."""
    self.total, self.description, self.unit, self.rate_unit = total, description, unit, rate_unit
    self.every_s, self.stream = every_s, stream or sys.stderr
    self.done = self.work = 0
    self.start = self.last = time.time()
    self.shown = jax.process_index() == 0
    self._bar = None
    if self.shown and self.stream.isatty():
      from tqdm import tqdm

      self._bar = tqdm(total=total, desc=description, unit=f" {unit}", file=self.stream, dynamic_ncols=True,
                       leave=True)

  def update(self, items: int, work: int = 0) -> None:
    self.done += items
    self.work += work
    if not self.shown:
      return
    if self._bar is not None:
      self._bar.set_postfix_str(f"{self.rate():,.0f} {self.rate_unit}/s", refresh=False)
      self._bar.update(items)
      if self.done >= self.total:
        self._bar.close()
      return
    now = time.time()
    if now - self.last >= self.every_s or self.done >= self.total:
      self.last = now
      print(self.line(), file=self.stream, flush=True)

  def rate(self) -> float:
    return self.work / max(time.time() - self.start, 1e-9)

  def line(self) -> str:
    elapsed = time.time() - self.start
    eta = (self.total - self.done) * elapsed / max(self.done, 1)
    return (f"{self.description}: {self.done}/{self.total} {self.unit}, {self.rate():,.0f} {self.rate_unit}/s, "
            f"{elapsed:,.0f}s elapsed, ETA {eta:,.0f}s")
