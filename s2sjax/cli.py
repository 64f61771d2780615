"""What every command line shares: a user's mistake (a bad path, data that does not fit, a refused checkpoint) is
printed as its message, not as a 40-line traceback, and the program exits non-zero; `--verbosity=1` (absl's flag)
shows the traceback too."""

from __future__ import annotations

import functools
import sys

from absl import flags

# What our code raises for bad input: ValueError subclasses (EvalError, DataError, CheckpointError, ...), missing
# files, unknown names.
USER_ERRORS = (ValueError, OSError, KeyError)


def one_line_errors(main):
  """Wraps an absl `main(argv)`."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except USER_ERRORS as e:
      if flags.FLAGS.verbosity >= 1:
        raise
      message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
      print(f"error: {message}\n(--verbosity=1 shows where it was raised)", file=sys.stderr, flush=True)
      sys.exit(1)

  return wrapped
