"""Questions -> packed rows, plus the question table that maps slots back: each question laid by the encoder of
its spec's audio mode (tasks/encoders.py, where the tokenization rule lives), its candidates grouped under
identical prefixes, bad questions raised or left out, the items packed.

A spec of stream rows (s2sjax/data/rows.py) is packed by `pack_streams`, which applies the spec's delays, and each
scored token carries its stream's weight (`StreamEncoder.pack`).

No item is laid whose sequence (its prefix and a candidate) reads more positions than the model was trained to
(`PositionLimit`: found beside the text tokenizer by `trained_positions`, or a smaller `--max_item_tokens`): its
question is refused naming it, or with `skip_bad` left out and counted. Past its trained positions a model's scores
mean nothing, and one such item made rows of 16,384 tokens whose step did not finish in ten minutes on a CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

import numpy as np
from absl import logging

from s2sjax.runtime.errors import UserError
from s2sjax.data.packing import Item, PackingError, PackReport, RowShape, auto_row_length
from s2sjax.runtime.progress import Progress
from s2sjax.data.questions import QuestionTable
from s2sjax.data.text_tokenizer import json_object
from s2sjax.data.checkpoint_files import CONFIG as CHECKPOINT_CONFIG
from tasks.audio.base import AudioError, resamplings
from tasks.encoders import QuestionEncoder
from tasks.release import Problems, Question


class BuildError(UserError, ValueError):
  """Questions or options no rows can be built from: names the spec or the flag."""


@dataclasses.dataclass(frozen=True)
class PositionLimit:
  """The most positions one item's sequence (its prefix and a candidate, as laid) may read, and what says so."""

  positions: int
  source: str  # in messages and the report: "--max_item_tokens", "<folder>/config.json max_position_embeddings"

  def __post_init__(self):
    if isinstance(self.positions, bool) or not isinstance(self.positions, int) or self.positions < 1:
      raise BuildError(f"{self.source}={self.positions!r}: the most positions an item may read is a positive integer")


# transformers writes model_max_length = int(1e30) for a tokenizer that knows no limit
NO_LIMIT = 10 ** 12


def trained_positions(tokenizer_dir: str) -> PositionLimit | None:
  """How many positions the model whose tokenizer is in `tokenizer_dir` was trained to, where the folder says, first
  found: the converted checkpoint it sits in (`<checkpoint>/tokenizer`: model_config.json's max_positions), the
  transformers model folder it is (config.json's max_position_embeddings), its tokenizer_config.json's
  model_max_length. None when none of them says (a build then lays any length its rows hold)."""
  checkpoint = os.path.dirname(os.path.normpath(tokenizer_dir))
  for path, key in ((os.path.join(checkpoint, CHECKPOINT_CONFIG), "max_positions"),
                    (os.path.join(tokenizer_dir, "config.json"), "max_position_embeddings"),
                    (os.path.join(tokenizer_dir, "tokenizer_config.json"), "model_max_length")):
    value = json_object(path).get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < NO_LIMIT:
      return PositionLimit(value, f"{path} {key}")
  return None


def position_limit(max_item_tokens: int | None, tokenizer_dir: str | None) -> PositionLimit | None:
  """The build's limit: the user's `max_item_tokens` or the model's trained positions, whichever is smaller."""
  limits = [PositionLimit(max_item_tokens, "--max_item_tokens")] if max_item_tokens is not None else []
  trained = trained_positions(tokenizer_dir) if tokenizer_dir else None
  limits += [trained] if trained else []
  return min(limits, key=lambda limit: limit.positions, default=None)


class PastPositionsError(PackingError):
  """An item whose sequence reads more positions than the build's `PositionLimit`."""


