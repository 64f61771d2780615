"""An output directory that one run writes at a time, and writes that leave the old file or the new, never half.

    OUT/.s2sjax-lock    {host, pid, started, command} of the run writing OUT; removed when it ends

`RunLock` is taken before anything is scored, so a directory that cannot be written (read-only, missing
permissions) is refused at once, and a second run into the same directory is refused with the first one's host
and pid. A lock left by a run that died on this host is taken over (its pid is gone); one from another host is
broken only when asked (`--break_lock`). `write_atomic` writes a temporary sibling and renames it over the target,
so a kill or a full disk leaves the previous file whole.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from absl import logging
from etils import epath

LOCK_NAME = ".s2sjax-lock"


class OutputError(ValueError):
  """An output directory that cannot be written, or that another run is writing."""


def write_atomic(path, data: bytes) -> None:
  """Writes `data` to `path` through a temporary sibling renamed over it; a failed write (ENOSPC, EROFS, ...)
  removes the temporary file, keeps the old one, and names the path."""
  path = epath.Path(path)
  tmp = path.parent / f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}"
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)
    tmp.replace(path)
  except OSError as e:
    try:
      tmp.unlink(missing_ok=True)
    except OSError:
      pass
    raise OutputError(f"cannot write {path}: {e.strerror or e} (the previous file, if any, is unchanged)") from e


def _alive_here(owner: dict) -> bool:
  """Whether the lock's owner is a running process of this host (a lock from another host counts as alive)."""
  if owner.get("host") != socket.gethostname():
    return True
  try:
    os.kill(int(owner.get("pid", -1)), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError):
    return True
  return True


class RunLock:
  """`with RunLock(OUT):` — OUT is this run's until the block ends."""

  def __init__(self, directory, break_lock: bool = False):
    self.directory = epath.Path(directory)
    self.path = self.directory / LOCK_NAME
    self.break_lock = break_lock
    self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": " ".join(sys.argv)[:500]}

  def __enter__(self) -> "RunLock":
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
      if self.path.exists():
        self._take_over(json.loads(self.path.read_text() or "{}"))
      self._create()
    except OSError as e:
      raise OutputError(f"cannot write to the output directory {self.directory} ({e.strerror or e}): choose "
                        "another --output_dir") from e
    return self

  def _take_over(self, owner: dict) -> None:
    where = f"pid {owner.get('pid')} on {owner.get('host')}, started {owner.get('started')}"
    if _alive_here(owner) and not self.break_lock:
      raise OutputError(
        f"{self.directory} is being written by another run ({where}: {owner.get('command', '?')}): wait for it, "
        f"use another --output_dir, or if that run is dead, rerun with --break_lock (or delete {self.path})")
    logging.warning("taking over the lock of %s from %s (%s)", self.directory, where,
                    "broken on request" if self.break_lock else "that process is gone")
    self.path.unlink(missing_ok=True)

  def _create(self) -> None:
    data = json.dumps(self.owner).encode()
    if "://" in str(self.path):  # buckets have no exclusive create: two runs starting in the same instant both win
      self.path.write_bytes(data)
      return
    try:
      fd = os.open(str(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another run took it between our check and our create
      self._take_over(json.loads(self.path.read_text() or "{}"))
      fd = os.open(str(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f:
      f.write(data)

  def __exit__(self, *exc) -> None:
    try:
      if self.path.exists() and json.loads(self.path.read_text() or "{}") == self.owner:
        self.path.unlink()
    except (OSError, ValueError):
      logging.warning("could not remove the lock %s", self.path)
