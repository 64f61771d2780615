"""lm-eval requests that carry audio, laid in token rows as the spec lays a recording: the s2sjax backend's part
that `loglikelihood` hands a request with lm-eval's multimodal argument.

lm-eval's way, which this follows: a task whose YAML sets `doc_to_audio` is multimodal (lm_eval/api/task.py:662-664
at 0.4.13), and each of a document's requests carries, after its context and continuation, a dict whose `audio` is
the document's recordings (api/task.py:1418-1431); a request's text marks where a recording sits with `<audio>`
(lm_eval/models/hf_audiolm.py:18, DEFAULT_AUDIO_PLACEHOLDERS), filled in order (models/utils.py:595-627,
replace_placeholders). lm-eval's own audio model scores no log-likelihood (hf_audiolm.py:296-301 raises
NotImplementedError). A recording is HF datasets' Audio value, decoded (`array`, `sampling_rate`: lm-eval's
common_voice task) or not (`path`: s2sjax.commands.lm_eval_documents).

All of a multiple-choice document's requests carry the same recordings, so they are numbered over the document:
its context's placeholders take the first ones, then each choice's continuation its own, in choice order (the
requests' `idx`): a spoken prefix is `<audio>` in the context, a spoken candidate `<audio>` as the choice.

A recording is tokenized by the spec's audio tokenizer as the build tokenizes a file (`QuestionEncoder.audio_codes`,
tasks/encoders.py) and laid as the build lays one: its units as token ids (extended_vocab) or the placeholder id
carrying its codes (codebook_tables), the spec's start token before it where text (or the sequence's opening)
precedes it and its end token after it where text follows (S2SBench's templates, s2sjax/data/spec.py); a token at
the context's end is the context's, so only the continuation's own text tokens and units are scored; under the
utterance protocol a recording that ends the continuation is closed by the end token, scored (SlamKit's
`<bos> units <eos>`). The text is tokenized as the backend tokenizes any request: the context's opening with the
tokenizer's special tokens, the rest without, and text meeting text across the context's end split by lm-eval's
`_encode_pair` rule. The prompt (S2SBench's instruction, a separator) is the task YAML's, as for any lm-eval task.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import tempfile

import numpy as np

from s2sjax.data import modalities
from s2sjax.data.modalities import SPEECH
from s2sjax.data.spec import Spec
from s2sjax.runtime.errors import UserError
from tasks import audio
from tasks.encoders import QuestionEncoder

PLACEHOLDER = "<audio>"  # lm-eval's (hf_audiolm.py:18)
TOKEN_ROW_FORMATS = ("extended_vocab", "codebook_tables")  # the rows the backend's scorer reads


class AudioRequestError(UserError, ValueError):
  """A request's audio the backend cannot lay: names the task, document and choice."""


def named(request) -> str:
  """How a refusal names a request."""
  return f"task {request.task_name} document {request.doc_id} choice {request.idx}"


@dataclasses.dataclass(frozen=True)
class Laid:
  """A request as the scorer takes it: context and continuation ids, and the context's codes ([len(context), K],
  -1 where no recording is) for codebook tables, else None."""

  context: list[int]
  continuation: list[int]
  codes: np.ndarray | None


def recordings(requests: list) -> list[tuple[list, list]]:
  """Per request, (its context's recordings, its continuation's): the document's `audio` dealt to its placeholders
  (the module's docstring: the context's first, then each choice's in `idx` order). A document whose placeholders
  and recordings differ in number is refused, naming it."""
  documents = collections.defaultdict(list)
  for index, request in enumerate(requests):
    documents[request.task_name, request.doc_id].append(index)
  dealt: list = [None] * len(requests)
  for members in documents.values():
    members.sort(key=lambda i: requests[i].idx)
    first = requests[members[0]]
    heard = first.args[2].get("audio") if isinstance(first.args[2], dict) else None
    heard = [heard] if isinstance(heard, dict) else list(heard or [])
    in_context = first.args[0].count(PLACEHOLDER)
    wanted = in_context + sum(requests[i].args[1].count(PLACEHOLDER) for i in members)
    if wanted != len(heard) or any(requests[i].args[0].count(PLACEHOLDER) != in_context for i in members):
      raise AudioRequestError(
        f"{named(first)}: {len(heard)} recordings (doc_to_audio) for {wanted} {PLACEHOLDER} placeholders in its "
        f"context and choices; each placeholder takes one, the context's first, then each choice's in order")
    taken = in_context
    for i in members:
      count = requests[i].args[1].count(PLACEHOLDER)
      dealt[i] = (heard[:in_context], heard[taken:taken + count])
      taken += count
  return dealt


