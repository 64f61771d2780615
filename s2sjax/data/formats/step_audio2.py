"""Step-Audio 2's input format (`step_audio2`): one id stream and a float feature track, as the release's forward
reads a request (`modeling_step_audio_2.py:346-365`): the prompt's ids, and at the `<audio_patch>` rows after each
`<audio_start>` the adaptor's output for that audio, written over those rows' embeddings. The rows are laid in the
Step-Audio2 wrapper's templates (tasks/step_audio2_prompt.py) by its encoder (tasks/step_audio2_encoder.py); the
architecture that scores them is s2sjax/scoring/architectures/step_audio2.py.

  ids         [L]     the prompt's ids and the candidate's
  features    [L, F]  float32 adaptor rows at the patch rows (zeros elsewhere); stored only for builds with a spoken
                      prefix (F = the LLM's hidden size, 3,584 for Step-Audio-2-mini)
  continuous  [L]     1 at the patch rows
  target_ids  [M]     the candidate's ids, scored over the full vocabulary: its text's, or for a spoken candidate
                      151696 + its CosyVoice2 s3tokenizer codes (stepaudio2.py:56)

Spec options: `template` (`base`: Step-Audio-2-mini-Base's plain concatenation; `chat`: Step-Audio-2-mini's
`<|BOT|>role ... <|EOT|>` turns, stepaudio2.py:60-127) and `feature_width` (the adaptor's output, the LLM's hidden
size), which the evaluator holds to the checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from s2sjax.data.formats.format import InputFormat, register
from s2sjax.data.modalities import SPEECH
from s2sjax.data.rows import Field, RowFormat
from s2sjax.runtime.errors import UserError

NAME = "step_audio2"
AUDIO_OFFSET = 151696  # speech out: code k is id AUDIO_OFFSET + k (Step-Audio2 stepaudio2.py:55-56)
AUDIO_CODES = 6562  # CosyVoice2 s3tokenizer's 6,561 codes and the audio eos (6561)
OPTIONS = ("template", "feature_width")
TEMPLATES = ("base", "chat")
# Spec fields of the token formats that Step-Audio 2's layout does not read: its markers are the tokenizer's own.
TOKEN_KEYS = ("start_token", "end_token", "placeholder_token", "unit_token", "unit_offset", "bos_id", "chat")

ADAPTOR_WIDTH = 2048  # Adaptor.linear1's output, hard-coded (modeling_step_audio_2.py:279)
ENCODER_KEYS = ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "llm_dim", "kernel_size",
                "adapter_stride")
ENCODER_INERT = ("n_codebook_size",)  # read by no forward (a tokenizer's size)


class EncoderConfigError(UserError, ValueError):
  """A release's audio_encoder_config that does not give the encoder's sizes."""


@dataclasses.dataclass(frozen=True)
class EncoderShape:
  """The audio encoder's and adaptor's sizes (config.json's audio_encoder_config)."""

  n_mels: int
  n_ctx: int  # rows of the learned positional table
  n_state: int
  n_head: int
  n_layer: int
  llm_dim: int  # the adaptor's output: the LLM's hidden size
  kernel_size: int  # the adaptor's conv
  adapter_stride: int

  @property
  def head_dim(self) -> int:
    return self.n_state // self.n_head

  def num_params(self) -> int:
    """The encoder's and adaptor's parameters (the release's `encoder.*` and `adapter.*` tensors)."""
    d, k = self.n_state, self.kernel_size
    block = 4 * d * d + 3 * d + 8 * d * d + 5 * d + 4 * d  # attention (key unbiased), MLP 4x, two LayerNorms
    encoder = self.n_mels * d * 3 + d + d * d * 3 + d + self.n_ctx * d + self.n_layer * block + 2 * d
    adaptor = d * d * k + d + d * ADAPTOR_WIDTH + ADAPTOR_WIDTH + ADAPTOR_WIDTH * self.llm_dim + self.llm_dim
    return encoder + adaptor


def encoder_shape(audio: Mapping[str, Any]) -> EncoderShape:
  """The sizes of a release's config.json `audio_encoder_config`: what the build runs (tasks/audio/step_audio2.py)
  and the converter and planner size; its refusal names the key."""
  missing = [key for key in ENCODER_KEYS if audio.get(key) is None]
  if missing:
    raise EncoderConfigError(f"audio_encoder_config has no {', '.join(map(repr, missing))}")
  shape = EncoderShape(n_mels=audio["n_mels"], n_ctx=audio["n_audio_ctx"], n_state=audio["n_audio_state"],
                       n_head=audio["n_audio_head"], n_layer=audio["n_audio_layer"], llm_dim=audio["llm_dim"],
                       kernel_size=audio["kernel_size"], adapter_stride=audio["adapter_stride"])
  if shape.n_state % shape.n_head:
    raise EncoderConfigError(f"n_audio_state={shape.n_state} is not a multiple of n_audio_head={shape.n_head}")
  return shape


ROWS = RowFormat(
  NAME, marker="ids",
  own_positions=(Field("ids", "L", 0), Field("features", "L", 0.0, dtype="float32", width="features"),
                 Field("continuous", "L", 0)),
  own_targets=(Field("target_ids", "M", 0),),
  scored=("ids", "features", "continuous", "target_pos", "target_ids"),
  optional=("features",),
)


def _spec_problems(spec) -> list[str]:
  options = spec.options or {}
  problems = []
  if (sorted(options) != sorted(OPTIONS) or options.get("template") not in TEMPLATES
      or not (isinstance(options.get("feature_width"), int) and options["feature_width"] > 0)):
    problems.append(f"options template ({' or '.join(TEMPLATES)}) and feature_width (a positive integer) (found "
                    f"{options or 'none'})")
  if not spec.text_vocabulary:
    problems.append("a text vocabulary")
  problems += [f"no {key} (its markers are the tokenizer's own)" for key in TOKEN_KEYS
               if getattr(spec, key) is not None]
  return [f"spec {spec.name}: {NAME} takes {p}" for p in problems]


def _widths(spec, modality) -> dict[str, int]:
  return {"features": spec.options["feature_width"] if modality.prefix == SPEECH else 0}


def _blank_audio(rows, metadata):
  """The adaptor rows zeroed and every speech id laid as code 0 (151696): what the model hears and has said of the
  audio is gone."""
  ids = rows["ids"]
  return dict(rows, features=np.zeros_like(rows["features"]),
              ids=np.where(ids >= AUDIO_OFFSET, AUDIO_OFFSET, ids).astype(ids.dtype))


STEP_AUDIO2 = register(InputFormat(
  NAME, ROWS, check_spec=_spec_problems, widths=_widths,
  blank_audio=_blank_audio))
