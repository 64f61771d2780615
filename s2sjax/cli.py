"""What every command line shares (`cli.run(main)` in place of absl's `app.run(main)`):

- a quiet console: third-party INFO records (orbax's partial saves, TFDS, transformers) are hidden unless
  `--verbosity` is given; warnings and errors are always shown;
- SIGINT (Ctrl-C) and SIGTERM raise `Interrupted` in the main thread, so a command stops within seconds through
  its own cleanup (the lock released, what is complete kept and summarized), says in one line what it kept and
  how to resume, and exits 128 + the signal's number; a second signal ends it at once;
- a user's mistake (`s2sjax.errors.UserError`: a bad path, data that does not fit, a refused checkpoint) is printed
  as its message, not as a 40-line traceback, and the program exits 1; `--verbosity=1` shows the traceback too.
  Anything else is a bug and prints its traceback.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging as std_logging
import os
import signal
import sys
import threading

from absl import app, flags, logging

from s2sjax import cache
from s2sjax.errors import UserError

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
  # a library that is not installed has nothing to say: the accelerator benchmark runs on images without TFDS
  if importlib.util.find_spec("transformers"):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # its GGUF loader draws bars of its own
  if importlib.util.find_spec("tensorflow_datasets"):
    import tensorflow_datasets as tfds

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


def _one_line_errors(main):
  @functools.wraps(main)
  def wrapped(argv):
    _quiet()
    catch_interrupts()
    try:
      return main(argv)
    except Interrupted as e:
      print(e.message, file=sys.stderr, flush=True)
      sys.exit(128 + e.signum)
    except UserError as e:  # anything else is a bug: its traceback is printed
      if flags.FLAGS.verbosity >= 1:
        raise
      print(f"error: {e}\n(--verbosity=1 shows where it was raised)", file=sys.stderr, flush=True)
      sys.exit(1)

  return wrapped


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
  app.run(_one_line_errors(main))
