"""An output directory that one run writes at a time, and writes that leave the old file or the new, never half.

    OUT/.s2sjax-lock    {host, pid, started, command} of the run writing OUT; removed when it ends

`RunLock` (also under other names: `waiting_lock`, the lock beside a build or the default model's conversion, for
which a second run waits instead of failing) is taken before anything is scored, so a
directory that cannot be written (read-only, missing permissions) is refused at once, and a second run into the
same directory is refused with the first one's host and pid. A lock left by a run that died on this host is taken
over (its pid is gone); one from another host is broken only when asked (`--break_lock`). `write_atomic` writes a
temporary sibling and renames it over the target, so a kill or a full disk leaves the previous file whole; on a
local disk the file and its directory are fsynced before and after the rename, so a power loss cannot leave a
renamed file without its bytes (a zero-byte chunk). The JSON the project writes is strict (`strict_json`: no NaN or
Infinity), and the JSON it reads back names its file when it is not JSON (`read_json`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import time
from typing import Any

from absl import logging
from etils import epath
from s2sjax.runtime import cache
from s2sjax.runtime.errors import UserError

LOCK_NAME = ".s2sjax-lock"


class OutputError(UserError, ValueError):
  """An output directory that cannot be written, or that another run is writing."""


class LockHeldError(OutputError):
  """The lock is held by a live run (`owner`: its host, pid, start and command)."""

  def __init__(self, message: str, owner: dict):
    super().__init__(message)
    self.owner = owner


class DamagedFileError(UserError, ValueError):
  """A file the project wrote that no longer reads back (truncated, zero bytes, edited)."""


def _local(path: epath.Path) -> bool:
  return "://" not in str(path)


def fsync_path(path) -> None:
  """Flushes a local file's or directory's bytes and entries to the disk (a bucket's writes are durable when they
  return)."""
  path = epath.Path(path)
  if not _local(path):
    return
  fd = os.open(str(path), os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def rename_durably(source, target) -> None:
  """`source` renamed over `target`, with the bytes of both and their directory's entries on the disk before and
  after (without the first fsync, a power loss can leave the new name over an empty file)."""
  source, target = epath.Path(source), epath.Path(target)
  fsync_path(source)
  fsync_path(source.parent)
  source.replace(target)
  fsync_path(target.parent)


def write_atomic(path, data: bytes) -> None:
  """Writes `data` to `path` through a temporary sibling renamed over it; a failed write (ENOSPC, EROFS, ...)
  removes the temporary file, keeps the old one, and names the path."""
  path = epath.Path(path)
  tmp = path.parent / f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}"
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)
    rename_durably(tmp, path)
  except OSError as e:
    try:
      tmp.unlink(missing_ok=True)
    except OSError:
      pass
    raise OutputError(f"cannot write {path}: {e.strerror or e} (the previous file, if any, is unchanged)") from e
  except BaseException:  # interrupted (SIGINT, SIGTERM) mid-write: no temporary file is left behind
    tmp.unlink(missing_ok=True)
    raise


def _first_non_finite(value: Any, where: str = "") -> str | None:
  """The key path of the first NaN or infinity in a JSON-ready value, if any."""
  if isinstance(value, float) and not math.isfinite(value):
    return where or "the value"
  items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
  for key, item in items:
    found = _first_non_finite(item, f"{where}/{key}" if where else str(key))
    if found:
      return found
  return None


def strict_json(value: Any, where: str, **dumps_kwargs) -> str:
  """`json.dumps` that refuses NaN and infinities (bare `NaN` is not JSON: other readers reject the file), naming
  the file and the key that holds one."""
  try:
    return json.dumps(value, allow_nan=False, **dumps_kwargs)
  except ValueError:
    raise OutputError(f"{where}: {_first_non_finite(value)} is not a finite number; strict JSON cannot hold it, so "
                      "nothing was written") from None


def read_json(path, what: str = "", hint: str = "") -> Any:
  """A JSON file's value; one that is not JSON (truncated, damaged) is a ValueError naming the file, what it is
  (`what`) and what to do (`hint`)."""
  path = epath.Path(path)
  text = path.read_text()
  try:
    return json.loads(text)
  except ValueError as e:
    reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
    where = f" (line {e.lineno} column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
    raise DamagedFileError(f"{path}{f', {what},' if what else ''} is not valid JSON: {reason}{where}, "
                           f"{'an empty file' if not text.strip() else 'truncated or damaged'}"
                           + (f": {hint}" if hint else "")) from None


def process_alive(host: str | None, pid) -> bool:
  """Whether `pid` is a running process of `host`: the one liveness probe of the lock and of staging folders
  (s2sjax/runtime/staging.py). A process of another host, or one this user may not signal, counts as alive: nothing it may
  still be using is taken from it."""
  if host != socket.gethostname():
    return True
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, TypeError, OverflowError):
    return True
  return True


class RunLock:
  """`with RunLock(OUT):` — OUT is this run's until the block ends."""

  def __init__(self, directory, break_lock: bool = False, name: str = LOCK_NAME,
               unwritable: str = "cannot write to the output directory {directory} ({error}): choose another "
                                 "--output_dir"):
    self.directory = epath.Path(directory)
    self.path = self.directory / name
    self.break_lock = break_lock
    self.unwritable = unwritable  # what a directory that cannot be written is, and what to do
    self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": " ".join(sys.argv)[:500]}

  def __enter__(self) -> "RunLock":
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
      if self.path.exists():
        self._take_over(self._owner())
      self._create()
    except OSError as e:
      raise OutputError(self.unwritable.format(directory=self.directory, error=e.strerror or e)) from e
    return self

  def _owner(self) -> dict | None:
    """The lock's owner; None when the lock is damaged (a run killed while writing it, a disk that lost it)."""
    try:
      owner = json.loads(self.path.read_text() or "{}")
    except ValueError:
      return None
    return owner if isinstance(owner, dict) else None

  def _take_over(self, owner: dict | None) -> None:
    if owner is None:
      if not self.break_lock:
        raise OutputError(f"{self.path} is damaged (not JSON), so which run holds {self.directory} cannot be told: "
                          "if no run is writing it, rerun with --break_lock (or delete the file)")
      owner = {}
    where = f"pid {owner.get('pid')} on {owner.get('host')}, started {owner.get('started')}"
    if process_alive(owner.get("host"), owner.get("pid", -1)) and not self.break_lock:
      raise LockHeldError(
        f"{self.directory} is being written by another run ({where}: {owner.get('command', '?')}): wait for it, "
        f"use another --output_dir, or if that run is dead, rerun with --break_lock (or delete {self.path})", owner)
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
      self._take_over(self._owner())
      fd = os.open(str(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())

  def __exit__(self, *exc) -> None:
    try:
      if self.path.exists() and self._owner() == self.owner:
        self.path.unlink()
    except (OSError, ValueError):
      logging.warning("could not remove the lock %s", self.path)


LOCK_WAIT_S = 1.0


def _unwritable(directory, subject: str, work: str) -> str:
  """What a lock's folder that cannot be written is: the project's cache (`$S2SJAX_CACHE`), or a folder of the
  user's."""
  folder, root = os.path.abspath(str(directory)), os.path.abspath(cache.cache_dir())
  if folder == root or folder.startswith(root + os.sep):
    return (f"cannot write to the cache {{directory}} (${cache.ENV}={root}), where the {work} of {subject} goes "
            f"({{error}}): set {cache.ENV} to a folder you can write")
  return f"cannot write to {{directory}}, where the {work} of {subject} goes ({{error}})"


@contextlib.contextmanager
def waiting_lock(directory, name: str, subject: str, work: str):
  """`RunLock(directory, name=name)` held for the block. While a live run holds it, this one waits, saying once
  whose `work` on `subject` it waits for; the caller then finds what that run made (two first runs on one cache:
  one builds or converts, the other reuses it)."""
  lock = RunLock(directory, name=name, unwritable=_unwritable(directory, subject, work))
  said = False
  while True:
    try:
      lock.__enter__()
      break
    except LockHeldError as e:
      if not said:
        owner = e.owner
        print(f"{subject}: waiting for the {work} of pid {owner.get('pid')} on {owner.get('host')} (started "
              f"{owner.get('started')}; {lock.path}), then reusing it", flush=True)
        said = True
      time.sleep(LOCK_WAIT_S)
  try:
    yield
  finally:
    lock.__exit__(None, None, None)
