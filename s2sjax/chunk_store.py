"""The chunk store that makes an evaluation resumable after preemption, and the resumable scoring loop.

    OUT/chunks/<checkpoint>/<task>-<modality>/identity.json     what produced the chunks (written first)
    OUT/chunks/<checkpoint>/<task>-<modality>/chunk-00003.npz   rows [start, stop) of one run

A chunk is written to a temporary name and renamed into place, so one that exists is whole; a rerun reuses every
chunk and scores only the rest, so the final files equal an uninterrupted run's. Paths go through etils `epath`,
so OUT may be a `gs://` bucket.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys

import jax
import numpy as np
from absl import logging
from etils import epath

from s2sjax import sharding
from s2sjax.evaluator import EvalError, Evaluator
from s2sjax.model.decoder import Params
from s2sjax.output_dir import OutputError, write_atomic
from s2sjax.questions import QuestionScores
from s2sjax.progress import Progress
from s2sjax.scoring import collect
from s2sjax.task_data import TaskData


# Fault injection at a known point, for resume and dead-peer tests: after this process has scored (and, on
# process 0, saved) this many chunks, it kills itself with SIGKILL, as a preempted VM dies (no cleanup at all).
KILL_AFTER_CHUNKS = "S2SJAX_KILL_AFTER_CHUNKS"
_chunks_in_this_process = 0


def _preempt_if_asked(store: "ChunkStore") -> None:
  global _chunks_in_this_process
  _chunks_in_this_process += 1
  if str(_chunks_in_this_process) == os.environ.get(KILL_AFTER_CHUNKS):
    logging.warning("%s=%d: killing this process after chunk %d of %s", KILL_AFTER_CHUNKS, _chunks_in_this_process,
                    _chunks_in_this_process, store.directory)
    os.kill(os.getpid(), signal.SIGKILL)


class ChunkStore:
  """Resumable per-row results of one (checkpoint, task, modality). `identity.json` records what produced them: the
  checkpoint (its path and a hash of its contents), dtype, chunking, a hash of the rows. A rerun resumes only from
  its own chunks; chunks of a checkpoint since replaced at the same path (a training loop's `latest/`), or of
  unknown origin, are scored again; chunks of another run's settings are refused."""

  RESCORED_WHEN_CHANGED = ("checkpoint_content",)

  def __init__(self, directory, identity: dict):
    self.directory = epath.Path(directory)
    self.identity = identity

  def open(self) -> None:
    """Checks and records the identity before the first chunk (process 0 only): a run with other settings started
    later is refused even before this one has saved anything."""
    path = self.directory / "identity.json"
    saved = json.loads(path.read_text()) if path.exists() else None
    if saved is not None:
      differ = [f"{key}: {saved.get(key)!r} there, {value!r} now" for key, value in self.identity.items()
                if key not in self.RESCORED_WHEN_CHANGED and saved.get(key) != value]
      if differ:
        raise EvalError(f"{self.directory} holds results of another run ({'; '.join(differ)}): use another "
                        "--output_dir, or delete that folder to score again")
    stale = saved is None or any(saved.get(k) != self.identity[k] for k in self.RESCORED_WHEN_CHANGED)
    chunks = list(self.directory.glob("chunk-*.npz")) if self.directory.exists() else []
    if stale and chunks:
      logging.warning("%s: %d chunks of %s are scored again", self.directory, len(chunks),
                      "a checkpoint since replaced at the same path" if saved else "unknown origin (no identity.json)")
      for chunk in chunks:
        chunk.unlink()
    write_atomic(path, json.dumps(self.identity, indent=2, sort_keys=True).encode())

  def _path(self, index: int) -> epath.Path:
    return self.directory / f"chunk-{index:05d}.npz"

  def done(self, index: int) -> bool:
    return self._path(index).exists()  # written whole or not at all (write_atomic)

  def save(self, index: int, nll_sum: np.ndarray, n_tokens: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, nll_sum=nll_sum, n_tokens=n_tokens)
    write_atomic(self._path(index), buffer.getvalue())

  def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(self._path(index).read_bytes())) as f:
      return f["nll_sum"], f["n_tokens"]


def score_resumable(evaluator: Evaluator, params: Params, td: TaskData, store: ChunkStore, chunk_rows: int,
                    progress: Progress) -> QuestionScores:
  """Scores `td` chunk by chunk, reusing finished chunks of the same run. Only process 0 reads and writes the
  store (an output directory local to worker 0 works too); every process gets its decisions and arrays."""
  num_rows = td.num_rows
  chunks = [(start, min(start + chunk_rows, num_rows)) for start in range(0, num_rows, chunk_rows)]
  refusal = None
  if jax.process_index() == 0:
    try:
      store.open()
    except (EvalError, OutputError) as e:
      refusal = e
  if sharding.from_process_0(np.array(refusal is not None)):
    raise refusal or EvalError("process 0 refused the output directory (see its log)")
  done = sharding.from_process_0(np.array([jax.process_index() == 0 and store.done(i) for i in range(len(chunks))]))
  todo_rows = sum(stop - start for (start, stop), d in zip(chunks, done) if not d)
  if done.any():  # on every process: each one's log says what it resumed
    print(f"{td.task}/{td.modality}: resuming, {int(done.sum())} of {len(chunks)} chunks done, scoring {todo_rows} "
          "rows", file=sys.stderr, flush=True)
  nll_sum, n_tokens = [], []
  scorer = evaluator.scorer(td)
  for i, (start, stop) in enumerate(chunks):
    if done[i]:
      empty = (np.zeros((stop - start, td.shape.max_slots)), np.zeros((stop - start, td.shape.max_slots), np.int64))
      part = tuple(sharding.from_process_0(x) for x in (store.load(i) if jax.process_index() == 0 else empty))
      progress.update(stop - start)
    else:
      rows = {k: v[start:stop] for k, v in td.rows.items()}
      part = scorer.score(evaluator.params_adapter(params), rows, progress=False)
      unscored = (rows["slot_item"] >= 0) & (part[1] == 0)
      if unscored.any():  # never save (and so resume from) a chunk that lost candidates
        raise EvalError(f"{td.task}/{td.modality} rows {start}-{stop - 1}: {int(unscored.sum())} laid candidates "
                        "scored no tokens; nothing was saved")
      if jax.process_index() == 0:
        store.save(i, *part)
      _preempt_if_asked(store)
      progress.update(stop - start, int((rows["segment_ids"] > 0).sum()))
    nll_sum.append(part[0])
    n_tokens.append(part[1])
  candidates = collect(td.rows, np.concatenate(nll_sum), np.concatenate(n_tokens), td.questions.candidates_per_item())
  return td.questions.scores(candidates.nll_sum, candidates.n_tokens)
