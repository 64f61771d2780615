"""What every command line shares (`cli.run(main)` in place of absl's `app.run(main)`):

- a quiet console: third-party INFO records (orbax's partial saves, TFDS, transformers) are hidden unless
  `--verbosity` is given; warnings and errors are always shown;
- SIGINT (Ctrl-C) and SIGTERM raise `Interrupted` in the main thread, so a command stops at once through its own
  cleanup (the lock released, what is complete kept and summarized), says in one line what it kept and how to
  resume, and exits 128 + the signal's number without the interpreter's slow teardown (`exit_at_once`); a second
  signal ends it at once. Python runs a signal's handler in the main thread between bytecodes only, so a long
  computation there (an XLA compilation or step, which never returns to Python until it ends) would hold the
  signal back: such work runs in a worker thread (`in_worker`) that the main thread waits on, and is left behind,
  its result dropped, when the signal comes;
- a user's mistake (`s2sjax.runtime.errors.UserError`: a bad path, data that does not fit, a refused checkpoint) is printed
  as its message, not as a 40-line traceback, and the program exits 1; `--verbosity=1` shows the traceback too.
  Anything else is a bug and prints its traceback;
- `--help` prints the usage and exits 0 (absl's exits 1, which a script checking an install takes for a failure).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging as std_logging
import os
import signal
import sys
import threading
from typing import Callable, Iterator, NoReturn, TypeVar

from absl import app, flags, logging

from s2sjax.runtime import cache, progress
from s2sjax.runtime.errors import UserError

T = TypeVar("T")
# Fault injection for the interruption tests: the N-th `in_worker` call of this process holds its finished result
# until the main thread has stopped waiting for it (a signal came), as a step running on past Ctrl-C would; it says
# so on stderr first. A command that waited for its step would never end.
STALL_WORKER = "S2SJAX_STALL_WORKER"
_WAIT_S = 0.25  # the main thread's wait wakes this often: a signal the OS handed to another thread is run by then
_left_running: set[threading.Thread] = set()  # workers the main thread stopped waiting for
_stopped_by_signal = threading.Event()  # a command's cleanup after a signal is done: `run` ends it at once
_worker_calls = 0

# Warnings TFDS writes about its own bookkeeping on every first build: a config folder not built yet, a config
# made at run time (ours always are, their names say what they hold). They tell a user nothing.
TFDS_CHATTER = ("has no dataset_info.json", "Using custom data configuration")


def _not_tfds_chatter(record: std_logging.LogRecord) -> bool:
  return not ("tensorflow_datasets" in record.pathname and any(m in record.getMessage() for m in TFDS_CHATTER))


def _quiet() -> None:
  if flags.FLAGS["verbosity"].present:
    return
  logging.set_verbosity(logging.WARNING)
  std_logging.getLogger().setLevel(std_logging.WARNING)
  logging.get_absl_logger().addFilter(_not_tfds_chatter)
  # transformers reads these when first imported (a command that never needs it does not pay ~1 s to import it);
  # its GGUF loader draws bars of its own
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
  if (transformers := sys.modules.get("transformers")) is not None:
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
  # A command that builds imports TFDS with its module (tasks.preparation); one that does not skips its ~0.2 s import.
  if (tfds := sys.modules.get("tensorflow_datasets")) is not None:
    tfds.disable_progress_bar()  # a build reports its own throughput


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM arrived. `message` is what the command kept and how to resume (set by the command's own
  cleanup; a generic line otherwise)."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum
    self.message = f"stopped by {signal.Signals(signum).name}: rerun the same command to go on"


def _in_gc_callback(frame) -> bool:
  """Whether the signal arrived inside a garbage-collector callback (jax registers one)."""
  codes = {getattr(callback, "__code__", None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code in codes:
      return True
    frame = frame.f_back
  return False


def _interrupt(signum, frame) -> None:
  if _in_gc_callback(frame):  # an exception raised there is printed and dropped, and the command would go on
    threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()  # the same signal again, outside it
    return
  for each in (signal.SIGINT, signal.SIGTERM):  # a second signal ends the process at once (a cleanup that hangs)
    signal.signal(each, signal.SIG_DFL)
  raise Interrupted(signum)


def catch_interrupts() -> None:
  """SIGINT and SIGTERM raise `Interrupted` (absl and Python would raise KeyboardInterrupt on SIGINT only, and
  die on SIGTERM with no cleanup at all)."""
  for each in (signal.SIGINT, signal.SIGTERM):
    signal.signal(each, _interrupt)


def in_worker(fn: Callable[..., T], *args) -> T:
  """fn(*args), run in a worker thread while the main thread waits on it and on SIGINT / SIGTERM, so that a long
  computation (an XLA compilation or step) cannot hold `Interrupted` back. When the signal comes first, the worker
  is left to end on its own and its result is dropped: `fn` must only compute (nothing it does may write a file),
  and everything written afterwards is the main thread's cleanup, after which the command ends without the
  interpreter's teardown (`exit_at_once`), which would free the runtime beneath the worker. So only under this
  module's handlers (`catch_interrupts`: a command line) is there a worker; anywhere else (a training loop, a
  notebook, another thread, which takes no signal) it is fn(*args), and a signal waits for the step as Python's
  own handling does."""
  global _worker_calls
  if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not _interrupt:
    return fn(*args)
  _worker_calls += 1
  call = _worker_calls
  stall = os.environ.get(STALL_WORKER) == str(call)
  outcome: list = []  # [result] or [None, exception]
  done, abandoned = threading.Event(), threading.Event()

  def work() -> None:
    try:
      result = fn(*args)
      if stall:
        print(f"{STALL_WORKER}={call}: holding the result until the main thread stops waiting for it",
              file=sys.stderr, flush=True)
        abandoned.wait()
      outcome.append(result)
    except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
      outcome.extend([None, e])
    finally:
      done.set()

  worker = threading.Thread(target=work, name=f"worker: {getattr(fn, '__qualname__', fn)}", daemon=True)
  try:
    worker.start()  # which waits for the thread to start: the signal may come in there too
    while not done.wait(_WAIT_S):  # a signal's handler runs here, in the main thread, and raises
      pass
  except BaseException:
    _left_running.add(worker)
    abandoned.set()
    raise
  if len(outcome) == 2:
    raise outcome[1]
  return outcome[0]


def _user_error_line(error: UserError) -> str:
  return f"error: {error}\n(--verbosity=1 shows where it was raised)"


@contextlib.contextmanager
def setting_up() -> Iterator[None]:
  """Around a command line's set-up before `run`: defining flags lists registries (`--task`'s choices), which
  loads $S2SJAX_PLUGINS, so a user's mistake can be raised there, and is one line as in `run` (with --verbosity
  given, its traceback)."""
  try:
    yield
  except UserError as e:
    if any(arg.split("=")[0].lstrip("-") in ("verbosity", "v") for arg in sys.argv[1:]):
      raise
    print(_user_error_line(e), file=sys.stderr, flush=True)
    sys.exit(1)


def _one_line_errors(main):
  @functools.wraps(main)
  def wrapped(argv):
    _quiet()
    catch_interrupts()
    try:
      return main(argv)
    except Interrupted as e:
      progress.end_bars()  # the bars' last state above the message, not drawn again below it
      print(e.message, file=sys.stderr, flush=True)
      _stopped_by_signal.set()
      sys.exit(128 + e.signum)
    except UserError as e:  # anything else is a bug: its traceback is printed
      if flags.FLAGS["verbosity"].value >= 1:
        raise
      progress.end_bars()
      print(_user_error_line(e), file=sys.stderr, flush=True)
      sys.exit(1)

  return wrapped


def exit_at_once(code: int) -> NoReturn:
  """Ends a command a signal stopped, its cleanup done: the exit handlers run and the streams are flushed, and the
  interpreter's own teardown is skipped (freeing every module takes seconds for a process that imported jax, on a
  loaded machine). A worker still computing (`in_worker`) is not waited for, and then the exit handlers do not
  run either: jax's would free the runtime beneath it."""
  if any(worker.is_alive() for worker in _left_running):
    std_logging.shutdown()
  else:
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers os._exit would skip
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")


