"""S2SBench's questions as MiMo-Audio requests (the `mimo_audio` input format, s2sjax/data/formats/mimo_audio.py),
laid in patches by tasks/mimo_prompt.py as upstream's `get_input_ids` lays its segments (codes: the audio
tokenizer's first K channels):

  S->T  a text segment of S2SBench's instruction (the spec's `speech_instruction`; none when it is empty), the
        audio segment of the prefix between <|sosp|> and <|eosp|>, then the candidate's text segment
  T->T  a text segment of the prefix, then the candidate's
  S->S  a <|sosp|> text segment and the prefix's audio segment unwrapped, then the candidate's audio segment
        unwrapped: one stretch of speech, as upstream's speech continuation (the oracle's `cont` request)
  T->S  a text segment of the prefix and a <|sosp|> one, then the candidate's audio segment unwrapped

A written candidate's tokens are scored by the text head, a spoken candidate's patches by the patch decoder, each
read from the global state after the patch before it; its last token or patch is a target only (as every format
lays it).
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.builds import VariantError
from s2sjax.data.modalities import SPEECH
from s2sjax.data.spec import SpecError
from tasks.encoders import LaidEncoder
from tasks.mimo_prompt import TOKEN_NAMES, MimoLayout, join
from tasks.release import Question


def layout(spec, tokenizer) -> MimoLayout:
  """The layout's special ids looked up by name in the text tokenizer's vocabulary, as upstream resolves them
  (mimo_audio.py:69-76); a token it lacks is named. Each channel's empty code is its codebook size."""
  vocab = tokenizer.get_vocab()
  missing = [token for token in TOKEN_NAMES.values() if token not in vocab]
  if missing:
    raise SpecError(f"spec {spec.name}: MiMo-Audio's layout needs the tokens {', '.join(missing)}, which the text "
                    "tokenizer lacks (give the release's own, --tokenizer_dir=RELEASE)")
  return MimoLayout.from_tokens(vocab.__getitem__, spec.codebook_sizes, spec.options["group_size"])


class MimoEncoder(LaidEncoder):
  """A question's prefix and candidates as MiMo-Audio rows: per position (patch) the text id and the patch's codes
  [group_size * K]; per target a written candidate's text id, or a spoken candidate's patch."""

  laid_as = "MiMo-Audio's patches"

  def __init__(self, spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    self.patches = layout(spec, self.tokenizer)

  def _fields(self, laid: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    text, codes = laid
    return {"text_ids": text.astype(np.int32), "patch_codes": codes.reshape(len(codes), -1).astype(np.int32)}

  def prefix(self, question: Question, c: int) -> tuple[dict, None, float]:
    if self.protocol != "s2sbench":
      raise VariantError(f"spec {self.spec.name} lays MiMo-Audio's requests by the s2sbench protocol only, not "
                         f"{self.protocol}")
    segments, seconds = [], 0.0
    if self.modality.prefix == SPEECH:
      codes, seconds = self._prefix_codes(question, c)
      if self.modality.candidate == SPEECH:
        segments += [self.patches.text([self.patches.sosp]), self.patches.audio(codes, wrapped=False)]
      else:
        instruction = self.spec.speech_instruction[self.language(question)]
        segments += [self.patches.text(self.text_ids(instruction, special=False))] if instruction else []
        segments.append(self.patches.audio(codes))
    else:
      segments.append(self.patches.text(self.text_ids(question.prefixes[c], special=False)))
      if self.modality.candidate == SPEECH:
        segments.append(self.patches.text([self.patches.sosp]))
    return self._fields(join(*segments)), None, seconds

  def candidate(self, question: Question, c: int) -> tuple[dict, float]:
    if self.modality.candidate == SPEECH:
      codes, seconds = self._candidate_codes(question, c)
      fields = self._fields(self.patches.audio(codes, wrapped=False))
      return dict(fields, target_ids=np.full(len(fields["text_ids"]), -1, np.int32),
                  target_codes=fields["patch_codes"]), seconds
    text = self.text_ids(question.candidates[c], special=False)
    fields = self._fields(self.patches.text(text))
    return dict(fields, target_ids=text, target_codes=np.full_like(fields["patch_codes"], -1)), 0.0

  def widths(self) -> dict[str, int]:
    return {"patch_codes": self.patches.group_size * len(self.patches.empty_codes)}
