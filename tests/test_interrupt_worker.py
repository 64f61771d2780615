"""`cli.in_worker`: under a command line's handlers, a long computation (an XLA compilation or step) runs in a
worker thread while the main thread waits on it and on SIGINT / SIGTERM, so the signal raises `cli.Interrupted` at
once, the computation still running; its result is dropped. (tests/test_interrupt.py does the same to a whole
`s2sjax.eval`.)"""

import os
import signal
import threading

import pytest

from s2sjax.runtime import cli

HANG_GUARD_S = 600  # a bound on a hung thread, not a measurement


@pytest.fixture
def signals_caught():
  """cli's handlers installed (a signal raises Interrupted), the test process's own restored after."""
  handlers = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
  cli.catch_interrupts()
  yield
  for each, handler in handlers.items():
    signal.signal(each, handler)


def test_the_workers_result_or_error_comes_back(signals_caught):
  assert cli.in_worker(lambda a, b: a + b, 2, 3) == 5
  with pytest.raises(ZeroDivisionError):
    cli.in_worker(lambda: 1 / 0)
  assert cli.in_worker(threading.current_thread) is not threading.current_thread()  # the work ran elsewhere


def test_without_the_command_lines_handlers_it_runs_in_the_calling_thread():
  # a training loop or a notebook: Python's own SIGINT handling, which a worker left running would outlive
  assert signal.getsignal(signal.SIGINT) is not cli._interrupt
  assert cli.in_worker(threading.current_thread) is threading.current_thread()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_long_computation_interrupts_without_waiting_for_it(signals_caught, signum):
  started, release = threading.Event(), threading.Event()

  def step():  # lasts until the test lets it end: only a command that does not wait for it gets the signal
    started.set()
    release.wait(HANG_GUARD_S)
    return "a result that comes after the signal"

  def signal_once_started():
    started.wait(HANG_GUARD_S)
    os.kill(os.getpid(), signum)

  threading.Thread(target=signal_once_started, daemon=True).start()
  with pytest.raises(cli.Interrupted) as interrupted:
    cli.in_worker(step)
  assert interrupted.value.signum == signum
  left = [worker for worker in cli._left_running if worker.is_alive()]
  assert len(left) == 1  # the step still runs: the main thread did not wait for it
  release.set()
  left[0].join(HANG_GUARD_S)
  cli._left_running.clear()


def test_called_from_another_thread_it_runs_there(signals_caught):
  seen = []
  thread = threading.Thread(target=lambda: seen.append(cli.in_worker(threading.current_thread)))
  thread.start()
  thread.join(HANG_GUARD_S)
  assert seen == [thread]
