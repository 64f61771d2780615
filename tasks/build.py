"""Questions -> token ids (text and audio) -> packed rows, plus the question table that maps slots back.

Tokenization rule (one rule, tested): the prefix and each candidate are tokenized separately and concatenated;
the candidate string carries its own leading separator (`" " + last` in English T->T), and is tokenized without
special tokens. So the scored tokens are exactly the candidate's tokens, and no token straddles the boundary.
The prefix is tokenized with the tokenizer's special tokens (a BOS where the model uses one).

A parallel_streams spec (Moshi) lays each side on streams instead, by s2sjax/families/moshi.py's protocol: the
same text ids on the text stream, or the audio codes on the codebook streams, one step each; the rows are packed
by `pack_streams`, which applies the spec's delays, and each scored token carries its stream's weight.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import time

import numpy as np
from absl import logging

from s2sjax import modalities
from s2sjax.modalities import SPEECH, TEXT
from s2sjax.families import moshi as moshi_family
from s2sjax.packing import (Item, PackingError, RowShape, StreamItem, StreamLayout, auto_row_length, check_item,
                            check_stream_item, pack, pack_streams)
from s2sjax.progress import Progress
from s2sjax.questions import QuestionTable
from s2sjax.spec import PARALLEL_STREAMS, AudioIds, Spec, resolve_audio_ids
from s2sjax.task_data import PROTOCOLS
from tasks.audio.base import AudioError, AudioTokenizer, load_audio
from tasks.audio.precomputed import CANDIDATES
from tasks.release import Problems, Question

# Recordings loaded and tokenized together by `QuestionEncoder.tokenize_audio`: enough for full length buckets,
# few enough that their waves fit in memory (512 ten-second waves at 24 kHz: 0.5 GB).
TOKENIZE_CHUNK = 512

@dataclasses.dataclass
class BuildStats:
  questions: int = 0
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  audio_seconds: float = 0.0
  seconds: float = 0.0
  audio_files: dict[str, int] = dataclasses.field(default_factory=dict)  # resampled / mixed_down counts

  def as_dict(self) -> dict:
    return {
      "questions": self.questions, "skipped": len(self.skipped),
      "skipped_questions": [{"where": w, "why": y} for w, y in self.skipped],
      "audio_seconds": round(self.audio_seconds, 2), "build_seconds": round(self.seconds, 2),
      "audio_files_resampled": self.audio_files.get("resampled", 0),
      "audio_files_mixed_down": self.audio_files.get("mixed_down", 0),
      "questions_per_second": round(self.questions / self.seconds, 2) if self.seconds else None,
      "audio_seconds_per_second": round(self.audio_seconds / self.seconds, 2) if self.seconds else None,
    }


class QuestionEncoder:
  """Turns a question's prefix and candidates into ids (and, for codebook tables, codes) for one spec, modality
  and protocol, by the templates of s2sjax/spec.py.

  `s2sbench`: prefix + candidate, the candidate's own tokens scored. `utterance` (S->S only): SlamKit's modelling
  metric (slamkit/metric/modelling_metric.py, slamkit/model/unit_lm.py): the whole spoken story, the prefix's audio
  and the candidate's as one recording, tokenized as `<bos> units <eos>` (slamkit/tokeniser/unit_tokeniser.py's
  template; bos = eos = 1 for unit LMs, the audio start / end tokens otherwise) and every token after the first
  scored, the closing eos included. For parallel streams (Moshi) that recording is every frame after the model's
  initial step, with no closing token: the Moshi paper's own S->S protocol (s2sjax/families/moshi.py)."""

  def __init__(self, spec: Spec, modality: str, tokenizer, audio_tokenizer: AudioTokenizer | None,
               language_override: str | None = None, protocol: str = "s2sbench", tokenization: str = "separate"):
    self.modality = modalities.get(modality)
    spec.check_modality(self.modality)
    if self.modality.speaks and audio_tokenizer is None:
      raise ValueError(f"modality {self.modality.name} needs an audio tokenizer")
    if protocol not in PROTOCOLS:
      raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if protocol == "utterance" and self.modality.name != "s2s":
      raise ValueError(f"the utterance protocol scores a spoken story as one recording: it is S→S only, not "
                       f"{self.modality.name} ({self.modality.title})")
    if tokenization == "joint" and self.modality.name != "t2t":
      raise ValueError(f"the joint tokenization rule differs from the separate one only where text meets text: it "
                       f"applies to t2t, not {self.modality.name} ({self.modality.title})")
    self.spec, self.tokenizer, self.protocol, self.tokenization = spec, tokenizer, protocol, tokenization
    self.audio_tokenizer = audio_tokenizer
    self.language_override = language_override
    # parallel_streams: how the rows' streams are delayed and how much each stream of a candidate weighs
    self.layout: StreamLayout | None = None
    if spec.audio_mode == PARALLEL_STREAMS:
      self.layout = StreamLayout(spec.stream_delays, spec.stream_initial_ids, predicted=spec.num_streams)
      self.weights = moshi_family.stream_weights(self.modality.name, len(spec.codebook_sizes))
    speaks_in_tokens = self.modality.speaks and self.layout is None  # special tokens and units to look up
    self.ids: AudioIds | None = resolve_audio_ids(spec, tokenizer) if speaks_in_tokens else None
    self.num_codebooks = (len(spec.codebook_sizes)
                          if self.modality.prefix == SPEECH and spec.audio_mode == "codebook_tables" else 0)
    self._audio_cache: dict[str, tuple[np.ndarray, float]] = {}
    self._audio_failures: dict[str, AudioError] = {}  # recordings the batched pass could not load, by key
    self._requests: dict[str, tuple[tuple[str, ...], str]] | None = None  # set while `tokenize_audio` collects
    self.audio_counts: collections.Counter = collections.Counter()  # files resampled or mixed down

  def language(self, question: Question) -> str:
    # S2SBench's reference code applies the last dataset's language to every dataset (the quirk switch).
    return self.language_override or question.language

  def text_ids(self, text: str, special: bool) -> np.ndarray:
    return np.asarray(self.tokenizer(text, add_special_tokens=special)["input_ids"], np.int32)

  def audio_codes(self, paths: tuple[str, ...], name: str) -> tuple[np.ndarray, float]:
    """(codes [T, K], seconds of audio) of the recordings at `paths` heard as one (their waves joined), once per
    distinct content: story lines 2k and 2k+1 usually carry the same prefix audio in two files. Precomputed codes
    are read by `name` (`<uttid>`, `candidates/<uttid>`, joined by `+`)."""
    tokenizer = self.audio_tokenizer
    key = "+".join(_file_digest(p) for p in paths) if tokenizer.reads_audio else name
    if self._requests is not None:  # `tokenize_audio` is listing what the questions ask for
      self._requests.setdefault(key, (paths, name))
      return np.zeros((1, tokenizer.num_codebooks), np.int32), 0.0
    if key in self._audio_failures:
      raise self._audio_failures[key]
    if key not in self._audio_cache:
      if not tokenizer.reads_audio:
        codes, seconds = np.concatenate([tokenizer.encode(None, part) for part in name.split("+")]), 0.0
      else:
        wave = self._wave(paths)
        codes, seconds = tokenizer.encode(wave, name), len(wave) / tokenizer.sample_rate
      self._remember(key, paths, name, codes, seconds)
    return self._audio_cache[key]

  def _wave(self, paths: tuple[str, ...]) -> np.ndarray:
    return np.concatenate([load_audio(p, self.audio_tokenizer.sample_rate, self.audio_counts) for p in paths])

  def _remember(self, key: str, paths: tuple[str, ...], name: str, codes: np.ndarray, seconds: float) -> None:
    if len(codes) == 0:
      self._audio_failures[key] = AudioError(f"{name}: {' + '.join(paths)} gave no audio frames")
      raise self._audio_failures[key]
    self._audio_cache[key] = (codes, seconds)

  def tokenize_audio(self, questions: list[Question], progress: str | None = None) -> None:
    """Tokenizes every recording the questions will ask for, in batches (a JAX tokenizer's length buckets over the
    host's devices), before any item is laid; laying then finds each in the cache. A recording that cannot be
    loaded is kept as its error and raised when its question asks for it, so `skip_bad` still leaves out just
    that question. Precomputed codes are read where they are asked for."""
    tokenizer = self.audio_tokenizer
    if tokenizer is None or not tokenizer.reads_audio:
      return
    self._requests = {}
    try:
      for question in questions:
        for c in range(len(question.candidates)):
          try:
            self.prefix(question, c)
            self.candidate(question, c)
          except (AudioError, PackingError, ValueError):
            break  # the laying pass meets it again and reports it where skip_bad decides
      requests = [(key, request) for key, request in self._requests.items() if key not in self._audio_cache]
    finally:
      self._requests = None
    meter = Progress(len(requests), progress, unit="utterances", rate_unit="audio s") if progress else None
    for start in range(0, len(requests), TOKENIZE_CHUNK):
      loaded = []
      for key, (paths, name) in requests[start:start + TOKENIZE_CHUNK]:
        try:
          loaded.append((key, paths, name, self._wave(paths)))
        except AudioError as e:
          self._audio_failures[key] = e
          if meter:
            meter.update(1)
      waves = [wave for *_, wave in loaded]
      for (key, paths, name, wave), codes in zip(loaded, tokenizer.encode_batch(waves, [n for _, _, n, _ in loaded],
                                                                                 meter)):
        try:
          self._remember(key, paths, name, codes, len(wave) / tokenizer.sample_rate)
        except AudioError:
          pass  # kept in _audio_failures: raised for the question that asks

  def units(self, codes: np.ndarray) -> np.ndarray:
    """extended_vocab: each frame's unit as its token id."""
    return np.asarray(self.ids.unit_ids, np.int32)[codes[:, 0]]

  def _opening(self, text: str) -> np.ndarray:
    """What a sequence with audio opens with: bos for a unit LM, else `text` with the tokenizer's special tokens,
    then the audio start token."""
    if not self.spec.text_vocabulary:
      return np.asarray([self.spec.bos_id], np.int32)
    start = [self.ids.start] if self.ids.start is not None else []
    return np.concatenate([self.text_ids(text, special=True), start]).astype(np.int32)

  def _text_pair(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray]:
    """T->T's (prefix ids, scored ids). `separate`: each tokenized apart, the candidate with its separator and no
    special tokens. `joint` (S2SBench's reference): `first + separator + last` tokenized as one string, the ids
    past as many as `first` alone makes are scored, so a token that merges across the boundary is scored."""
    first = question.prefixes[c]
    last = self.spec.text_separator[self.language(question)] + question.candidates[c]
    prefix = self.text_ids(first, special=True)
    if self.tokenization == "separate":
      return prefix, self.text_ids(last, special=False)
    joint = self.text_ids(first + last, special=True)
    return joint[: len(prefix)], joint[len(prefix):]

  def _streams(self, text: np.ndarray | None = None, audio: np.ndarray | None = None) -> np.ndarray:
    return moshi_family.lay_streams(len(self.spec.codebook_sizes), text, audio)

  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(ids [P], codes [P, K] or None, audio seconds) of candidate c's prefix; for parallel streams (streams
    [P, 1 + K], None, audio seconds)."""
    m = self.modality
    if self.layout is not None:  # the prefix's text, or its audio, on its own streams
      if self.protocol == "utterance":  # the recording is all candidate: the initial step alone precedes it
        return self._streams(audio=np.zeros((0, len(self.spec.codebook_sizes)), np.int32)), None, 0.0
      if m.prefix == TEXT:
        return self._streams(text=self.text_ids(question.prefixes[c], special=True)), None, 0.0
      codes, seconds = self.audio_codes((question.audio_paths[c],), question.uttids[c])
      return self._streams(audio=codes), None, seconds
    instruction = self.spec.speech_instruction[self.language(question)]
    if self.protocol == "utterance":  # the recording is all candidate: only what opens a sequence precedes it
      opening = self._opening("")
      # Without a start token or bos, the document separator opens it, as lm-eval's HFLM.prefix_token_id does
      # for an empty context (bos, else eos: Qwen's <|endoftext|>).
      if not len(opening):
        separator = next((t for t in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id) if t is not None), None)
        if separator is None:
          raise ValueError(f"spec {self.spec.name}: the utterance protocol needs a token to open the recording with "
                           "(the spec's start_token, or the tokenizer's bos or eos), and there is none")
        opening = np.asarray([separator], np.int32)
      return opening, None, 0.0
    if self.spec.chat is not None:
      return self._chat_prefix(question, c)
    if m.name == "t2t":
      return self._text_pair(question, c)[0], None, 0.0
    if m.prefix == TEXT:  # t2s: the text, then the audio the candidate speaks
      return self._opening(instruction + question.prefixes[c]), None, 0.0
    codes, seconds = self.audio_codes((question.audio_paths[c],), question.uttids[c])
    opening = self._opening(instruction)
    if self.spec.audio_mode == "codebook_tables":  # the codes ride on placeholder ids, at their positions
      blank = lambda n: np.full((n, codes.shape[1]), -1, np.int32)
      end = [self.ids.end] if self.ids.end is not None else []
      ids = np.concatenate([opening, np.full(len(codes), self.ids.placeholder, np.int32), end]).astype(np.int32)
      return ids, np.concatenate([blank(len(opening)), codes, blank(len(end))]), seconds
    # s2t closes the audio before the text candidate; s2s's candidate continues it
    end = [self.ids.end] if (self.ids.end is not None and m.candidate == TEXT) else []
    return np.concatenate([opening, self.units(codes), end]).astype(np.int32), None, seconds

  def _chat_prefix(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    """An instruct model's prefix: the user turn holding the prefix (its text, or its audio between the start and
    end tokens), then what opens the assistant's reply, which the candidate continues."""
    chat, speaks = self.spec.chat, self.modality.prefix == SPEECH
    turn = self.text_ids(chat["speech" if speaks else "text"], special=True)
    reply = self.text_ids(chat["reply"], special=False)
    if not speaks:
      return np.concatenate([turn, self.text_ids(question.prefixes[c], special=False), reply]).astype(np.int32), \
          None, 0.0
    codes, seconds = self.audio_codes((question.audio_paths[c],), question.uttids[c])
    start, end = ([t] if t is not None else [] for t in (self.ids.start, self.ids.end))
    if self.spec.audio_mode == "codebook_tables":
      audio = np.full(len(codes), self.ids.placeholder, np.int32)
      blank = lambda n: np.full((n, codes.shape[1]), -1, np.int32)
      laid = np.concatenate([blank(len(turn) + len(start)), codes, blank(len(end) + len(reply))])
    else:
      audio, laid = self.units(codes), None
    return np.concatenate([turn, start, audio, end, reply]).astype(np.int32), laid, seconds

  def candidate(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    """(ids, audio seconds) of candidate c: exactly the tokens that are scored (for parallel streams, its streams
    [n, 1 + K], the scored ones among them)."""
    if self.modality.name == "t2t" and self.layout is None and self.spec.chat is None:
      return self._text_pair(question, c)[1], 0.0
    if self.modality.candidate == TEXT:
      separator = (self.spec.text_separator[self.language(question)]
                   if self.modality.prefix == TEXT and self.spec.chat is None else "")
      ids = self.text_ids(separator + question.candidates[c], special=False)
      return (ids if self.layout is None else self._streams(text=ids)), 0.0
    spoken = _candidate_name(question, c)
    if self.protocol == "utterance":
      codes, seconds = self.audio_codes((question.audio_paths[c], question.candidate_audio_paths[c]),
                                        f"{question.uttids[c]}+{spoken}")
      if self.layout is not None:
        return self._streams(audio=codes), seconds
      eos = self.spec.bos_id if not self.spec.text_vocabulary else self.ids.end
      return np.concatenate([self.units(codes), [eos] if eos is not None else []]).astype(np.int32), seconds
    codes, seconds = self.audio_codes((question.candidate_audio_paths[c],), spoken)
    return (self.units(codes) if self.layout is None else self._streams(audio=codes)), seconds

  def item(self, prefix: np.ndarray, candidates: tuple[np.ndarray, ...], codes: np.ndarray | None,
           name: str) -> Item | StreamItem:
    """What the packer lays: an Item of ids, or a StreamItem whose candidates score this protocol's streams."""
    if self.layout is None:
      return Item(prefix, candidates, codes, name=name)
    return StreamItem(prefix, candidates, moshi_family.scored(self.weights), name=name)

  def check(self, item: Item | StreamItem, shape: RowShape, share_prefix: bool, overlong: str) -> None:
    """The PackingError the packer would raise for this item (see `check_item`)."""
    if self.layout is None:
      check_item(item, shape, share_prefix, overlong)
    elif overlong != "error":  # not a PackingError: no question could be built, so none is skipped for it
      raise ValueError(f"spec {self.spec.name} reads parallel streams, whose prefix steps cannot be dropped "
                       f"(overlong={overlong}): a delayed stream's steps hold tokens of several times")
    else:
      check_stream_item(item, shape, self.layout, share_prefix)

  def pack(self, items: list, shape: RowShape, share_prefix: bool, overlong: str):
    """(rows, PackReport) of the items, by `pack` or, for parallel streams, `pack_streams` (the scored tokens then
    weighted by the protocol)."""
    if self.layout is None:
      return pack(items, shape, share_prefix=share_prefix, overlong=overlong)
    rows, report = pack_streams(items, shape, self.layout, share_prefix)
    return moshi_family.weigh(rows, self.weights), report


def _candidate_name(question: Question, c: int) -> str:
  """How a spoken candidate is named to a precomputed tokenizer: `candidates/<its wav's name>`."""
  return f"{CANDIDATES}/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]


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


def build_items(questions: list[Question], encoder: QuestionEncoder, shape: RowShape, share_prefix: bool,
                skip_bad: bool, overlong: str = "error", progress: str | None = None
                ) -> tuple[list[Item], QuestionTable, BuildStats]:
  """Items (candidates grouped under identical prefixes) and the question table. A question whose audio is
  missing or unreadable, or that the packer cannot fit (by s2sjax/packing.py's rules: too long with
  overlong="error", a row's targets exceeded, a candidate too long even with the prefix truncated, an empty
  candidate), raises naming it, or with `skip_bad` is left out and listed. With overlong="truncate_prefix" the
  packer drops prefix tokens instead, and counts them. `progress` names a progress bar (questions, audio s/s)."""
  stats = BuildStats()
  meter = Progress(len(questions), progress, unit="questions", rate_unit="audio s") if progress else None
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
      new_items = [encoder.item(ids, tuple(candidates[c] for c in members), codes, f"question {question.id}")
                   for ids, codes, members in groups.values()]
      for item in new_items:  # here, where skip_bad can leave the question out, rather than in the final pack
        encoder.check(item, shape, share_prefix, overlong)
    except (AudioError, PackingError) as e:
      if not skip_bad:
        raise
      problems.add(f"question {question.id}", str(e))
      if meter:
        meter.update(1)
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
    if meter:
      meter.update(1, seconds)
  stats.questions = len(table)
  stats.skipped = problems.entries
  stats.seconds = time.time() - start
  if problems:
    logging.warning("left out %d question(s):\n  %s", len(problems.entries), problems.text())
  return items, QuestionTable.from_records(table), stats


def build_rows(questions: list[Question], encoder: QuestionEncoder, shape: RowShape, share_prefix: bool = True,
               skip_bad: bool = False, overlong: str = "error", auto_length: bool = False,
               progress: str | None = None) -> tuple[dict[str, np.ndarray], QuestionTable, dict]:
  """Packed rows, the question table and a report (counts, packing, truncations, skips, throughput, row_length).
  With `auto_length`, `shape` is the longest row allowed and the rows get `packing.auto_row_length`'s length,
  in `shape`'s proportions."""
  if auto_length and encoder.layout is not None:
    raise ValueError(f"spec {encoder.spec.name} reads parallel streams: give the row length (--row_length)")
  encoder.tokenize_audio(questions, progress and f"{progress} audio")
  items, table, stats = build_items(questions, encoder, shape, share_prefix, skip_bad, overlong, progress)
  stats.audio_files = dict(encoder.audio_counts)
  if not items:
    raise ValueError("no question could be built")
  if auto_length:
    shape = shape.with_length(auto_row_length(items, share_prefix, shape.max_targets / shape.length))
  rows, report = encoder.pack(items, shape, share_prefix, overlong)
  summary = {**stats.as_dict(), **report.as_dict(), "row_length": shape.length}
  logging.info("built %d questions into %d rows: %.1f questions/s, %.1f audio s/s, packing %.1f%%",
               stats.questions, report.rows, summary["questions_per_second"] or 0,
               summary["audio_seconds_per_second"] or 0, 100 * report.efficiency)
  return rows, table, summary
