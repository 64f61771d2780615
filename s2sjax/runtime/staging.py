"""A finished directory replaced whole or not at all, and a dead writer's leftovers told apart: the one staging rule
of every writer that replaces a directory (a converted checkpoint, a rebuilt dataset), over the one probe of
whether a process that left something behind still runs (`output_dir.process_alive`, which the run lock reads too).

A writer builds into a hidden folder tagged with its host, process and a random part (`staging_path`, `owner_tag`),
then swaps the result into place (`swap_into_place`): the directory there is renamed aside first and removed only
once the new one is in place, so no moment leaves neither (a kill between the renames leaves the old one as
`.<name>.replaced-<tag>`). The next writer removes what writers of this host that are no longer running left
(`remove_dead`); what another host's writers left is named in the log and kept.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid

from absl import logging
from etils import epath

from s2sjax.runtime.output_dir import fsync_path, process_alive

REPLACED = "replaced"  # the kind of a finished directory renamed aside by `swap_into_place`


def owner_tag() -> str:
  """`<host>-<pid>-<random>`: whose a staging folder is, readable back by `remove_dead`."""
  return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def staging_path(target, kind: str) -> epath.Path:
  """A hidden sibling of `target` for this process to build `kind` in: `.<name>.<kind>-<tag>`."""
  target = epath.Path(target)
  return target.parent / f".{target.name}.{kind}-{owner_tag()}"


def swap_into_place(new, target, tag: str) -> None:
  """The finished directory `new` becomes `target`; a directory at `target` is renamed aside (`.<name>.replaced-
  <tag>`) first and removed once the new one is in place."""
  new, target = epath.Path(new), epath.Path(target)
  fsync_path(new)
  old = None
  if target.exists():
    old = target.parent / f".{target.name}.{REPLACED}-{tag}"
    target.rename(old)
  new.rename(target)
  fsync_path(target.parent)
  if old is not None:
    shutil.rmtree(str(old), ignore_errors=True)


def remove_dead(parent, prefix: str) -> list[str]:
  """Removes the entries of `parent` named `<prefix><tag>` whose writer, a process of this host, no longer runs;
  returns their names. Those of other hosts (or not tagged) are kept and named in the log."""
  parent = epath.Path(parent)
  if not parent.exists():
    return []
  removed = []
  for leftover in sorted(parent.glob(f"{prefix}*")):
    parts = leftover.name[len(prefix):].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
      logging.warning("%s: not a staging folder of this version: left as it is", leftover)
      continue
    if parts[0] != socket.gethostname():
      logging.warning("%s: left by a writer on host %s: left as it is", leftover, parts[0])
      continue
    if not process_alive(parts[0], parts[1]):
      shutil.rmtree(str(leftover), ignore_errors=True)
      removed.append(leftover.name)
  if removed:
    logging.info("removed %d folder(s) left by writers that died in %s: %s", len(removed), parent, ", ".join(removed))
  return removed
