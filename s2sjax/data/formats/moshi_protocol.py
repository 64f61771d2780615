"""Moshi's stream protocol (the build's side of Kyutai's `LMModel`, s2sjax/scoring/architectures/moshi.py): which
streams each modality scores and how much each weighs, and how a side of a question is laid on the streams.
Registered under the architecture's name, which Moshi's spec (`moshi.yaml`) names.
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.formats.streams import StreamProtocol, register_protocol
from s2sjax.data.formats.format import SpecError

ARCHITECTURE = "moshi"  # s2sjax.model.moshi.FAMILY: the architecture this protocol lays rows for

# Moshi's streams: 0 = the text stream (its Inner Monologue: time-aligned text of *its own* speech), 1..dep_q = its
# own speech's Mimi codebooks (1 = the semantic codebook), dep_q+1..n_q = the user's speech (read, never predicted).
# A benchmark's audio is laid as Moshi's own speech, so that its codebooks are predicted; silent streams hold -1.
#
#   s2s  spoken -> spoken, Kyutai's protocol (the Moshi paper, arXiv 2410.00037, §5.4 "Audio Language Modeling"):
#        "we sum all tokens of a timestep with the same weights used during training, i.e. 100 for the semantic
#        tokens and 1 for the acoustic ones" — every own codebook, as the depformer predicts it, weighted 100
#        (stream 1) or 1 (streams 2..dep_q); "We do not include text tokens from the Inner Monologue" — the text
#        stream is -1 throughout and not scored; "We score sequences with a negative-log likelihood normalized by
#        the sequence length" — a candidate's score is its weighted NLL sum divided by its timesteps (the stream
#        scorer's `n_tokens` for stream rows: s2sjax/scoring/architectures/moshi.py's `score_stream_batch`). Moshi's published 60.8
#        sStoryCloze / 83.0 sTopic-StoryCloze (our tStoryCloze; Table 7) are its text-and-audio model after
#        single-stream pretraining, scored this way: "even if these models are trained with Inner Monologue, they
#        are evaluated without".
#        Which recording is scored is the build's `--protocol`: `utterance` (the whole spoken story, prefix and
#        ending heard as one recording, scored from Moshi's initial step) is the paper's, which scores whole
#        positive and negative speech examples; `s2sbench` scores only the spoken ending's frames given the
#        spoken story before it. Both weigh a step's codebooks alike.
#   s2t  spoken prefix (audio streams, text -1) -> candidate text on the time-aligned text stream (audio -1 there):
#        the text stream is Moshi's only text output, predicted per frame.
#   t2t  text stream alone, audio streams -1 everywhere: Moshi's temporal transformer is Helium fine-tuned on
#        aligned speech, and its text stream alone is a text LM over Helium's tokenizer; meaningful, though off the
#        training distribution (text always came with audio), so it is reported next to s2t, not instead of it.
#   t2s  text prefix -> spoken candidate: refused. Moshi's text stream is the transcript of the speech it carries,
#        one frame at a time: a text prefix without its speech is not a prompt the model was trained to continue
#        in audio, and no alignment of the two exists to build one.
#
# The weights live here, with the rule that picks the scored streams, rather than in the spec (moshi.yaml): they are
# the paper's protocol, the same for every Moshi checkpoint, while a spec says how a checkpoint's streams are laid
# (s2sjax/data/spec.py validates those keys for every family); a spec key would let a build drift from the paper silently.

SEMANTIC_WEIGHT = 100  # §5.4: "100 for the semantic tokens" (Mimi's codebook 0, distilled from WavLM)
ACOUSTIC_WEIGHT = 1  # §5.4: "and 1 for the acoustic ones"
TEXT_WEIGHT = 1  # s2t and t2t score the text stream alone: its weight only sets the unit


def stream_weights(modality: str, codebooks: int) -> tuple[int, ...]:
  """Per stream (0 = text, k = codebook k - 1) the weight of a candidate's tokens under a modality's protocol, for
  rows of the text stream and `codebooks` codebook streams; 0 = not scored."""
  if modality == "s2s":
    return (0, SEMANTIC_WEIGHT) + (ACOUSTIC_WEIGHT,) * (codebooks - 1)
  if modality in ("s2t", "t2t"):
    return (TEXT_WEIGHT,) + (0,) * codebooks
  if modality == "t2s":
    raise SpecError("t2s is refused for Moshi: its text stream transcribes the speech it carries frame by frame, "
                    "so a text prefix has no speech to continue (see s2sjax/data/formats/moshi_protocol.py)")
  raise SpecError(f"unknown modality {modality!r} (s2s, s2t, t2t)")


def lay_streams(codebooks: int, text: np.ndarray | None = None, audio: np.ndarray | None = None) -> np.ndarray:
  """One side of a question (its prefix, or a candidate) as time-aligned streams [T, 1 + codebooks]: text ids [T]
  on stream 0, or audio codes [T, codebooks] on the codebook streams (Moshi's own speech); every other stream -1.
  The user's streams are not laid: the scorer reads them as silence."""
  if (text is None) == (audio is None):
    raise ValueError("a side of a question is laid from its text or from its audio, one of the two")
  if audio is not None:
    audio = np.asarray(audio)
    if audio.ndim != 2 or audio.shape[1] != codebooks:
      raise SpecError(f"audio codes must be [T, {codebooks}] (Moshi's own codebooks), got {audio.shape}")
  out = np.full((len(text) if text is not None else len(audio), 1 + codebooks), -1, np.int32)
  if text is not None:
    out[:, 0] = text
  else:
    out[:, 1:] = audio
  return out


PROTOCOL = register_protocol(StreamProtocol(ARCHITECTURE, stream_weights, lay_streams))
