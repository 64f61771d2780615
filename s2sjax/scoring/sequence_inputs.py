"""One sequence a user hands a model to read (`s2sjax.logprobs`, an architecture's `log_probs`), checked before it
reaches the model: an error names the array, the index and the range it leaves."""

from __future__ import annotations

import numpy as np

from s2sjax.runtime.errors import UserError


class LogProbsError(UserError, ValueError):
  """Inputs that do not fit the checkpoint: named with the array, its shape and what the model expects."""


def sequence(input_ids: np.ndarray) -> np.ndarray:
  """`[T]` int64 ids from `[T]` or `[1, T]`."""
  ids = np.asarray(input_ids)
  if ids.ndim == 2 and ids.shape[0] == 1:
    ids = ids[0]
  if ids.ndim != 1 or not len(ids) or not np.issubdtype(ids.dtype, np.integer):
    raise LogProbsError(f"input_ids must be one sequence of integer ids, [T] or [1, T]; got {ids.dtype} {ids.shape}")
  return ids.astype(np.int64)


def check_range(name: str, values: np.ndarray, size: int, what: str, silent: bool = False) -> None:
  """Every value in 0..size-1 (-1 too where `silent`: a stream that says nothing there)."""
  low = -1 if silent else 0
  bad = np.flatnonzero((values < low) | (values >= size))
  if len(bad):
    raise LogProbsError(f"{name}[{bad[0]}] = {values.flat[bad[0]]} is outside {what} ({low}..{size - 1})")


def no_features(features: np.ndarray | None, reader: str) -> None:
  """Refuses a feature track given to a model that reads none (`reader` names it)."""
  if features is not None:
    raise LogProbsError(f"--features is for models that read a float feature track beside their ids (Kimi-Audio's "
                        f"Whisper features); {reader} reads none")
