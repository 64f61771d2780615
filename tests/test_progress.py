"""The progress lines off a terminal, on a fake clock and stream: no ETA from the first update alone (its time holds
the start-up), then one from the pace after it; no rate while no work is counted; a line every `every_s` from
the timer between updates; the timer thread ends with the work, or when its Progress is dropped."""

import gc
import io
import threading

from s2sjax.runtime.progress import Progress, end_bars, say


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _progress(total, clock, **kwargs):
  stream = io.StringIO()  # not a terminal: plain lines
  return Progress(total, "scoring", clock=clock, stream=stream, **kwargs), stream


def _lines(stream):
  return stream.getvalue().splitlines()


def test_the_eta_waits_for_the_items_after_the_first_update():
  clock = FakeClock()
  progress, stream = _progress(6, clock, every_s=0)
  clock.now = 1390.0  # the first chunk: loading and compiling, then one item
  progress.update(1, 100_000)
  clock.now = 1392.0  # two more items in 2 s: 1 s an item, 3 to go
  progress.update(2, 200_000)
  clock.now = 1395.0
  progress.update(3, 300_000)
  assert _lines(stream) == ["scoring: 1/6 rows, 72 tokens/s, 1,390s elapsed",
                            "scoring: 3/6 rows, 216 tokens/s, 1,392s elapsed, ETA 3s",
                            "scoring: 6/6 rows, 430 tokens/s, 1,395s elapsed"]


def test_the_eta_grows_through_a_long_step():
  clock = FakeClock()
  progress, _ = _progress(10, clock)
  clock.now = 50.0
  progress.update(1)
  assert progress.eta() is None
  clock.now = 54.0
  progress.update(1)  # 4 s an item since the first update, 8 to go
  assert progress.eta() == 32.0
  clock.now = 64.0  # the next item is not done yet: 14 s an item so far
  assert progress.eta() == 112.0


def test_no_rate_while_no_work_is_counted():
  clock = FakeClock()
  progress, stream = _progress(3, clock, unit="questions", rate_unit="audio s", every_s=0)
  clock.now = 5.0
  progress.update(1)  # a text build: no audio seconds
  clock.now = 6.0
  progress.update(2)
  assert _lines(stream) == ["scoring: 1/3 questions, 5s elapsed", "scoring: 3/3 questions, 6s elapsed"]
  speech, stream = _progress(3, clock, unit="questions", rate_unit="audio s", every_s=0)
  clock.now = 10.0
  speech.update(3, 9.5)  # a slow rate keeps a decimal
  assert _lines(stream) == ["scoring: 3/3 questions, 2.4 audio s/s, 4s elapsed"]


def test_a_line_every_every_s_between_updates_and_none_after_the_last():
  clock = FakeClock()
  progress, stream = _progress(2, clock, every_s=10)
  clock.now = 10.0
  progress.tick()  # a long first step: the timer's line says it is alive
  clock.now = 15.0
  progress.tick()  # 5 s since the last line: none
  progress.update(1, 100)  # nor from an update within every_s
  clock.now = 25.0
  progress.tick()
  clock.now = 26.0
  progress.update(1, 100)  # the last: always shown
  clock.now = 60.0
  progress.tick()
  assert _lines(stream) == ["scoring: 0/2 rows, 10s elapsed", "scoring: 1/2 rows, 4.0 tokens/s, 25s elapsed",
                            "scoring: 2/2 rows, 7.7 tokens/s, 26s elapsed"]


class _Signalling(io.StringIO):
  def __init__(self):
    super().__init__()
    self.written = threading.Event()

  def write(self, text):
    self.written.set()
    return super().write(text)


def test_the_timer_thread_prints_without_updates_and_ends_with_the_work():
  stream = _Signalling()
  progress = Progress(2, "scoring", every_s=0.01, stream=stream)
  assert stream.written.wait(timeout=30), "no line from the timer"
  progress.update(2)
  progress.timer.join(timeout=30)
  assert not progress.timer.is_alive()
  assert _lines(stream)[-1].startswith("scoring: 2/2 rows, ")


def test_a_dropped_unfinished_progress_stops_its_timer():
  progress = Progress(5, "scoring", every_s=3600, stream=io.StringIO())
  timer = progress.timer
  del progress
  gc.collect()
  timer.join(timeout=30)
  assert not timer.is_alive()


class _Terminal(io.StringIO):
  """What a terminal is sent: the bar draws itself here, redrawing in place with carriage returns."""

  def isatty(self):
    return True


def _screen(text: str) -> list[str]:
  """The lines a terminal shows for `text`: each carriage return writes over its line from the first column."""
  lines = []
  for raw in text.split("\n"):
    cells: list[str] = []
    for part in raw.split("\r"):
      cells[:len(part)] = part
    lines.append("".join(cells).rstrip())
  return lines


def test_a_message_said_while_a_bar_is_drawn_gets_a_line_of_its_own_above_it():
  terminal = _Terminal()
  progress = Progress(3, "scoring", stream=terminal)
  say("scmmlu/s2t: resuming, 1 of 3 chunks done", terminal)
  progress.update(3, 30)
  shown = [line for line in _screen(terminal.getvalue()) if line]
  assert shown[0] == "scmmlu/s2t: resuming, 1 of 3 chunks done"
  assert shown[-1].startswith("scoring: 100%|") and "3/3 rows" in shown[-1]
  plain = io.StringIO()  # off a terminal: a plain line
  say("resuming", plain)
  assert plain.getvalue() == "resuming\n"


def test_ended_bars_are_not_drawn_again_below_what_follows():
  terminal = _Terminal()
  progress = Progress(5, "scoring", stream=terminal)
  progress.update(2, 20)
  end_bars()  # Ctrl-C: the bar stays as it stood, then the command's last line
  terminal.write("interrupted by SIGINT: kept 2 finished chunks\n")
  del progress
  gc.collect()  # a dropped tqdm closes itself, and would draw its bar once more
  shown = [line for line in _screen(terminal.getvalue()) if line]
  assert shown[-1] == "interrupted by SIGINT: kept 2 finished chunks"
  assert shown[-2].startswith("scoring:  40%|") and "2/5 rows" in shown[-2]