@dataclasses.dataclass
class BuildStats:
  questions: int = 0
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  limit: PositionLimit | None = None
  past_limit: int = 0  # questions left out (skip_bad) for an item past the limit
  audio_seconds: float = 0.0
  seconds: float = 0.0
  audio_files: dict[str, int] = dataclasses.field(default_factory=dict)  # resampled / mixed_down counts
  duplicates: list[str] = dataclasses.field(default_factory=list)  # questions with candidates of the same tokens

  def as_dict(self) -> dict:
    return {
      "questions": self.questions, "skipped": len(self.skipped),
      "skipped_questions": [{"where": w, "why": y} for w, y in self.skipped],
      "audio_seconds": round(self.audio_seconds, 2), "build_seconds": round(self.seconds, 2),
      "audio_files_resampled": self.audio_files.get("resampled", 0),
      "audio_resampled_from_to": resamplings(self.audio_files),  # {"22050->16000": files}
      "audio_files_mixed_down": self.audio_files.get("mixed_down", 0),
      "questions_with_duplicate_candidates": self.duplicates,
      "max_item_positions": self.limit.positions if self.limit else None,
      "max_item_positions_from": self.limit.source if self.limit else None,
      "questions_past_max_item_positions": self.past_limit,
      "questions_per_second": round(self.questions / self.seconds, 2) if self.seconds else None,
      "audio_seconds_per_second": round(self.audio_seconds / self.seconds, 2) if self.seconds else None,
    }


def _key(*parts) -> str:
  """What tells two prefixes apart: their arrays (a format's prefix may be a mapping of fields), bytes and shape."""
  digest = hashlib.sha256()
  for part in parts:
    for name, array in sorted(part.items()) if isinstance(part, dict) else [("", part)]:
      if array is not None:
        array = np.asarray(array)
        digest.update(f"{name}{array.dtype}{list(array.shape)}".encode() + array.tobytes())
  return digest.hexdigest()


def _distinct(members: list[int], candidates: list) -> list[int]:
  """The members whose candidate tokens no earlier member has, in order."""
  distinct, seen = [], set()
  for c in members:
    key = _key(candidates[c])
    if key not in seen:
      seen.add(key)
      distinct.append(c)
  return distinct


def build_items(questions: list[Question], encoder: QuestionEncoder, shape: RowShape, share_prefix: bool,
                skip_bad: bool, overlong: str = "error", progress: str | None = None,
                limit: PositionLimit | None = None) -> tuple[list[Item], QuestionTable, BuildStats]:
  """Items (candidates grouped under identical prefixes) and the question table. A question whose audio is
  missing or unreadable, that the packer cannot fit (by s2sjax/data/packing.py's rules: too long with
  overlong="error", a row's targets exceeded, a candidate too long even with the prefix truncated, an empty
  candidate), or whose item reads more positions than `limit`, raises naming it, or with `skip_bad` is left out
  and listed. With overlong="truncate_prefix" the packer drops prefix tokens of items longer than the row instead,
  and counts them (not of items past `limit`: those are the model's bound, not the row's). `progress` names a
  progress bar of the questions laid (no rate: their audio was tokenized before, by `tokenize_audio`'s own bar)."""
  stats = BuildStats(limit=limit)
  meter = Progress(len(questions), progress, unit="questions") if progress else None
  start = time.time()
  items: list[Item] = []
  table: list[dict] = []  # QuestionTable records
  problems = Problems()
  for question in questions:
    try:
      groups: dict[str, tuple[np.ndarray, np.ndarray | None, list[int]]] = {}
      seconds = 0.0
      for c in range(len(question.candidates)):
        ids, codes, audio_seconds = encoder.prefix(question, c)
        seconds += audio_seconds if question.audio_paths[c] not in question.audio_paths[:c] else 0.0
        groups.setdefault(_key(ids, codes), (ids, codes, []))[2].append(c)
      candidates = []
      for c in range(len(question.candidates)):
        ids, audio_seconds = encoder.candidate(question, c)
        candidates.append(ids)
        seconds += audio_seconds
      # Candidates with the same tokens after the same prefix are one computation: laid once, every one of them
      # reads that laying's score, so they tie exactly (laid twice, their sums would round apart by where each lies).
      laid = [_distinct(members, candidates) for _, _, members in groups.values()]
      new_items = [encoder.item(ids, tuple(candidates[c] for c in unique), codes, f"question {question.id}")
                   for (ids, codes, _), unique in zip(groups.values(), laid)]
      for item in new_items:  # here, where skip_bad can leave the question out, rather than in the final pack
        encoder.check(item, shape, share_prefix, overlong)
        _check_positions(encoder, item, limit)
    except (AudioError, PackingError) as e:
      if not skip_bad:
        raise
      stats.past_limit += isinstance(e, PastPositionsError)
      where = f"question {question.id}"  # the items' name, which a PackingError's message opens with
      problems.add(where, str(e).removeprefix(f"{where}: "))
      if meter:
        meter.update(1)
      continue
    slots = []
    for offset, ((_, _, members), unique) in enumerate(zip(groups.values(), laid)):
      within = {_key(candidates[c]): j for j, c in enumerate(unique)}
      slots += [(c, len(items) + offset, within[_key(candidates[c])]) for c in members]
    if sum(map(len, laid)) < len(question.candidates):
      stats.duplicates.append(question.id)
    items.extend(new_items)
    table.append({
      "id": question.id, "uttids": list(question.uttids), "correct": question.correct,
      "candidates": list(question.candidates), "prefix": question.prefixes[0],
      "slots": [[item, j] for _, item, j in sorted(slots)],  # per candidate: (item index, candidate in item)
      "n_tokens": [encoder.scored(c) for c in candidates],
      **({"labels": dict(question.labels)} if question.labels else {}),
    })
    stats.audio_seconds += seconds
    if meter:
      meter.update(1)
  stats.questions = len(table)
  stats.skipped = problems.entries
  stats.seconds = time.time() - start
  if problems:
    logging.warning("left out %d question(s):\n  %s", len(problems.entries), problems.text())
  if stats.duplicates:
    logging.warning("%d question(s) hold candidates of the same tokens, scored as one (they tie): %s",
                    len(stats.duplicates), ", ".join(stats.duplicates[:10]) + (" ..." if len(stats.duplicates) > 10 else ""))
  return items, QuestionTable.from_records(table), stats


