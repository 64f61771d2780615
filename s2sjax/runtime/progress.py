"""Progress of long work: items done, throughput and ETA, the same way for every command line.

On a terminal a tqdm bar redraws in place; anywhere else (CI, a pod's log, a file) a plain line is printed every
`every_s` seconds and once at the end, so logs stay readable. A message printed while a bar is drawn goes through
`say`, which writes it on a line of its own above the bar; `end_bars` leaves every bar drawn as it stands, before a
command's last words (an interruption, an error), so that none is drawn again below them. The lines come from a timer thread, not only between
steps, so a log shows the work alive through a long step (a first compilation, a slow chunk). Only process 0 shows
anything.

The ETA is the pace since the first update (whose time holds the start-up: loading, compiling) times the items
left, shown once an item is done after it; the rate is left out while no work (tokens, audio seconds) has been
counted, as in a text-only build.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref

_PRINT_LOCK = threading.Lock()  # one line at a time, from the caller or a timer thread
_EXITING = threading.Event()  # set at interpreter exit: a timer thread must not write to a stream being closed
_BARS: "weakref.WeakSet[Progress]" = weakref.WeakSet()  # the bars drawn on a terminal and not closed yet


@atexit.register
def _stop_timers() -> None:
  with _PRINT_LOCK:
    _EXITING.set()


class Progress:
  def __init__(self, total: int, description: str = "scoring", unit: str = "rows", rate_unit: str = "tokens",
               every_s: float = 10.0, stream=None, clock=time.monotonic):
    """total: items to do; `update(items, work)` also counts `work` (tokens, bytes, audio seconds) for the rate.
    clock: seconds, for the elapsed time, the rate and the ETA."""
    self.total, self.description, self.unit, self.rate_unit = total, description, unit, rate_unit
    self.every_s, self.stream, self.clock = every_s, stream or sys.stderr, clock
    self.done = self.work = 0
    self.start = self.last_shown = clock()
    self._first: tuple[float, int] | None = None  # (time, items done) when the first update ended
    self.closed = False
    # process 0 of a multi-process JAX run; a command that never imported jax (the importer) is one process
    jax = sys.modules.get("jax")
    self.shown = jax is None or jax.process_index() == 0
    self.timer = None
    self._bar = None
    self._stopped = threading.Event()  # ends the timer thread
    if not self.shown:
      return
    if self.stream.isatty():
      from tqdm import tqdm

      self._bar = tqdm(total=total, desc=description, unit=f" {unit}", file=self.stream, dynamic_ncols=True,
                       leave=True, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{unit} "
                                              "[{elapsed}{postfix}]")
      _BARS.add(self)
    if total > 0 and every_s > 0:  # every_s=0: a line at every update, none between
      weakref.finalize(self, self._stopped.set)  # dropped unfinished (an error on the way): its timer ends too
      self.timer = threading.Thread(target=_tick_until_stopped, name=f"progress: {description}", daemon=True,
                                    args=(weakref.ref(self), self._stopped,
                                          1.0 if self._bar is not None else every_s))
      self.timer.start()

  def update(self, items: int, work: float = 0) -> None:
    now = self.clock()
    self.done += items
    self.work += work
    if self._first is None:
      self._first = (now, self.done)
    if not self.shown:
      return
    finished = self.done >= self.total
    if self._bar is not None:
      with _PRINT_LOCK:
        if self.closed:
          return
        self._bar.set_postfix_str(self._details(now), refresh=False)
        self._bar.update(items)
        if finished:
          self._close()
          self._bar.close()
      return
    self._show(now, final=finished)

  def tick(self) -> None:
    """Between updates (the timer thread): a line if `every_s` has passed since the last one, or a redrawn bar
    whose elapsed time and ETA have moved on."""
    now = self.clock()
    if self._bar is None:
      self._show(now)
      return
    with _PRINT_LOCK:
      if not self.closed and not _EXITING.is_set():
        self._bar.set_postfix_str(self._details(now), refresh=True)

  def _show(self, now: float, final: bool = False) -> None:
    with _PRINT_LOCK:
      if self.closed or _EXITING.is_set() or (not final and now - self.last_shown < self.every_s):
        return
      self.last_shown = now
      if final:
        self._close()
      self.stream.write(self.line(now) + "\n")
      self.stream.flush()

  def _close(self) -> None:
    self.closed = True
    self._stopped.set()
    _BARS.discard(self)

  def rate(self, now: float | None = None) -> float:
    return self.work / max((self.clock() if now is None else now) - self.start, 1e-9)

  def eta(self, now: float | None = None) -> float | None:
    """Seconds left at the pace since the first update: the time since it over the items done since (None before
    any, and once all are done). A step that takes long makes it grow as it runs."""
    if self._first is None or self.done >= self.total or self.done <= self._first[1]:
      return None
    now = self.clock() if now is None else now
    return (now - self._first[0]) / (self.done - self._first[1]) * (self.total - self.done)

  def _rate_text(self, now: float) -> list[str]:
    """The rate, once work is counted (a text-only build counts no audio seconds)."""
    if not self.work:
      return []
    rate = self.rate(now)
    return [f"{rate:,.1f} {self.rate_unit}/s" if rate < 10 else f"{rate:,.0f} {self.rate_unit}/s"]

  def _eta_text(self, now: float) -> list[str]:
    eta = self.eta(now)
    return [] if eta is None else [f"ETA {eta:,.0f}s"]

  def _details(self, now: float) -> str:
    """The bar's postfix: the rate and the ETA (the bar shows its own elapsed time)."""
    return ", ".join(self._rate_text(now) + self._eta_text(now))

  def line(self, now: float | None = None) -> str:
    now = self.clock() if now is None else now
    parts = [f"{self.done}/{self.total} {self.unit}", *self._rate_text(now), f"{now - self.start:,.0f}s elapsed",
             *self._eta_text(now)]
    return f"{self.description}: {', '.join(parts)}"


def say(message: str, stream=None) -> None:
  """Prints `message` as a line of its own on `stream` (default stderr), above the bars drawn there, which are
  drawn again below it; off a terminal, a plain print."""
  stream = stream or sys.stderr
  with _PRINT_LOCK:
    if any(bar.stream is stream for bar in _BARS):
      from tqdm import tqdm

      tqdm.write(message, file=stream)
    else:
      print(message, file=stream, flush=True)


def end_bars() -> None:
  """Closes every bar still drawn, as it stands (done or not), so that what is printed next lies below it and no
  bar is drawn again after it."""
  with _PRINT_LOCK:
    for meter in list(_BARS):
      meter._close()
      meter._bar.close()


def _tick_until_stopped(progress: weakref.ref, stopped: threading.Event, interval: float) -> None:
  """The timer thread: ticks every `interval` seconds until the work is done or its Progress is dropped."""
  while not stopped.wait(interval):
    meter = progress()
    if meter is None or meter.closed:
      return
    meter.tick()
    del meter  # no reference held while waiting: a dropped Progress is collected and stops this
