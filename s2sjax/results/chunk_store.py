"""The chunk store that makes an evaluation resumable after preemption, and the resumable scoring loop.

    OUT/chunks/<checkpoint>/<task>-<modality>/identity.json     what produced the chunks (written first)
    OUT/chunks/<checkpoint>/<task>-<modality>/layout.npz        where each question's candidates lie in the rows
    OUT/chunks/<checkpoint>/<task>-<modality>/chunk-00003.npz   rows [start, stop) of one run: per slot the NLL
                                                                sums, token counts and the architecture's details
    OUT/chunks/<checkpoint>/<task>-<modality>/scores.json       line count and hash of the scores file written
                                                                from the chunks (reports.py checks it)

A chunk is written to a temporary name and renamed into place (fsynced before and after), so one that exists is
whole; one that does not read back (zero bytes after a power loss, a truncated copy, a bad CRC, the wrong shape)
is treated as absent and scored again, with a line saying so. A rerun reuses every good chunk and scores only the
rest, so the final files equal an uninterrupted run's; the layout lets the scores file be rewritten from the chunks
alone (`scores_from_chunks`) when it is damaged. Paths go through etils `epath`, so OUT may be a `gs://` bucket.
"""

from __future__ import annotations

import io
import json
import os
import signal
import zipfile

import jax
import numpy as np
from absl import logging
from etils import epath

from s2sjax.runtime import sharding
from s2sjax.scoring import architectures
from s2sjax.scoring.evaluator import EvalError, Evaluator, check_finite
from s2sjax.model.decoder import Params
from s2sjax.runtime.output_dir import DamagedFileError, OutputError, strict_json, write_atomic
from s2sjax.data.question_details import QuestionDetails
from s2sjax.data.questions import QuestionScores, QuestionTable
from s2sjax.runtime.progress import Progress, say
from s2sjax.scoring.scorer import collect
from s2sjax.data.task_data import TaskData


# Fault injection at a known point, for resume and dead-peer tests: after this process has scored (and, on
# process 0, saved) this many chunks, it kills itself with SIGKILL, as a preempted VM dies (no cleanup at all).
KILL_AFTER_CHUNKS = "S2SJAX_KILL_AFTER_CHUNKS"
_chunks_in_this_process = 0

IDENTITY, LAYOUT, SCORES_RECORD = "identity.json", "layout.npz", "scores.json"


def _preempt_if_asked(store: "ChunkStore") -> None:
  global _chunks_in_this_process
  _chunks_in_this_process += 1
  if str(_chunks_in_this_process) == os.environ.get(KILL_AFTER_CHUNKS):
    logging.warning("%s=%d: killing this process after chunk %d of %s", KILL_AFTER_CHUNKS, _chunks_in_this_process,
                    _chunks_in_this_process, store.directory)
    os.kill(os.getpid(), signal.SIGKILL)


def _say(message: str) -> None:
  say(message)  # on stderr, above the progress bar when one is drawn


def _from_process_0_exact(value: np.ndarray) -> np.ndarray:
  """Process 0's float64 / int64 array on every process, bit for bit: the collective would carry 64-bit numbers
  as 32-bit ones (jax without x64), so they travel as pairs of int32 words."""
  words = np.ascontiguousarray(value).view(np.int32)
  return sharding.from_process_0(words).astype(np.int32).view(value.dtype).reshape(value.shape)


def chunk_ranges(num_rows: int, chunk_rows: int) -> list[tuple[int, int]]:
  return [(start, min(start + chunk_rows, num_rows)) for start in range(0, num_rows, chunk_rows)]


