"""S2SBench's questions in Step-Audio 2's own prompts (the `step_audio2` input format,
s2sjax/data/formats/step_audio2.py), laid by tasks/step_audio2_prompt.py in the template the spec's `template` option
names (`base`: Step-Audio-2-mini-Base's plain pieces; `chat`: Step-Audio-2-mini's turns):

  S->T  S2SBench's instruction (the spec's `speech_instruction`; none when it is empty), then the prefix's audio (an
        <audio_start> block per 25 s chunk, its placeholders overwritten by the adaptor rows of the `step_audio2`
        audio tokenizer's feature track); chat: both in the user's turn, then the assistant's turn opened
  T->T  the prefix's text; chat: in the user's turn, then the assistant's turn opened

  T->S, S->S  the same prefix, then the reply opened with <tts_start> (base: a piece after the prefix; chat: the
        assistant's turn, no <|EOT|>), as the wrapper's speech-out requests are laid

then the candidate, scored over the full vocabulary: its text tokenised alone, or its CosyVoice2 s3tokenizer codes
(the `step_audio2` tokenizer's `speech_out`: precomputed) as ids 151696 + code. Its last token is a target only.
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.modalities import SPEECH
from s2sjax.data.spec import SpecError, resolve_audio_ids
from s2sjax.data.builds import VariantError
from s2sjax.data.formats.step_audio2 import AUDIO_CODES, AUDIO_OFFSET
from tasks.audio.base import AudioError
from tasks.encoders import LaidEncoder
from tasks.release import Question
from tasks.step_audio2_prompt import (TOKEN_NAMES, TTS_START, Audio, AudioIds, Laid, base_request, chat_request,
                                      lay)


def audio_ids(spec, tokenizer) -> AudioIds:
  """The audio markers' ids, looked up by name in the release tokenizer; a token it lacks is named."""
  vocab = tokenizer.get_vocab()
  missing = [token for token in TOKEN_NAMES.values() if token not in vocab]
  if missing:
    raise SpecError(f"spec {spec.name}: Step-Audio 2's layout needs the tokens {', '.join(missing)}, which the text "
                    "tokenizer lacks (give the release's own, --tokenizer_dir=RELEASE)")
  return AudioIds.from_tokens(vocab.__getitem__)


def chunk_rows(openings: np.ndarray) -> tuple[int, ...]:
  """Rows per 25 s chunk from the `step_audio2` tokenizer's codes [N, 1] (1 where a chunk after the first opens)."""
  starts = [0, *np.flatnonzero(openings[:, 0] > 0).tolist(), len(openings)]
  return tuple(b - a for a, b in zip(starts[:-1], starts[1:]))


def speech_ids(codes: np.ndarray, name: str) -> np.ndarray:
  """A spoken candidate's s3tokenizer codes [T, 1] as the ids the model speaks them with (151696 + code,
  stepaudio2.py:56); a code outside 0..6560 is refused by name."""
  codes = np.asarray(codes)[:, 0]
  bad = np.flatnonzero((codes < 0) | (codes >= AUDIO_CODES - 1))
  if len(bad):
    raise AudioError(f"{name}: s3tokenizer code {codes[bad[0]]} at frame {bad[0]} is outside 0..{AUDIO_CODES - 2}")
  return AUDIO_OFFSET + codes.astype(np.int64)


class StepAudio2Encoder(LaidEncoder):
  """A question's prefix and candidates as Step-Audio 2 rows: per position the id, the feature track (width 0 for a
  written prefix) and the patch mask; per target the candidate's text id."""

  laid_as = "Step-Audio 2's prompts"

  def __init__(self, spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    self.audio = audio_ids(spec, self.tokenizer)
    self.template = spec.options["template"]
    self.width = spec.input_format.widths(spec, self.modality)["features"]
    if self.width and self.audio_tokenizer.feature_width != self.width:
      raise SpecError(f"spec {spec.name} lays adaptor rows of width {self.width}; its audio tokenizer's track is "
                      f"{self.audio_tokenizer.feature_width} wide")
    self.ids = resolve_audio_ids(spec, self.tokenizer)  # none of the spec's: the markers are the tokenizer's
    if self.protocol != "s2sbench":
      raise VariantError(f"spec {spec.name} lays Step-Audio 2's requests, a prefix then its candidate: the "
                         f"{self.protocol} protocol does not apply")

  def _tokenize(self, text: str) -> np.ndarray:
    return self.text_ids(text, special=False)

  def _request(self, prefix: list) -> Laid:
    """The prompt around the prefix's pieces; a spoken candidate's reply opens with <tts_start>, as the wrapper's
    speech-out requests do."""
    opening = TTS_START if self.modality.candidate == SPEECH else None
    if self.template == "base":
      pieces = base_request(prefix + ([opening] if opening else []))
    else:
      pieces = chat_request(prefix, reply_opening=opening)
    return lay(pieces, self._tokenize, self.audio)

  def _fields(self, laid: Laid, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    track = np.zeros((len(laid), self.width), np.float32)
    if rows is not None:
      track[laid.continuous] = rows
    return {"ids": laid.ids.astype(np.int32), "features": track, "continuous": laid.continuous.astype(np.int32)}

  def prefix(self, question: Question, c: int) -> tuple[dict, None, float]:
    if self.modality.prefix != SPEECH:
      return self._fields(self._request([question.prefixes[c]])), None, 0.0
    openings, seconds = self._prefix_codes(question, c)
    instruction = self.spec.speech_instruction[self.language(question)]
    laid = self._request(([instruction] if instruction else []) + [Audio(chunk_rows(openings))])
    return self._fields(laid, self._prefix_features(question, c)), None, seconds

  def candidate(self, question: Question, c: int) -> tuple[dict, float]:
    seconds = 0.0
    if self.modality.candidate == SPEECH:
      codes, seconds = self._candidate_codes(question, c)
      ids = speech_ids(codes, f"question {question.id}, candidate {c}")
    else:
      ids = self._tokenize(question.candidates[c])
    laid = Laid(np.asarray(ids, np.int64), np.zeros(len(ids), bool))
    return dict(self._fields(laid), target_ids=np.asarray(ids, np.int32)), seconds

  def widths(self) -> dict[str, int]:
    return {"features": self.width}
