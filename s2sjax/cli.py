"""What every command line shares (`cli.run(main)` in place of absl's `app.run(main)`):

- a quiet console: third-party INFO records (orbax's partial saves, TFDS, transformers) are hidden unless
  `--verbosity` is given; warnings and errors are always shown;
- a user's mistake (a bad path, data that does not fit, a refused checkpoint) is printed as its message, not as a
  40-line traceback, and the program exits 1; `--verbosity=1` shows the traceback too.
"""

from __future__ import annotations

import functools
import importlib.util
import logging as std_logging
import sys

from absl import app, flags, logging

# What our code raises for bad input: ValueError subclasses (EvalError, DataError, CheckpointError, ...), missing
# files, unknown names.
USER_ERRORS = (ValueError, OSError, KeyError)


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


def _one_line_errors(main):
  @functools.wraps(main)
  def wrapped(argv):
    _quiet()
    try:
      return main(argv)
    except USER_ERRORS as e:
      if flags.FLAGS.verbosity >= 1:
        raise
      message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
      print(f"error: {message}\n(--verbosity=1 shows where it was raised)", file=sys.stderr, flush=True)
      sys.exit(1)

  return wrapped


def run(main) -> None:
  """absl's app.run with the console and error handling above."""
  app.run(_one_line_errors(main))