class ChunkStore:
  """Resumable per-row results of one (checkpoint, task, modality). `identity.json` records what produced them: the
  checkpoint (its path and a hash of its contents), the model's vocabulary and compiled step as scored, dtype,
  chunking, a hash of the rows. A rerun resumes only from its own chunks; chunks of a checkpoint since replaced at
  the same path (a training loop's `latest/`), of another vocabulary or step, or of unknown origin (no or a damaged
  identity.json) are scored again; chunks of another run's settings are refused."""

  RESCORED_WHEN_CHANGED = ("checkpoint_content", "vocab_size", "step")

  def __init__(self, directory, identity: dict):
    self.directory = epath.Path(directory)
    self.identity = identity

  def _saved_identity(self) -> tuple[dict | None, str]:
    """(the identity written earlier, or None, and why none)."""
    path = self.directory / IDENTITY
    if not path.exists():
      return None, "unknown origin (no identity.json)"
    try:
      saved = json.loads(path.read_text())
    except ValueError:
      saved = None
    if not isinstance(saved, dict):
      return None, "unknown origin (identity.json is damaged)"
    return saved, ""

  def open(self, td: TaskData | None = None) -> None:
    """Checks and records the identity before the first chunk (process 0 only): a run with other settings started
    later is refused even before this one has saved anything. With `td`, also records where its questions lie in
    the rows (`layout.npz`), so the scores file can be rebuilt from the chunks alone."""
    saved, unknown = self._saved_identity()
    if saved is not None:
      differ = [f"{key}: {saved.get(key)!r} there, {value!r} now" for key, value in self.identity.items()
                if key not in self.RESCORED_WHEN_CHANGED and saved.get(key) != value]
      if differ:
        raise EvalError(f"{self.directory} holds results of another run ({'; '.join(differ)}): use another "
                        "--output_dir, or delete that folder to score again")
    changed = [k for k in self.RESCORED_WHEN_CHANGED if k in self.identity and (saved or {}).get(k) != self.identity[k]]
    chunks = list(self.directory.glob("chunk-*.npz")) if self.directory.exists() else []
    if (saved is None or changed) and chunks:
      why = (unknown if saved is None else "a checkpoint since replaced at the same path" if "checkpoint_content"
             in changed else f"another {', '.join(changed)}")
      _say(f"{self.directory}: {len(chunks)} chunks of {why} are scored again")
      for chunk in chunks:
        chunk.unlink()
      (self.directory / SCORES_RECORD).unlink(missing_ok=True)
    write_atomic(self.directory / IDENTITY,
                 strict_json(self.identity, str(self.directory / IDENTITY), indent=2, sort_keys=True).encode())
    if td is not None:
      buffer = io.BytesIO()
      questions = strict_json(td.questions.to_records(), str(self.directory / LAYOUT), sort_keys=True)
      np.savez(buffer, slot_item=td.rows["slot_item"], slot_candidate=td.rows["slot_candidate"],
               questions=np.frombuffer(questions.encode(), np.uint8))
      write_atomic(self.directory / LAYOUT, buffer.getvalue())

  def _path(self, index: int) -> epath.Path:
    return self.directory / f"chunk-{index:05d}.npz"

  def done(self, index: int) -> bool:
    return self._path(index).exists()  # written whole or not at all (write_atomic); `load` checks it reads

  def save(self, index: int, nll_sum: np.ndarray, n_tokens: np.ndarray, details: np.ndarray | None = None) -> None:
    """A chunk's per-slot sums [rows, slots], and the architecture's details [rows, slots, D] where it gives any."""
    buffer = io.BytesIO()
    np.savez(buffer, nll_sum=nll_sum, n_tokens=n_tokens, **({} if details is None else {"details": details}))
    write_atomic(self._path(index), buffer.getvalue())

  def load(self, index: int, shape: tuple[int, int] | None = None, details: int = 0) -> tuple[np.ndarray, ...]:
    """A chunk's (nll_sum, n_tokens), and its details when `details` (their width) is not 0; a DamagedFileError (a
    ValueError) saying why when it does not read back whole (and, with `shape`, as [rows, slots] arrays of finite
    sums, details [rows, slots, details])."""
    path = self._path(index)
    try:
      with np.load(io.BytesIO(path.read_bytes())) as f:
        arrays = (f["nll_sum"], f["n_tokens"]) + ((f["details"],) if details else ())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
      raise DamagedFileError(f"{path.name} is unreadable ({type(e).__name__}: {str(e)[:120] or 'empty'})") from None
    wanted = (shape, shape, (*shape, details)) if shape is not None else ()
    for array, want in zip(arrays, wanted):
      if array.shape != want:
        raise DamagedFileError(f"{path.name} holds arrays of shape {array.shape}, not the chunk's {want}")
    if not all(np.isfinite(a).all() for a in arrays[:1] + arrays[2:]):
      raise DamagedFileError(f"{path.name} holds non-finite sums")
    return arrays

  def readable(self, index: int, shape: tuple[int, int], details: int = 0) -> tuple[np.ndarray, ...] | None:
    """The chunk, or None when it is absent or damaged (said in one line: it is scored again)."""
    if not self.done(index):
      return None
    try:
      return self.load(index, shape, details)
    except ValueError as e:
      _say(f"{self.directory}: {e}: scored again")
      return None

  def write_scores_record(self, lines: int, sha256: str) -> None:
    record = {"lines": lines, "sha256": sha256}
    write_atomic(self.directory / SCORES_RECORD, strict_json(record, str(self.directory / SCORES_RECORD)).encode())

  def scores_record(self) -> dict | None:
    path = self.directory / SCORES_RECORD
    if not path.exists():
      return None
    try:
      record = json.loads(path.read_text())
    except ValueError:
      return None
    return record if isinstance(record, dict) else None


