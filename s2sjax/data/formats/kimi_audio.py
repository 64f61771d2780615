"""Kimi-Audio's input format (`kimi_audio`): two id streams of equal length and a float feature track, as
MoonshotAI/Kimi-Audio's model reads a request (349251e `finetune_codes/modeling_kimia.py:668-723`): per position an
audio-stream id and a text-stream id (one embedding table, summed), and at the GLM-4-Voice code rows of the user's
audio message the Whisper-large-v3 feature of that code frame, mixed in through the model's adaptor. The rows are
laid in Kimi's own message layout (tasks/kimi_prompt.py) by its encoder (tasks/kimi_encoder.py); the architecture
that scores them is s2sjax/scoring/architectures/kimi_audio.py.

  audio_ids   [L]     the audio stream: role and media markers, codes + token_offset, kimia_text_blank elsewhere
  text_ids    [L]     the text stream: text ids, kimia_text_blank where the audio stream speaks
  features    [L, F]  float32 Whisper features at the continuous rows (zeros elsewhere); stored only for builds with
                      a spoken prefix (F = 4 x Whisper d_model, 5,120 for Kimi-Audio-7B)
  continuous  [L]     1 at the code rows whose feature is mixed in (upstream's is_continuous_mask)
  target_ids  [M]     the candidate's text ids, scored by the text head over the full vocabulary

Spec options: `token_offset` (the config's kimia_token_offset: code k is audio id token_offset + k) and
`feature_width` (the adaptor's input, kimia_adaptor_input_dim); the evaluator holds both to the checkpoint's
config. Spoken candidates (T->S, S->S) are refused (`refuse`'s reason).
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.formats.format import InputFormat, own_layout_problems, register
from s2sjax.data.modalities import SPEECH
from s2sjax.data.rows import Field, RowFormat

NAME = "kimi_audio"
OPTIONS = ("token_offset", "feature_width")

ROWS = RowFormat(
  NAME, marker="audio_ids",
  own_positions=(Field("audio_ids", "L", 0), Field("text_ids", "L", 0),
                 Field("features", "L", 0.0, dtype="float32", width="features"), Field("continuous", "L", 0)),
  own_targets=(Field("target_ids", "M", 0),),
  scored=("audio_ids", "text_ids", "features", "continuous", "target_pos", "target_ids"),
  optional=("features",),
)


def _spec_problems(spec) -> list[str]:
  problems = own_layout_problems(spec, OPTIONS, 0)
  if len(spec.codebook_sizes) != 1 or not spec.text_vocabulary:
    problems.append("one codebook (GLM-4-Voice's) and a text vocabulary")
  return [f"spec {spec.name}: {NAME} takes {p}" for p in problems]


def _refuse(spec, modality) -> str | None:
  if modality.candidate != SPEECH:
    return None
  return (f"spec {spec.name} lays Kimi-Audio's requests, whose speech the model says only beside its own text, "
          "6 steps behind it (kimia.py:125-150: the audio stream is blank for kimia_text_audiodelaytokens steps while "
          "the text stream generates): a spoken candidate's codes alone, or after their transcript, are no request "
          f"Kimi-Audio is asked, so {modality.name} ({modality.title}) cannot be scored for it")


def _widths(spec, modality) -> dict[str, int]:
  return {"features": spec.options["feature_width"] if modality.prefix == SPEECH else 0}


def _blank_audio(rows, metadata):
  """Every code set to code 0 and the features zeroed: what the model hears of the audio is gone."""
  offset = metadata.spec.options["token_offset"]
  audio = rows["audio_ids"]
  codes = rows["continuous"] > 0
  return dict(rows, audio_ids=np.where(codes, offset, audio).astype(audio.dtype),
              features=np.zeros_like(rows["features"]))


KIMI_AUDIO = register(InputFormat(
  NAME, ROWS, check_spec=_spec_problems, refuse=_refuse, widths=_widths,
  blank_audio=_blank_audio))