def _asks_for_help(argv: list[str]) -> bool:
  for arg in argv[1:]:
    if arg == "--":  # what follows is not flags
      return False
    if arg.startswith("-") and arg.lstrip("-").partition("=")[0] in HELP_FLAGS:
      return True
  return False


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (with its usage on a bad flag), where `--help` exits 0 once the usage is printed."""
  try:
    return app.parse_flags_with_usage(argv)
  except SystemExit as e:
    if e.code == 1 and _asks_for_help(argv):
      sys.exit(0)
    raise


def run(main, doc: str | None = None, flag_modules: tuple[str, ...] = ()) -> None:
  """absl's app.run with the console and error handling above. `doc` is the command's usage, what `--help` prints
  first (absl reads it from `__main__`: for a command kept at its name that is the alias, e.g. `s2sjax/eval.py`,
  not the module in `s2sjax/commands/` holding it). `--help` lists `--verbosity` and the flags `flag_modules`
  define (the command's own, the data selector's) beside `__main__`'s: absl lists only the latter, and the rest
  under --helpfull, though every error's hint names `--verbosity`."""
  if doc is not None:
    sys.modules["__main__"].__doc__ = doc
  key_flags = [flags.FLAGS["verbosity"]]
  for module in flag_modules:
    key_flags += flags.FLAGS.get_flags_for_module(module)
  for flag in key_flags:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  cache.use_compilation_cache()
  try:
    app.run(_one_line_errors(main), flags_parser=_parse_flags)
  except SystemExit as e:
    if _stopped_by_signal.is_set():
      exit_at_once(e.code)
    raise
