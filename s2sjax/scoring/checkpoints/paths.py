"""Which checkpoints a run scores and what it calls them: a list of paths and globs (local or gs://) in training
step order, the step of each read from its name as checkpoint managers write it, and a short distinct name for
each (its folder, with parents where two share a name).

Steps: `step_N`, `step-N`, `checkpoint-N` (transformers' Trainer), `ckpt-N` / `ckpt_N`, `global_step_N`, a bare
`N` (orbax's CheckpointManager; `<prefix>_N` with its step_prefix), each the whole folder name. Any other name with
digits in it (`ckpt-100-fp16`, `checkpoint-500-v2`) is ambiguous: its step is read only by a `--step_pattern`
regex, and a list of checkpoints that holds one is refused (the last number would be taken for the step and the
curves would lie). A name without digits has no step.

A run is the folder its checkpoints lie in (`run_folder`): checkpoints of one run may not share a step, those of
two runs may (`ckpts/*/step_*` over runA and runB, both with step_100): each run is its own curve
(`reports.curve_lines`), which is what comparing two runs asks for.
"""

from __future__ import annotations

import collections
import glob
import os
import re

from absl import logging
from etils import epath

from s2sjax.runtime.errors import UserError
from s2sjax.scoring.checkpoints.stacks import maxtext

# The whole folder name: an optional word the checkpoint managers put before the step, then the step.
STEP_NAME = re.compile(r"(?:(?:global_step|step|checkpoint|ckpt|iter|iteration)[-_]?)?(\d+)", re.IGNORECASE)
STEP_FORMS = "step_N, checkpoint-N, ckpt-N, global_step_N or a bare N"
# Orbax writes a step into `<step>.orbax-checkpoint-tmp` (`-<n>` in older versions) and renames it when done:
# never a checkpoint.
ORBAX_TEMPORARY = re.compile(r"\.orbax-checkpoint-tmp(-\d+)?$")


class CheckpointListError(UserError, ValueError):
  """A --checkpoint list that names nothing, names one checkpoint twice, or whose steps cannot be read."""


def _name(path: str) -> str:
  return os.path.basename(os.path.normpath(path.split("://", 1)[-1]))


def step_of(path: str, pattern: str | None = None) -> int | None:
  """The training step of a checkpoint, from its folder name (the forms above, or `pattern`'s first group);
  None for a name without digits. An ambiguous name, or one `pattern` does not match, is a CheckpointListError
  saying how to name its step."""
  name = _name(path)
  if pattern:
    match = re.search(pattern, name)
    if match is None or not match.groups() or match.group(1) is None or not match.group(1).isdigit():
      raise CheckpointListError(f"--step_pattern {pattern!r} does not read a step from {name!r} (its first group "
                                "must match the step's digits)")
    return int(match.group(1))
  match = STEP_NAME.fullmatch(name) or re.fullmatch(r"[A-Za-z]\w*?_(\d+)", name)  # orbax's `<step_prefix>_N`
  if match:
    return int(match.group(1))
  if not re.search(r"\d", name):
    return None
  raise CheckpointListError(
    f"cannot tell the training step of {path!r} from its name ({STEP_FORMS} are read; {name!r} holds other "
    rf"numbers): pass --step_pattern, a regex whose first group is the step (e.g. --step_pattern='ckpt-(\d+)')")


def steps(paths: list[str], pattern: str | None = None) -> list[int | None]:
  """The step of each checkpoint of one run. A single checkpoint whose name reads no step has none (no curve is
  drawn through it); in a list every name must read one unambiguously, and checkpoints of one folder may not share
  a step (`ckpt-100-fp16`, `ckpt-100-bf16` would be one point of the curves)."""
  if len(paths) == 1:
    try:
      return [step_of(paths[0], pattern)]
    except CheckpointListError:
      if pattern:
        raise
      return [None]
  found = [step_of(p, pattern) for p in paths]
  by_folder = collections.defaultdict(list)
  for path, step in zip(paths, found):
    if step is not None:
      by_folder[(run_folder(path), step)].append(_name(path))
  shared = {key: names for key, names in by_folder.items() if len(names) > 1}
  if shared:
    (_, step), names = next(iter(shared.items()))
    raise CheckpointListError(f"checkpoints {', '.join(names)} are all step {step}: score them in separate runs, or "
                              "pass --step_pattern to read their steps apart")
  return found


def expand(patterns: str, pattern: str | None = None) -> list[str]:
  """Paths from a comma-separated list of paths and globs, in step order (`pattern`: --step_pattern); a glob that
  matches nothing is an error, and orbax's unfinished `*.orbax-checkpoint-tmp*` folders and MaxText steps orbax
  has not committed yet are left out (a glob over a run that is still training)."""
  paths = []
  for part in filter(None, (p.strip() for p in patterns.split(","))):
    part = os.path.expanduser(part)  # "--checkpoint=~/x" reaches us unexpanded
    matches = [m for m in _glob(part) if _finished(m)] if any(ch in part for ch in "*?[") else [part]
    if not matches:
      raise CheckpointListError(f"--checkpoint pattern {part!r} matches nothing")
    paths += matches
  paths = list(dict.fromkeys(paths))
  order = dict(zip(paths, steps(paths, pattern)))
  return sorted(paths, key=lambda p: (order[p] is None, order[p] or 0, p))


def _finished(path: str) -> bool:
  """Not a step orbax is still writing: neither its temporary folder nor a MaxText step without its commit marker."""
  if ORBAX_TEMPORARY.search(_name(path)) or (maxtext.is_step_folder(path) and not maxtext.is_committed(path)):
    logging.warning("%s is still being written: left out", path)
    return False
  return True


def _glob(pattern: str) -> list[str]:
  """Local or gs:// glob (the pattern in the last path component for buckets)."""
  if "://" not in pattern:
    return sorted(glob.glob(pattern))
  parent, _, name = pattern.rstrip("/").rpartition("/")
  return sorted(str(p) for p in epath.Path(parent).glob(name))


def run_folder(path: str) -> str:
  """The run a checkpoint belongs to: the folder it lies in (`runA` of `ckpts/runA/step_100`), where a training
  run's checkpoint manager writes every step. Steps of one run make one curve."""
  if "://" in path:
    return path.rstrip("/").rpartition("/")[0]
  return os.path.dirname(os.path.normpath(path))


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
