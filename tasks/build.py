"""Questions -> token ids (text and audio) -> packed rows, plus the question table that maps slots back.

Tokenization rule (one rule, tested): the prefix and each candidate are tokenized separately and concatenated;
the candidate string carries its own leading separator (`" " + last` in English T->T), and is tokenized without
special tokens. So the scored tokens are exactly the candidate's tokens, and no token straddles the boundary.
The prefix is tokenized with the tokenizer's special tokens (a BOS where the model uses one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time

import numpy as np
from absl import logging

from s2sjax.packing import Item, PackingError, RowShape, check_item, pack
from s2sjax.questions import QuestionTable
from s2sjax.spec import AudioIds, Spec, resolve_audio_ids
from tasks.audio.base import AudioError, AudioTokenizer, load_audio
from tasks.release import Problems, Question

MODALITIES = ("text", "speech")


@dataclasses.dataclass
class BuildStats:
  questions: int = 0
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  audio_seconds: float = 0.0
  seconds: float = 0.0

  def as_dict(self) -> dict:
    return {
      "questions": self.questions, "skipped": len(self.skipped),
      "skipped_questions": [{"where": w, "why": y} for w, y in self.skipped],
      "audio_seconds": round(self.audio_seconds, 2), "build_seconds": round(self.seconds, 2),
      "questions_per_second": round(self.questions / self.seconds, 2) if self.seconds else None,
      "audio_seconds_per_second": round(self.audio_seconds / self.seconds, 2) if self.seconds else None,
    }


class PrefixEncoder:
  """Turns a question's prefix (text, or spoken audio) into ids [P] and codes [P, K] for one spec and modality."""

  def __init__(self, spec: Spec, modality: str, tokenizer, audio_tokenizer: AudioTokenizer | None,
               language_override: str | None = None):
    if modality not in MODALITIES:
      raise ValueError(f"modality must be one of {MODALITIES}, not {modality!r}")
    if modality == "speech" and not spec.has_speech:
      raise ValueError(f"spec {spec.name} is text-only: build it with modality=text")
    if modality == "speech" and audio_tokenizer is None:
      raise ValueError("modality=speech needs an audio tokenizer")
    self.spec, self.modality, self.tokenizer = spec, modality, tokenizer
    self.audio_tokenizer = audio_tokenizer
    self.language_override = language_override
    self.ids: AudioIds | None = resolve_audio_ids(spec, tokenizer) if modality == "speech" else None
    self.num_codebooks = len(spec.codebook_sizes) if (modality == "speech" and spec.audio_mode == "codebook_tables") else 0
    self._audio_cache: dict[str, tuple[np.ndarray, float]] = {}

  def language(self, question: Question) -> str:
    # S2SBench's reference code applies the last dataset's language to every dataset (the quirk switch).
    return self.language_override or question.language

  def text_ids(self, text: str, special: bool) -> np.ndarray:
    return np.asarray(self.tokenizer(text, add_special_tokens=special)["input_ids"], np.int32)

  def candidate_ids(self, question: Question, candidate: str) -> np.ndarray:
    separator = self.spec.text_separator[self.language(question)] if self.modality == "text" else ""
    return self.text_ids(separator + candidate, special=False)

  def audio_codes(self, path: str, uttid: str) -> tuple[np.ndarray, float]:
    """(codes [T, K], seconds of audio), once per distinct recording: story lines 2k and 2k+1 usually carry the
    same audio in two files, which is tokenized once."""
    key = _file_digest(path) if self.audio_tokenizer.reads_audio else uttid
    if key not in self._audio_cache:
      tokenizer = self.audio_tokenizer
      if not tokenizer.reads_audio:
        codes, seconds = tokenizer.encode(None, uttid), 0.0
      else:
        wave = load_audio(path, tokenizer.sample_rate)
        codes, seconds = tokenizer.encode(wave, uttid), len(wave) / tokenizer.sample_rate
      if len(codes) == 0:
        raise AudioError(f"uttid {uttid}: {path} gave no audio frames")
      self._audio_cache[key] = (codes, seconds)
    return self._audio_cache[key]

  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(ids [P], codes [P, K] or None, audio seconds) of candidate c's prefix."""
    if self.modality == "text":
      return self.text_ids(question.prefixes[c], special=True), None, 0.0
    codes, seconds = self.audio_codes(question.audio_paths[c], question.uttids[c])
    instruction = self.text_ids(self.spec.speech_instruction[self.language(question)], special=True)
    start = [self.ids.start] if self.ids.start is not None else []
    end = [self.ids.end] if self.ids.end is not None else []
    if self.spec.audio_mode == "extended_vocab":
      audio = np.asarray(self.ids.unit_ids, np.int32)[codes[:, 0]]
      audio_codes = None
    else:
      audio = np.full(len(codes), self.ids.placeholder, np.int32)
      audio_codes = codes
    ids = np.concatenate([instruction, start, audio, end]).astype(np.int32)
    if audio_codes is not None:
      blank = lambda n: np.full((n, codes.shape[1]), -1, np.int32)
      audio_codes = np.concatenate([blank(len(instruction) + len(start)), audio_codes, blank(len(end))])
    return ids, audio_codes, seconds