def _check_positions(encoder: QuestionEncoder, item, limit: PositionLimit | None) -> None:
  if limit is not None and (taken := encoder.positions(item)) > limit.positions:
    raise PastPositionsError(
      f"{item.name}: its prefix and longest candidate read {taken} positions, past the {limit.positions} of "
      f"{limit.source}: a model's scores past its trained positions mean nothing (pass --skip_bad to leave such "
      "questions out, counted)")


@dataclasses.dataclass
class BuiltRows:
  """What `build_rows` made: the packed rows, the question table, the shape they were packed in (its length chosen
  from the items when the build was not given one), and the counts of the questions and of the packing."""

  rows: dict[str, np.ndarray]
  table: QuestionTable
  shape: RowShape
  stats: BuildStats
  packing: PackReport

  def summary(self) -> dict:
    """The build's report: counts, packing, truncations, skips, throughput and the row length."""
    return {**self.stats.as_dict(), **self.packing.as_dict(), "row_length": self.shape.length}

  def __iter__(self):
    """Unpacks as (rows, question table, report)."""
    return iter((self.rows, self.table, self.summary()))


def build_rows(questions: list[Question], encoder: QuestionEncoder, shape: RowShape, share_prefix: bool = True,
               skip_bad: bool = False, overlong: str = "error", auto_length: bool = False,
               progress: str | None = None, limit: PositionLimit | None = None) -> BuiltRows:
  """Packed rows and the question table, no item past `limit` (`build_items`). With `auto_length`, `shape` is the
  longest row allowed and the rows get `packing.auto_row_length`'s length, in `shape`'s proportions."""
  if auto_length and not encoder.auto_length:
    raise BuildError(f"spec {encoder.spec.name} ({encoder.spec.audio_mode}) cannot choose its row length from its "
                     "items: give the row length (--row_length)")
  encoder.tokenize_audio(questions, progress and f"{progress} audio")
  items, table, stats = build_items(questions, encoder, shape, share_prefix, skip_bad, overlong, progress, limit)
  stats.audio_files = dict(encoder.audio_counts)
  if not items:
    raise BuildError("no question could be built")
  if auto_length:
    shape = shape.with_length(auto_row_length(items, share_prefix, shape.max_targets / shape.length))
  rows, report = encoder.pack(items, shape, share_prefix, overlong)
  built = BuiltRows(rows, table, shape, stats, report)
  logging.info("built %d questions into %d rows: %.1f questions/s, %.1f audio s/s, packing %.1f%%",
               stats.questions, report.rows, built.summary()["questions_per_second"] or 0,
               built.summary()["audio_seconds_per_second"] or 0, 100 * report.efficiency)
  return built
