"""Which checkpoints a run scores and what it calls them: a list of paths and globs (local or gs://) in training
step order, and a short distinct name for each (its folder, with parents where two share a name)."""

from __future__ import annotations

import glob
import os
import re

from etils import epath


class CheckpointListError(ValueError):
  """A --checkpoint list that names nothing, or one checkpoint twice."""


def expand(patterns: str) -> list[str]:
  """Paths from a comma-separated list of paths and globs, in step order; a glob that matches nothing is an error."""
  paths = []
  for part in filter(None, (p.strip() for p in patterns.split(","))):
    part = os.path.expanduser(part)  # "--checkpoint=~/x" reaches us unexpanded
    matches = _glob(part) if any(ch in part for ch in "*?[") else [part]
    if not matches:
      raise CheckpointListError(f"--checkpoint pattern {part!r} matches nothing")
    paths += matches
  return sorted(dict.fromkeys(paths), key=lambda p: (step_of(p) is None, step_of(p) or 0, p))


def _glob(pattern: str) -> list[str]:
  """Local or gs:// glob (the pattern in the last path component for buckets)."""
  if "://" not in pattern:
    return sorted(glob.glob(pattern))
  parent, _, name = pattern.rstrip("/").rpartition("/")
  return sorted(str(p) for p in epath.Path(parent).glob(name))


def step_of(path: str) -> int | None:
  """The training step a checkpoint's folder name ends with (`ckpt-300` -> 300), if any."""
  numbers = re.findall(r"\d+", os.path.basename(os.path.normpath(path)))
  return int(numbers[-1]) if numbers else None


def run_names(paths: list[str]) -> list[str]:
  """A readable, distinct name per checkpoint: its folder name, with as many parent folders as it takes to tell
  apart checkpoints that share one (runA/ckpt-100, runB/ckpt-100)."""
  parts = [os.path.normpath(p.split("://", 1)[-1]).split(os.sep) for p in paths]
  for depth in range(1, max(map(len, parts)) + 1):
    names = ["/".join(p[-depth:]) for p in parts]
    if len(set(names)) == len(names):
      return names
  raise CheckpointListError(f"--checkpoint lists the same checkpoint twice: {paths}")


def safe_name(name: str) -> str:
  """A run name as one folder name."""
  return re.sub(r"[^\w.\-]+", "_", name).strip("_")