def scores_from_chunks(store: ChunkStore) -> QuestionScores:
  """The question scores from the chunks and the layout alone (no data, no model): what rewrites a damaged scores
  file. A DamagedFileError says what is missing or damaged."""
  saved, unknown = store._saved_identity()
  if saved is None:
    raise DamagedFileError(unknown)
  layout_path = store.directory / LAYOUT
  if not layout_path.exists():
    raise DamagedFileError(f"no {LAYOUT} (chunks of an earlier version)")
  try:
    with np.load(io.BytesIO(layout_path.read_bytes())) as f:
      rows = {"slot_item": f["slot_item"], "slot_candidate": f["slot_candidate"]}
      table = QuestionTable.from_records(json.loads(f["questions"].tobytes().decode()), where=str(layout_path))
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise DamagedFileError(f"{LAYOUT} is unreadable ({type(e).__name__})") from None
  num_rows, slots = rows["slot_item"].shape
  parts = []
  for i, (start, stop) in enumerate(chunk_ranges(num_rows, int(saved["chunk_rows"]))):
    if not store.done(i):
      raise DamagedFileError(f"{store._path(i).name} is missing")
    parts.append(store.load(i, (stop - start, slots)))
  candidates = collect(rows, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                       table.candidates_per_item())
  return table.scores(candidates.nll_sum, candidates.n_tokens)


def score_resumable(evaluator: Evaluator, params: Params, td: TaskData, store: ChunkStore, chunk_rows: int,
                    progress: Progress) -> tuple[QuestionScores, QuestionDetails | None]:
  """Scores `td` chunk by chunk, reusing finished chunks of the same run (a damaged one is scored again). Only
  process 0 reads and writes the store (an output directory local to worker 0 works too); every process gets its
  decisions and arrays. A chunk whose sums are not finite is an error, and never saved. Returns the scores and,
  where the architecture gives details for these candidates (`architectures.detail_names`), the details, kept in
  the chunks as the sums are."""
  num_rows = td.num_rows
  chunks = chunk_ranges(num_rows, chunk_rows)
  slots = td.shape.max_slots
  names = architectures.detail_names(evaluator.config, td.modality)
  refusal, saved = None, [None] * len(chunks)
  if jax.process_index() == 0:
    try:
      store.open(td)
      saved = [store.readable(i, (stop - start, slots), len(names)) for i, (start, stop) in enumerate(chunks)]
    except (EvalError, OutputError) as e:
      refusal = e
  if sharding.from_process_0(np.array(refusal is not None)):
    raise refusal or EvalError("process 0 refused the output directory (see its log)")
  done = sharding.from_process_0(np.array([s is not None for s in saved]))
  todo_rows = sum(stop - start for (start, stop), d in zip(chunks, done) if not d)
  if done.any():  # on every process: each one's log says what it resumed
    _say(f"{td.task}/{td.modality}: resuming, {int(done.sum())} of {len(chunks)} chunks done, scoring {todo_rows} rows")
  parts = []
  scorer = evaluator.scorer(td)
  for i, (start, stop) in enumerate(chunks):
    if done[i]:
      empty = (np.zeros((stop - start, slots)), np.zeros((stop - start, slots), np.int64)) + (
        (np.zeros((stop - start, slots, len(names))),) if names else ())
      held = saved[i] if jax.process_index() == 0 else empty
      part = tuple(_from_process_0_exact(np.asarray(x, like.dtype)) for x, like in zip(held, empty))
      progress.update(stop - start)
    else:
      rows = {k: v[start:stop] for k, v in td.rows.items()}
      out = scorer.score_slots(evaluator.params_adapter(params), rows, progress=False)
      part = (out["nll_sum"], out["n_tokens"]) + ((out["details"],) if names else ())
      unscored = (rows["slot_item"] >= 0) & (part[1] == 0)
      if unscored.any():  # never save (and so resume from) a chunk that lost candidates
        raise EvalError(f"{td.task}/{td.modality} rows {start}-{stop - 1}: {int(unscored.sum())} laid candidates "
                        "scored no tokens; nothing was saved")
      for sums in part[:1] + part[2:]:  # the NLLs, and the details where there are any
        check_finite(td, rows, sums if sums.ndim == 2 else sums.sum(-1))
      if jax.process_index() == 0:
        store.save(i, *part)
      _preempt_if_asked(store)
      progress.update(stop - start, int((rows["segment_ids"] > 0).sum()))
    parts.append(part)
  joined = [np.concatenate(arrays) for arrays in zip(*parts)]
  candidates = collect(td.rows, joined[0], joined[1], td.questions.candidates_per_item(),
                       joined[2] if names else None)
  details = QuestionDetails.of(td.questions, names, candidates.details) if names else None
  return td.questions.scores(candidates.nll_sum, candidates.n_tokens), details
