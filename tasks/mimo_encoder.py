"""S2SBench's questions as MiMo-Audio requests (the `mimo_audio` input format, s2sjax/data/formats/mimo_audio.py),
laid in patches by tasks/mimo_prompt.py as upstream's `get_input_ids` lays its segments:

  S->T  a text segment of S2SBench's instruction (the spec's `speech_instruction`; none when it is empty), the
        audio segment of the prefix between <|sosp|> and <|eosp|> (the audio tokenizer's first K channels), then
        the candidate's text segment
  T->T  a text segment of the prefix, then the candidate's

Each candidate token is scored by the text head read after the patch before it (one token a patch); its last
patch is a target only (as every format lays it).
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.modalities import SPEECH
from s2sjax.data.spec import SpecError
from tasks.encoders import LaidTextEncoder
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


class MimoEncoder(LaidTextEncoder):
  """A question's prefix and candidates as MiMo-Audio rows: per position (patch) the text id and the patch's codes
  [group_size * K]; per target the candidate's text id."""

  laid_as = "MiMo-Audio's patches"

  def __init__(self, spec, *args, **kwargs):
    super().__init__(spec, *args, **kwargs)
    self.patches = layout(spec, self.tokenizer)

  def _fields(self, laid: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    text, codes = laid
    return {"text_ids": text.astype(np.int32), "patch_codes": codes.reshape(len(codes), -1).astype(np.int32)}

  def prefix(self, question: Question, c: int) -> tuple[dict, None, float]:
    if self.modality.prefix != SPEECH:
      return self._fields(self.patches.text(self.text_ids(question.prefixes[c], special=False))), None, 0.0
    codes, seconds = self._prefix_codes(question, c)
    instruction = self.spec.speech_instruction[self.language(question)]
    segments = [self.patches.text(self.text_ids(instruction, special=False))] if instruction else []
    segments.append(self.patches.audio(codes))
    return self._fields(join(*segments)), None, seconds

  def candidate(self, question: Question, c: int) -> tuple[dict, float]:
    text = self.text_ids(question.candidates[c], special=False)
    return dict(self._fields(self.patches.text(text)), target_ids=text), 0.0

  def widths(self) -> dict[str, int]:
    return {"patch_codes": self.patches.group_size * len(self.patches.empty_codes)}