def _file_digest(path: str) -> str:
  """Content hash of an audio file; a missing one keys by path so that load_audio reports it."""
  try:
    with open(path, "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()
  except OSError:
    return path


def _key(ids: np.ndarray, codes: np.ndarray | None) -> str:
  digest = hashlib.sha256(ids.tobytes())
  if codes is not None:
    digest.update(codes.tobytes())
  return digest.hexdigest()


def build_items(questions: list[Question], encoder: PrefixEncoder, shape: RowShape, share_prefix: bool,
                skip_bad: bool, overlong: str = "error") -> tuple[list[Item], QuestionTable, BuildStats]:
  """Items (candidates grouped under identical prefixes) and the question table. A question whose audio is
  missing or unreadable, or that the packer cannot fit (by s2sjax/packing.py's rules: too long with
  overlong="error", a row's targets exceeded, a candidate too long even with the prefix truncated, an empty
  candidate), raises naming it, or with `skip_bad` is left out and listed. With overlong="truncate_prefix" the
  packer drops prefix tokens instead, and counts them."""
  stats = BuildStats()
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
      candidates = [encoder.candidate_ids(question, text) for text in question.candidates]
      new_items = [Item(ids, tuple(candidates[c] for c in members), codes, name=f"question {question.id}")
                   for ids, codes, members in groups.values()]
      for item in new_items:  # here, where skip_bad can leave the question out, rather than in the final pack
        check_item(item, shape, share_prefix, overlong)
    except (AudioError, PackingError) as e:
      if not skip_bad:
        raise
      problems.add(f"question {question.id}", str(e))
      continue
    slots = []
    for offset, (_, _, members) in enumerate(groups.values()):
      slots += [(c, len(items) + offset, j) for j, c in enumerate(members)]
    items.extend(new_items)
    table.append({
      "id": question.id, "uttids": list(question.uttids), "correct": question.correct,
      "candidates": list(question.candidates), "prefix": question.prefixes[0],
      "slots": [[item, j] for _, item, j in sorted(slots)],  # per candidate: (item index, candidate in item)
      "n_tokens": [int(len(c)) for c in candidates],
    })
    stats.audio_seconds += seconds
  stats.questions = len(table)
  stats.skipped = problems.entries
  stats.seconds = time.time() - start
  if problems:
    logging.warning("left out %d question(s):\n  %s", len(problems.entries), problems.text())
  return items, QuestionTable.from_records(table), stats


def build_rows(questions: list[Question], encoder: PrefixEncoder, shape: RowShape, share_prefix: bool = True,
               skip_bad: bool = False, overlong: str = "error") -> tuple[dict[str, np.ndarray], QuestionTable, dict]:
  """Packed rows, the question table and a report (counts, packing, truncations, skips, throughput)."""
  items, table, stats = build_items(questions, encoder, shape, share_prefix, skip_bad, overlong)
  if not items:
    raise ValueError("no question could be built")
  rows, report = pack(items, shape, share_prefix=share_prefix, overlong=overlong)
  summary = {**stats.as_dict(), **report.as_dict()}
  logging.info("built %d questions into %d rows: %.1f questions/s, %.1f audio s/s, packing %.1f%%",
               stats.questions, report.rows, summary["questions_per_second"] or 0,
               summary["audio_seconds_per_second"] or 0, 100 * report.efficiency)
  return rows, table, summary
