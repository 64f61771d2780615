"""S2SBench's questions in Kimi-Audio's own message layout (the `kimi_audio` input format,
s2sjax/data/formats/kimi_audio.py): the user's turn holds the prefix, the assistant's text reply is the scored candidate
(tasks/kimi_prompt.py lays the ids as upstream's prompt manager does).

  S->T  a text message of S2SBench's instruction (the spec's `speech_instruction`; none when it is empty), then the
        audio message of the prefix: GLM-4-Voice codes on the audio stream and their Whisper features (the audio
        tokenizer's feature track, `kimi_audio`), then the assistant's start and the candidate's text
  T->T  a text message of the prefix, then the assistant's start and the candidate's text (no separator: the
        candidate opens the reply)

Each candidate's tokens are scored by the text head; its last token is a target only (as every format lays it).
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.modalities import SPEECH
from s2sjax.data.spec import SpecError, resolve_audio_ids
from tasks.encoders import LaidEncoder
from tasks.kimi_prompt import (TOKEN_NAMES, KimiSpecialIds, KimiStreams, Message, lay_features, lay_prompt,
                               lay_text_continuation)
from tasks.release import Question


def special_ids(spec, tokenizer) -> KimiSpecialIds:
  """The layout's ids looked up by name as upstream looks them up (special_tokens.py:25-31): in the tokenizer's
  `special_tokens` table where it has one (the release's tiktoken tokenizer), else in its vocabulary; a token it
  lacks is named."""
  vocab = tokenizer.special_tokens if hasattr(tokenizer, "special_tokens") else tokenizer.get_vocab()
  missing = [token for token in TOKEN_NAMES.values() if token not in vocab]
  if missing:
    raise SpecError(f"spec {spec.name}: Kimi-Audio's layout needs the tokens {', '.join(missing)}, which the text "
                    "tokenizer lacks (give the release's own, --tokenizer_dir=RELEASE)")
  return KimiSpecialIds.from_tokens(vocab.__getitem__)


class KimiEncoder(LaidEncoder):
  """A question's prefix and candidates as Kimi-Audio rows: per position the two streams, the feature track (width
  0 for a written prefix) and the continuous mask; per target the candidate's text id."""

  laid_as = "Kimi-Audio's messages"

  def __init__(self, spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    self.special = special_ids(spec, self.tokenizer)
    self.offset, self.num_codes = spec.options["token_offset"], spec.codebook_sizes[0]
    self.width = spec.input_format.widths(spec, self.modality)["features"]
    if self.width and self.audio_tokenizer.feature_width != self.width:
      raise SpecError(f"spec {spec.name} lays features of width {self.width}; its audio tokenizer's track is "
                      f"{self.audio_tokenizer.feature_width} wide")
    self.ids = resolve_audio_ids(spec, self.tokenizer)  # none of the spec's: Kimi's markers are the tokenizer's

  def _fields(self, streams: KimiStreams, features: np.ndarray | None = None) -> dict[str, np.ndarray]:
    if features is None:
      track = np.zeros((len(streams), self.width), np.float32)
    else:
      track = lay_features(streams, features)
    return {"audio_ids": streams.audio.astype(np.int32), "text_ids": streams.text.astype(np.int32),
            "features": track, "continuous": streams.continuous.astype(np.int32)}

  def prefix(self, question: Question, c: int) -> tuple[dict, None, float]:
    if self.modality.prefix != SPEECH:
      text = self.text_ids(question.prefixes[c], special=False)
      streams = lay_prompt([Message("user", text=text)], self.special, self.offset, self.num_codes)
      return self._fields(streams), None, 0.0
    codes, seconds = self._prefix_codes(question, c)
    instruction = self.spec.speech_instruction[self.language(question)]
    messages = [Message("user", text=self.text_ids(instruction, special=False))] if instruction else []
    messages.append(Message("user", codes=codes[:, 0]))
    streams = lay_prompt(messages, self.special, self.offset, self.num_codes)
    return self._fields(streams, self._prefix_features(question, c)), None, seconds

  def candidate(self, question: Question, c: int) -> tuple[dict, float]:
    text = self.text_ids(question.candidates[c], special=False)
    return dict(self._fields(lay_text_continuation(text, self.special)), target_ids=text), 0.0

  def widths(self) -> dict[str, int]:
    return {"features": self.width}
