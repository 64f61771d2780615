"""A question's prefix and candidates -> token ids (and audio codes) for one spec, modality and protocol: one encoder
per way audio enters the model, over the parts they share (text ids, the audio code cache and its batched pass,
the language, the chat turns).

Tokenization rule (one rule, tested): the prefix and each candidate are tokenized separately and concatenated;
the candidate string carries its own leading separator (`" " + last` in English T->T), and is tokenized without
special tokens. So the scored tokens are exactly the candidate's tokens, and no token straddles the boundary.
The prefix is tokenized with the tokenizer's special tokens (a BOS where the model uses one).

`QuestionEncoder(spec, modality, ...)` builds the encoder registered for the spec's input format (`ENCODERS`, keyed
by the format's name, s2sjax/data/formats) and the modality (`encoder_class`); the built-in formats' are these:
  TextEncoder      text on both sides (t2t) in token rows, whatever the spec's audio mode
  UnitEncoder      extended_vocab: each audio frame's unit is a token id
  CodebookEncoder  codebook_tables: a frame's K codes ride on a placeholder id (S->T only)
  StreamEncoder    parallel_streams: each side on streams of its own, by the spec's architecture's protocol
  LaidEncoder      the base of an own row format's encoder (tasks/kimi_encoder.py, tasks/mimo_encoder.py,
                   tasks/step_audio2_encoder.py)
A plugin's format registers its own subclass (tests/plugins/toy_features.py).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import hashlib
import os

import numpy as np

from s2sjax.data import modalities
from s2sjax.data.builds import PROTOCOLS, VariantError
from s2sjax.data.formats.streams import (StreamItem, StreamLayout, check_stream_item, pack_streams, scored_streams,
  weigh_streams)
from s2sjax.data.modalities import SPEECH, TEXT
from s2sjax.data.packing import (Item, LaidItem, PackingError, RowShape, check_item, fit_laid, item_positions, pack,
  pack_laid)
from s2sjax.runtime.progress import Progress
from s2sjax.runtime.registry import Registry, load_object
from s2sjax.data.rows import TOKEN_ROWS
from s2sjax.data.spec import AudioIds, Spec, SpecError, resolve_audio_ids
from tasks.audio.base import AudioError, AudioTokenizer, AudioTokenizerError, load_audio
from tasks.audio.precomputed import CANDIDATES
from tasks.release import Question

# Recordings loaded and tokenized together by `QuestionEncoder.tokenize_audio`: enough for full length buckets,
# few enough that their waves fit in memory (512 ten-second waves at 24 kHz: 0.5 GB).
TOKENIZE_CHUNK = 512


class QuestionEncoder(abc.ABC):
  """Turns a question's prefix and candidates into ids (and, for codebook tables, codes) for one spec, modality
  and protocol, by the templates of s2sjax/data/spec.py.

  `s2sbench`: prefix + candidate, the candidate's own tokens scored. `utterance` (S->S only): SlamKit's modelling
  metric (slamkit/metric/modelling_metric.py, slamkit/model/unit_lm.py): the whole spoken story, the prefix's audio
  and the candidate's as one recording, tokenized as `<bos> units <eos>` (slamkit/tokeniser/unit_tokeniser.py's
  template; bos = eos = 1 for unit LMs, the audio start / end tokens otherwise) and every token after the first
  scored, the closing eos included. For stream rows that recording is every frame after the model's initial
  step, with no closing token (the S->S protocol of the spec's stream protocol).

  Called by this name it builds the subclass that lays the spec's audio mode (`encoder_class`): each subclass
  says how a `prefix` and a `candidate` are laid; this class holds what they share, and lays token rows."""

  layout: StreamLayout | None = None  # stream rows: how the rows' streams are delayed
  ids: AudioIds | None = None  # audio in token rows: the spec's special tokens and units, looked up
  # Whether a build without a row length may choose one from its items (`packing.auto_row_length`, over token items
  # or laid ones); an encoder whose items depend on the row length (delayed streams) sets False: --row_length.
  auto_length = True

  def __new__(cls, spec: Spec, modality: str, *args, **kwargs):
    return super().__new__(encoder_class(spec, modality) if cls is QuestionEncoder else cls)

  def __init__(self, spec: Spec, modality: str, tokenizer, audio_tokenizer: AudioTokenizer | None,
               language_override: str | None = None, protocol: str = "s2sbench", tokenization: str = "separate"):
    self.modality = modalities.get(modality)
    spec.check_modality(self.modality)
    if self.modality.speaks and audio_tokenizer is None:
      raise ValueError(f"modality {self.modality.name} needs an audio tokenizer")
    scoring = PROTOCOLS.get(protocol)
    if scoring.modalities is not None and self.modality.name not in scoring.modalities:
      asked = ", ".join(modalities.get(name).title for name in scoring.modalities)
      raise VariantError(f"the {protocol} protocol ({scoring.summary}) is {asked} only, not {self.modality.name} "
                         f"({self.modality.title})")
    if tokenization == "joint" and self.modality.name != "t2t":
      raise VariantError(f"the joint tokenization rule differs from the separate one only where text meets text: "
                         f"it applies to t2t, not {self.modality.name} ({self.modality.title})")
    self.spec, self.tokenizer, self.protocol, self.tokenization = spec, tokenizer, protocol, tokenization
    self.audio_tokenizer = audio_tokenizer
    self.language_override = language_override
    self._audio_cache: dict[str, tuple[np.ndarray, float]] = {}
    self._audio_features: dict[str, np.ndarray] = {}  # a feature track's rows per recording, by the cache's key
    self._audio_failures: dict[str, AudioError] = {}  # recordings the batched pass could not load, by key
    self._requests: dict[str, tuple[tuple[str, ...], str]] | None = None  # set while `tokenize_audio` collects
    self.audio_counts: collections.Counter = collections.Counter()  # files resampled or mixed down

  @abc.abstractmethod
  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(ids [P], codes [P, K] or None, audio seconds) of candidate c's prefix; for parallel streams (streams
    [P, 1 + K], None, audio seconds)."""

  @abc.abstractmethod
  def candidate(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    """(ids, audio seconds) of candidate c: exactly the tokens that are scored (for parallel streams, its streams
    [n, 1 + K], the scored ones among them)."""

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
    key = self._key(paths, name)
    if self._requests is not None:  # `tokenize_audio` is listing what the questions ask for
      self._requests.setdefault(key, (paths, name))
      return np.zeros((1, tokenizer.num_codebooks), np.int32), 0.0
    if key in self._audio_failures:
      raise self._audio_failures[key]
    if key not in self._audio_cache:
      features = None
      if not tokenizer.reads_audio:
        codes, seconds = np.concatenate([tokenizer.encode(None, part) for part in name.split("+")]), 0.0
      else:
        wave = self._wave(paths)
        codes, seconds = tokenizer.encode(wave, name), len(wave) / tokenizer.sample_rate
        if tokenizer.feature_width:
          features = tokenizer.frame_features([wave])[0]
      self._remember(key, paths, name, codes, seconds, features)
    return self._audio_cache[key]

  def audio_features(self, paths: tuple[str, ...], name: str) -> np.ndarray:
    """float32 [T, feature_width] of the recordings `audio_codes` reads at `paths`: the audio tokenizer's feature
    track, a row per code frame (tokenizers with `feature_width` > 0)."""
    width = self.audio_tokenizer.feature_width
    if not width:
      raise AudioTokenizerError(f"spec {self.spec.name} reads a feature track, and its audio tokenizer "
                                f"{type(self.audio_tokenizer).__name__} has none")
    if self._requests is not None:  # `tokenize_audio` is listing what the questions ask for
      return np.zeros((1, width), np.float32)
    self.audio_codes(paths, name)
    return self._audio_features[self._key(paths, name)]

  def _key(self, paths: tuple[str, ...], name: str) -> str:
    """What identifies a recording in the caches: its files' contents, or for precomputed codes its name."""
    return "+".join(_file_digest(p) for p in paths) if self.audio_tokenizer.reads_audio else name

  def _wave(self, paths: tuple[str, ...]) -> np.ndarray:
    return np.concatenate([load_audio(p, self.audio_tokenizer.sample_rate, self.audio_counts) for p in paths])

  def _remember(self, key: str, paths: tuple[str, ...], name: str, codes: np.ndarray, seconds: float,
                features: np.ndarray | None = None) -> None:
    if len(codes) == 0:
      self._audio_failures[key] = AudioError(f"{name}: {' + '.join(paths)} gave no audio frames")
      raise self._audio_failures[key]
    if features is not None:
      if features.shape != (len(codes), self.audio_tokenizer.feature_width):
        self._audio_failures[key] = AudioError(
          f"{name}: {' + '.join(paths)} gave {len(codes)} code frames but feature rows of shape {features.shape}")
        raise self._audio_failures[key]
      self._audio_features[key] = features
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
    tracks = (Progress(len(requests), f"{progress} features", unit="utterances", rate_unit="audio s")
              if progress and tokenizer.feature_width else None)
    for start in range(0, len(requests), TOKENIZE_CHUNK):
      loaded = []
      for key, (paths, name) in requests[start:start + TOKENIZE_CHUNK]:
        try:
          loaded.append((key, paths, name, self._wave(paths)))
        except AudioError as e:
          self._audio_failures[key] = e
          for counter in (meter, tracks):
            if counter:
              counter.update(1)
      waves = [wave for *_, wave in loaded]
      codes = tokenizer.encode_batch(waves, [n for _, _, n, _ in loaded], meter)
      features = tokenizer.frame_features(waves, tracks) if tokenizer.feature_width else [None] * len(waves)
      for (key, paths, name, wave), frames, track in zip(loaded, codes, features):
        try:
          self._remember(key, paths, name, frames, len(wave) / tokenizer.sample_rate, track)
        except AudioError:
          pass  # kept in _audio_failures: raised for the question that asks

  def _prefix_codes(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    return self.audio_codes((question.audio_paths[c],), question.uttids[c])

  def _prefix_features(self, question: Question, c: int) -> np.ndarray:
    """The feature track of candidate c's spoken prefix, a row per code frame of `_prefix_codes`."""
    return self.audio_features((question.audio_paths[c],), question.uttids[c])

  def _candidate_codes(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    """The spoken candidate's codes; under the utterance protocol, of the prefix's recording and its heard as one
    (a question without prefix audio, as the official spoken StoryCloze's, holds the whole story in the candidate's
    recording)."""
    spoken = _candidate_name(question, c)
    if self.protocol == "utterance" and question.audio_paths[c]:
      return self.audio_codes((question.audio_paths[c], question.candidate_audio_paths[c]),
                              f"{question.uttids[c]}+{spoken}")
    return self.audio_codes((question.candidate_audio_paths[c],), spoken)

  def _chat_text_prefix(self, question: Question, c: int) -> np.ndarray:
    """An instruct model's prefix for a written one: the user's text turn holding it, then what opens the
    assistant's reply, which the candidate continues."""
    return _joined(self._chat_turn("text"), self.text_ids(question.prefixes[c], special=False), self._chat_reply())

  def _chat_turn(self, kind: str) -> np.ndarray:
    return self.text_ids(self.spec.chat[kind], special=True)

  def _chat_reply(self) -> np.ndarray:
    return self.text_ids(self.spec.chat["reply"], special=False)

  def item(self, prefix: np.ndarray, candidates: tuple[np.ndarray, ...], codes: np.ndarray | None,
           name: str) -> Item | StreamItem:
    """What the packer lays: an Item of ids (a StreamItem for parallel streams)."""
    return Item(prefix, candidates, codes, name=name)

  def scored(self, candidate) -> int:
    """How many tokens (or steps) of a candidate, as `candidate` gives it, are scored."""
    return len(candidate)

  def positions(self, item) -> int:
    """Positions the longest sequence of the item (its prefix and one candidate) reads (`packing.item_positions`)."""
    return item_positions(item)

  def check(self, item: Item | StreamItem, shape: RowShape, share_prefix: bool, overlong: str) -> None:
    """The PackingError the packer would raise for this item (see `check_item`)."""
    check_item(item, shape, share_prefix, overlong)

  def pack(self, items: list, shape: RowShape, share_prefix: bool, overlong: str):
    """(rows, PackReport) of the items, by the format's packer (`packing.pack` for token rows)."""
    return pack(items, shape, share_prefix=share_prefix, overlong=overlong)


class TextEncoder(QuestionEncoder):
  """Text on both sides (t2t) in token rows: the prefix and the candidate by the `tokenization` rule, or, with a
  chat spec, the user's text turn and the candidate as the reply (no separator)."""

  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, None, float]:
    if self.spec.chat is not None:
      return self._chat_text_prefix(question, c), None, 0.0
    return self._text_pair(question, c)[0], None, 0.0

  def candidate(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    if self.spec.chat is not None:
      return self.text_ids(question.candidates[c], special=False), 0.0
    return self._text_pair(question, c)[1], 0.0

  def _text_pair(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray]:
    """T->T's (prefix ids, scored ids). `separate`: each tokenized apart, the candidate with its separator and no
    special tokens. `joint` (S2SBench's reference): `first + separator + last` tokenized as one string, the ids
    past as many as `first` alone makes are scored, so a token that merges across the boundary is scored."""
    first = question.prefixes[c]
    if not first:  # an item alone (a gold file's word or sentence): scored after the document separator, unspaced
      return _document_separator(self.tokenizer, self.spec), self.text_ids(question.candidates[c], special=False)
    last = self.spec.text_separator[self.language(question)] + question.candidates[c]
    prefix = self.text_ids(first, special=True)
    if self.tokenization == "separate":
      return prefix, self.text_ids(last, special=False)
    joint = self.text_ids(first + last, special=True)
    return joint[: len(prefix)], joint[len(prefix):]


class AudioTokenEncoder(QuestionEncoder):
  """Audio in token rows, between the spec's start and end tokens (s2sjax/data/spec.py's templates); a subclass says
  how a recording's codes take token positions (`_lay`). A text candidate follows the audio, so takes no
  separator."""

  def __init__(self, spec: Spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    self.ids = resolve_audio_ids(spec, self.tokenizer)

  @abc.abstractmethod
  def _lay(self, before: np.ndarray, codes: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(ids, codes at their positions or None) of the ids `before`, the recording's `codes`, the ids `after`."""

  def _opening(self, text: str) -> np.ndarray:
    """What a sequence with audio opens with: bos for a unit LM, else `text` with the tokenizer's special tokens,
    then the audio start token."""
    if not self.spec.text_vocabulary:
      return np.asarray([self.spec.bos_id], np.int32)
    start = [self.ids.start] if self.ids.start is not None else []
    return np.concatenate([self.text_ids(text, special=True), start]).astype(np.int32)

  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    instruction = self.spec.speech_instruction[self.language(question)]  # where no chat turn opens the sequence
    if self.modality.prefix == TEXT:  # t2s: the text, then the audio the candidate speaks
      if self.spec.chat is not None:
        return self._chat_text_prefix(question, c), None, 0.0
      return self._opening(instruction + question.prefixes[c]), None, 0.0
    codes, seconds = self._prefix_codes(question, c)
    start, end = ([t] if t is not None else [] for t in (self.ids.start, self.ids.end))
    if self.spec.chat is not None:  # the user's turn holds the audio; what opens the reply follows it
      before, after = _joined(self._chat_turn("speech"), start), _joined(end, self._chat_reply())
    else:  # s2t closes the audio before the text candidate; s2s's candidate continues it
      before, after = self._opening(instruction), np.asarray(end if self.modality.candidate == TEXT else [], np.int32)
    ids, laid = self._lay(before, codes, after)
    return ids, laid, seconds

  def candidate(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    return self.text_ids(question.candidates[c], special=False), 0.0


class UnitEncoder(AudioTokenEncoder):
  """extended_vocab: each audio frame's unit is a token id (`AudioIds.unit_ids`); a unit LM (no text vocabulary)
  opens every sequence with its bos. Spoken candidates are scored on their units, under either protocol.

  With K codebooks a frame lays K tokens, codebook after codebook, and a spoken candidate is scored on every K-th of
  its tokens from the first: its first codebook's, and under the utterance protocol the closing token. That is
  Llama-Mimi's authors' rule (llm-jp/Llama-Mimi 95dd630 eval/sStoryCloze.py:36-38: the labels kept at
  `2::num_quantizers`, from the first unit after bos and <audio>); the other tokens are laid, not scored. The
  spec's option `max_audio_seconds` cuts each recording before it is tokenized (their `audio_array_to_text`,
  torchtitan/datasets/hf_datasets.py:30-34 at 41bf994: 20 s)."""

  def __init__(self, spec: Spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    # each codebook's token ids, in the order `unit_ids` lists them
    self._tables = np.split(np.asarray(self.ids.unit_ids, np.int32), np.cumsum(spec.codebook_sizes)[:-1])

  def units(self, codes: np.ndarray) -> np.ndarray:
    """Each frame's units as token ids, frame after frame (K tokens a frame with K codebooks)."""
    return np.stack([table[codes[:, q]] for q, table in enumerate(self._tables)], axis=1).reshape(-1)

  def _wave(self, paths: tuple[str, ...]) -> np.ndarray:
    wave = super()._wave(paths)
    seconds = (self.spec.options or {}).get("max_audio_seconds")
    return wave if seconds is None else wave[: int(seconds * self.audio_tokenizer.sample_rate)]

  def _scored_every(self) -> int:
    """A candidate is scored on every how many of its tokens: K for spoken candidates of K codebooks, else 1."""
    return len(self._tables) if self.modality.candidate == SPEECH else 1

  def scored(self, candidate: np.ndarray) -> int:
    return -(-len(candidate) // self._scored_every())

  def pack(self, items: list, shape: RowShape, share_prefix: bool, overlong: str):
    """`pack`, then each candidate's targets kept at every `_scored_every`-th token."""
    rows, report = super().pack(items, shape, share_prefix, overlong)
    every = self._scored_every()
    return (rows if every == 1 else _targets_every(rows, every)), report

  def _lay(self, before: np.ndarray, codes: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, None]:
    return _joined(before, self.units(codes), after), None

  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    if self.protocol == "utterance":  # the recording is all candidate: only what opens a sequence precedes it
      return self._utterance_opening(), None, 0.0
    return super().prefix(question, c)

  def _utterance_opening(self) -> np.ndarray:
    opening = self._opening("")
    if len(opening):
      return opening
    return _document_separator(self.tokenizer, self.spec)  # without a start token or bos

  def candidate(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    if self.modality.candidate == TEXT:
      return super().candidate(question, c)
    codes, seconds = self._candidate_codes(question, c)
    if self.protocol != "utterance":
      return self.units(codes), seconds
    eos = self.spec.bos_id if not self.spec.text_vocabulary else self.ids.end  # the recording closes
    return _joined(self.units(codes), [eos] if eos is not None else []), seconds


class CodebookEncoder(AudioTokenEncoder):
  """codebook_tables: each frame's K codes ride on the placeholder id at its position (the model sums K tables
  there). Only S->T can be asked: the model's text head does not predict audio (`Spec.check_modality`)."""

  def _lay(self, before: np.ndarray, codes: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blank = lambda n: np.full((n, codes.shape[1]), -1, np.int32)
    ids = _joined(before, np.full(len(codes), self.ids.placeholder, np.int32), after)
    return ids, np.concatenate([blank(len(before)), codes, blank(len(after))])


class StreamEncoder(QuestionEncoder):
  """Stream rows: each side on streams of its own, by the protocol of the architecture the spec names
  (`Spec.stream_protocol`): the text ids on the text stream, or the audio codes on the codebook streams,
  one step each. The rows are packed by `pack_streams`, which applies the spec's delays, and each scored token
  carries its stream's weight."""

  auto_length = False  # its stream items are delayed only when packed, so their lengths are not known before: give it

  def __init__(self, spec: Spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    self.layout = StreamLayout(spec.stream_delays, spec.stream_initial_ids, predicted=spec.num_streams)
    self.stream_protocol = spec.stream_protocol()
    self.weights = self.stream_protocol.weights(self.modality.name, len(spec.codebook_sizes))  # per stream

  def _streams(self, text: np.ndarray | None = None, audio: np.ndarray | None = None) -> np.ndarray:
    return self.stream_protocol.lay(len(self.spec.codebook_sizes), text, audio)

  def prefix(self, question: Question, c: int) -> tuple[np.ndarray, None, float]:
    if self.protocol == "utterance":  # the recording is all candidate: the initial step alone precedes it
      return self._streams(audio=np.zeros((0, len(self.spec.codebook_sizes)), np.int32)), None, 0.0
    if self.modality.prefix == TEXT:
      return self._streams(text=self.text_ids(question.prefixes[c], special=True)), None, 0.0
    codes, seconds = self._prefix_codes(question, c)
    return self._streams(audio=codes), None, seconds

  def candidate(self, question: Question, c: int) -> tuple[np.ndarray, float]:
    if self.modality.candidate == TEXT:
      separator = self.spec.text_separator[self.language(question)] if self.modality.prefix == TEXT else ""
      return self._streams(text=self.text_ids(separator + question.candidates[c], special=False)), 0.0
    codes, seconds = self._candidate_codes(question, c)
    return self._streams(audio=codes), seconds

  def item(self, prefix: np.ndarray, candidates: tuple[np.ndarray, ...], codes: np.ndarray | None,
           name: str) -> StreamItem:
    """A StreamItem whose candidates score this protocol's streams."""
    return StreamItem(prefix, candidates, scored_streams(self.weights), name=name)

  def positions(self, item: StreamItem) -> int:
    """The prefix's steps after the model's initial one, then the longest candidate's but its last."""
    return len(item.prefix) + max(len(candidate) for candidate in item.candidates)

  def check(self, item: StreamItem, shape: RowShape, share_prefix: bool, overlong: str) -> None:
    if overlong != "error":  # not a PackingError: no question could be built, so none is skipped for it
      raise VariantError(f"spec {self.spec.name} reads parallel streams, whose prefix steps cannot be dropped "
                         f"(overlong={overlong}): a delayed stream's steps hold tokens of several times")
    check_stream_item(item, shape, self.layout, share_prefix)

  def pack(self, items: list, shape: RowShape, share_prefix: bool, overlong: str):
    """`pack_streams`, then the scored tokens weighted by the protocol."""
    rows, report = pack_streams(items, shape, self.layout, share_prefix)
    return weigh_streams(rows, self.weights), report


def _targets_every(rows: dict[str, np.ndarray], every: int) -> dict[str, np.ndarray]:
  """Token rows whose target tables keep only each candidate's targets 0, every, 2 x every, ... (the packer lays a
  candidate's targets together, in order): the rest of its tokens stay laid as context. Each row's kept targets
  move to the front of its table, their positions unchanged."""
  per_target = [f for f in TOKEN_ROWS.fields if f.axis == "M"]
  slots = rows["target_slot"]
  out = {f.name: np.full_like(rows[f.name], f.fill) for f in per_target}
  for r, row in enumerate(slots):
    rank = np.zeros(len(row), np.int64)
    for slot in np.unique(row[row >= 0]):
      at = np.flatnonzero(row == slot)
      rank[at] = np.arange(len(at))
    kept = np.flatnonzero((row >= 0) & (rank % every == 0))
    for f in per_target:
      out[f.name][r, : len(kept)] = rows[f.name][r, kept]
  return {**rows, **out}


@dataclasses.dataclass(frozen=True)
class FormatEncoders:
  """The encoders that lay an input format's rows (s2sjax/data/formats), registered under the format's name:
  `encoder` lays every modality asked of it ("module:Class", a `QuestionEncoder` subclass whose `prefix`,
  `candidate`, `item`, `check` and `pack` lay a question and pack the items with the format's packer, imported when
  a build asks), `text_encoder`, when given, the modalities without speech instead."""

  input_format: str
  encoder: str
  text_encoder: str | None = None


ENCODERS: Registry[FormatEncoders] = Registry("input format encoder", name_of=lambda e: e.input_format)
register = ENCODERS.register
TEXT_ENCODER = "tasks.encoders:TextEncoder"
register(FormatEncoders("none", TEXT_ENCODER))
register(FormatEncoders("extended_vocab", "tasks.encoders:UnitEncoder", TEXT_ENCODER))
register(FormatEncoders("codebook_tables", "tasks.encoders:CodebookEncoder", TEXT_ENCODER))
register(FormatEncoders("parallel_streams", "tasks.encoders:StreamEncoder"))
register(FormatEncoders("kimi_audio", "tasks.kimi_encoder:KimiEncoder"))
register(FormatEncoders("mimo_audio", "tasks.mimo_encoder:MimoEncoder"))
register(FormatEncoders("step_audio2", "tasks.step_audio2_encoder:StepAudio2Encoder"))


def encoder_class(spec: Spec, modality: str) -> type[QuestionEncoder]:
  """Which encoder lays `modality` for `spec`: the one registered for its input format. A text-only spec asked for
  audio gets the text encoder, which refuses it by name (`Spec.check_modality`)."""
  encoders = ENCODERS.get(spec.audio_mode)
  speaks = modalities.get(modality).speaks
  return load_object(encoders.text_encoder if encoders.text_encoder and not speaks else encoders.encoder)


def _document_separator(tokenizer, spec: Spec) -> np.ndarray:
  """What opens a sequence with no context, as lm-eval's HFLM.prefix_token_id opens an empty context: bos, else eos
  (Qwen's <|endoftext|>)."""
  separator = next((t for t in (tokenizer.bos_token_id, tokenizer.eos_token_id) if t is not None), None)
  if separator is None:
    raise SpecError(f"spec {spec.name}: a recording or item scored alone needs a token to open it with (the spec's "
                    "start_token, or the tokenizer's bos or eos), and there is none")
  return np.asarray([separator], np.int32)


def _joined(*parts) -> np.ndarray:
  """Token ids of the parts (arrays or lists of ids), one after another."""
  return np.concatenate(parts).astype(np.int32)


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


class LaidEncoder(QuestionEncoder):
  """An own row format's encoder (Kimi-Audio's, MiMo-Audio's, Step-Audio 2's): a side is a dict of the format's
  fields, a candidate's with its per-target ones (the format's `own_targets`, `target_ids` among them); every
  candidate lays each of its positions but the last, whose token (or patch) is only predicted; items are packed
  whole (`packing.pack_laid`). Subclasses set `laid_as` (what a prefix is laid as, for the message refusing to cut
  one) and `widths`."""

  laid_as: str

  def widths(self) -> dict[str, int]:
    """The format's named widths in these rows."""
    return {}

  def scored(self, candidate: dict) -> int:
    return len(candidate["target_ids"])

  def item(self, prefix: dict, candidates: tuple[dict, ...], codes: None, name: str) -> LaidItem:
    targets = {f.name for f in self.spec.input_format.row_format.own_targets}
    laid = lambda side: ({k: v[:-1] for k, v in side.items() if k not in targets},
                         {k: v for k, v in side.items() if k in targets})
    return LaidItem(prefix, tuple(laid(side) for side in candidates), share=True, name=name)

  def check(self, item: LaidItem, shape: RowShape, share_prefix: bool, overlong: str) -> None:
    if overlong != "error":  # not a PackingError: no question could be built, so none is skipped for it
      raise VariantError(f"spec {self.spec.name} lays {self.laid_as}, which cannot lose their first ids "
                         f"(overlong={overlong}): give a longer --row_length")
    fit_laid(0, item, shape, share_prefix)

  def pack(self, items: list, shape: RowShape, share_prefix: bool, overlong: str):
    laid = [dataclasses.replace(item, share=fit_laid(i, item, shape, share_prefix)) for i, item in enumerate(items)]
    row_format = self.spec.input_format.row_format
    return pack_laid(laid, shape, share_prefix, lambda count: row_format.empty(count, shape, self.widths()))