class AudioLayer:
  """Lays requests with audio for one spec and text tokenizer (`lay`); the audio tokenizer is made on first use."""

  def __init__(self, spec: Spec, lm, audio_tokenizer_dir: str | None, protocol: str):
    """`lm`: the backend, whose `tok_encode(text, add_special_tokens)` and `prefix_token_id` tokenize the text."""
    self.spec, self.lm, self.audio_tokenizer_dir, self.protocol = spec, lm, audio_tokenizer_dir, protocol
    self._encoder: QuestionEncoder | None = None
    self._decoded = tempfile.TemporaryDirectory(prefix="s2sjax-lm-eval-audio-")  # decoded recordings as wavs

  def refusal(self) -> str | None:
    """Why this spec's recordings cannot be laid in the backend's rows, or None."""
    if not self.spec.has_speech:
      return f"spec {self.spec.name} is text-only (audio_mode {self.spec.audio_mode})"
    if self.spec.audio_mode not in TOKEN_ROW_FORMATS:
      return (f"spec {self.spec.name} lays audio as {self.spec.audio_mode}; the lm-eval backend scores token rows "
              f"({', '.join(TOKEN_ROW_FORMATS)})")
    return None

  @property
  def encoder(self) -> QuestionEncoder:
    """The build's encoder for this spec's spoken prefixes: its audio tokenizer, codes and special ids."""
    if self._encoder is None:
      tokenizer = audio.from_spec(self.spec.audio_tokenizer, self.spec.codebook_sizes, self.audio_tokenizer_dir)
      self._encoder = QuestionEncoder(self.spec, "s2t", self.lm.tokenizer, tokenizer)
    return self._encoder

  def lay(self, request, heard: tuple[list, list]) -> Laid:
    """One request's ids (and codes) from its text and its recordings (`recordings`)."""
    sides = [_parts(text, found) for text, found in zip(request.args[:2], heard)]
    spoken = ["s" if any(map(_is_audio, side)) else "t" for side in sides]
    modality = modalities.get(f"{spoken[0]}2{spoken[1]}")
    try:
      self.spec.check_modality(modality)
    except UserError as e:
      raise AudioRequestError(f"{named(request)}: {e}") from None
    if modality.candidate == SPEECH and len(self.spec.codebook_sizes) > 1:
      raise AudioRequestError(f"{named(request)}: spec {self.spec.name} lays {len(self.spec.codebook_sizes)} tokens a "
                              "frame and scores a spoken candidate on its first codebook's; the lm-eval backend "
                              "scores every token of a continuation")
    parts = [(part, side) for side, found in enumerate(sides) for part in found]  # side 0: context, 1: continuation
    ids, codes = ([], []), ([], [])

    def add(side: int, new_ids, new_codes=None) -> None:
      ids[side].extend(int(t) for t in new_ids)
      codes[side].append(new_codes if new_codes is not None else np.full((len(new_ids), self._width), -1, np.int32))

    if not parts or _is_audio(parts[0][0]):
      add(0, self.lm.tok_encode("", add_special_tokens=None))  # the tokenizer's opening special tokens
    start, end = self.encoder.ids.start, self.encoder.ids.end
    for at, (part, side) in enumerate(parts):
      before = parts[at - 1] if at else (None, 0)  # what precedes the sequence is the context's
      after = parts[at + 1] if at + 1 < len(parts) else (None, side)
      if not _is_audio(part):
        if side == 1 and before[1] == 0 and isinstance(before[0], str):
          continue  # laid with the context's text before it
        if side == 0 and after[1] == 1 and isinstance(after[0], str):  # text meets text at the context's end
          first, rest = self._text_pair(part, after[0], opens=at == 0)
          add(0, first)
          add(1, rest)
        else:
          add(side, self.lm.tok_encode(part, add_special_tokens=None if at == 0 else False))
        continue
      if start is not None and not _is_audio(before[0]):
        add(before[1], [start])  # the side of what it follows: at the context's end, the context's
      add(side, *self._recording(part, request))
      closes = after[0] is None and side == 1 and self.protocol == "utterance"
      if end is not None and (isinstance(after[0], str) or closes):
        add(side, [end])
    context = ids[0] or [self.lm.prefix_token_id]  # lm-eval's empty context
    laid_codes = None
    if self._width:
      laid_codes = np.concatenate(codes[0]) if ids[0] else np.full((1, self._width), -1, np.int32)
    return Laid(context, ids[1], laid_codes)

  @property
  def _width(self) -> int:
    """Codes a position carries: the codebooks of codebook tables, none for units as ids."""
    return len(self.spec.codebook_sizes) if self.spec.audio_mode == "codebook_tables" else 0

  def _text_pair(self, before: str, after: str, opens: bool) -> tuple[list[int], list[int]]:
    """Context text meeting continuation text, split as lm-eval's `_encode_pair` splits them
    (lm_eval/api/model.py:393-431): the context's trailing whitespace moves to the continuation, the whole is
    tokenized and the continuation is what lies past the context's own tokens; special tokens only where the text
    opens the sequence."""
    spaces = len(before) - len(before.rstrip())
    if spaces:
      before, after = before[:-spaces], before[-spaces:] + after
    special = None if opens else False
    first = self.lm.tok_encode(before, add_special_tokens=special) if before else []
    return first, self.lm.tok_encode(before + after, add_special_tokens=special)[len(first):]

  def _recording(self, recording, request) -> tuple[list[int], np.ndarray | None]:
    """A recording's token ids, and its codes for codebook tables (units as ids carry none)."""
    path = self._path(recording, request)
    try:
      codes, _ = self.encoder.audio_codes((path,), os.path.splitext(os.path.basename(path))[0])
    except UserError as e:
      raise AudioRequestError(f"{named(request)}: {e}") from None
    if self._width:
      return [self.encoder.ids.placeholder] * len(codes), codes.astype(np.int32)
    return self.encoder.units(codes).tolist(), None

  def _path(self, recording, request) -> str:
    """The file a recording is read from: its `path`, or a decoded one's samples written as a float wav (read back
    as the build reads a file: mixed down, resampled)."""
    if isinstance(recording, dict) and recording.get("path") and recording.get("array") is None:
      return str(recording["path"])
    if isinstance(recording, dict) and recording.get("array") is not None and recording.get("sampling_rate"):
      import soundfile

      wave = np.asarray(recording["array"], np.float32)
      path = os.path.join(self._decoded.name, hashlib.sha256(wave.tobytes()).hexdigest()[:24] + ".wav")
      if not os.path.exists(path):
        soundfile.write(path, wave.T if wave.ndim > 1 else wave, int(recording["sampling_rate"]), subtype="FLOAT")
      return path
    keys = sorted(recording) if isinstance(recording, dict) else type(recording).__name__
    raise AudioRequestError(f"{named(request)}: a recording is HF datasets' Audio value, {{'path': wav}} or "
                            f"{{'array': samples, 'sampling_rate': hz}}, not {keys}")


def _is_audio(part) -> bool:
  """Whether a part (`_parts`; None: none) is a recording."""
  return part is not None and not isinstance(part, str)


def _parts(text: str, found: list) -> list:
  """`text` as its non-empty text pieces and, at each placeholder, its recording, in order."""
  pieces = text.split(PLACEHOLDER)
  parts = [pieces[0]] if pieces[0] else []
  for recording, piece in zip(found, pieces[1:]):
    parts += [recording] + ([piece] if piece else [])
  return parts
