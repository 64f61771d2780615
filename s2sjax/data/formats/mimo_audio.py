"""MiMo-Audio's input format (`mimo_audio`): one row position per patch, as XiaomiMiMo/MiMo-Audio's model reads a
request (691ce54 `src/mimo_audio/modeling_mimo_audio.py:331-387`): the patch's text id (upstream's slot 0 of its
`group_size` frames) and the patch's RVQ codes, `group_size` frames of every channel, laid as upstream's
`get_input_ids` lays them (tasks/mimo_prompt.py). The architecture that scores them is
s2sjax/scoring/architectures/mimo_audio.py.

  text_ids     [L]         each patch's text id: a text token, <|sosp|> / <|eosp|> around an audio segment, or
                           <|empty|> on a patch of speech
  patch_codes  [L, G * K]  the patch's codes, frame-major (index f * K + k for frame f of channel k); every
                           channel's empty id on a text patch
  target_ids   [M]         a written candidate's text id, scored by the text head over the full vocabulary; -1 for
                           a patch of a spoken candidate
  target_codes [M, G * K]  a spoken candidate's patch (frame-major, as patch_codes), scored by the patch decoder
                           from the state of the patch before it; -1 for a text target

Spec options: `group_size` (frames per patch, the config's group_size; the evaluator holds it to the checkpoint's).
The codebooks are the spec's `codebook_sizes`, each channel's empty id its size (the release's speech_zeroemb_idx).
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.formats.format import InputFormat, own_layout_problems, register
from s2sjax.data.rows import Field, RowFormat

NAME = "mimo_audio"
OPTIONS = ("group_size",)

ROWS = RowFormat(
  NAME, marker="patch_codes",
  own_positions=(Field("text_ids", "L", 0), Field("patch_codes", "L", 0, width="patch_codes")),
  own_targets=(Field("target_ids", "M", 0), Field("target_codes", "M", -1, width="patch_codes")),
  scored=("text_ids", "patch_codes", "target_pos", "target_ids", "target_codes"),
)


def _spec_problems(spec) -> list[str]:
  problems = own_layout_problems(spec, OPTIONS, 1)
  if not spec.codebook_sizes or not spec.text_vocabulary:
    problems.append("its RVQ codebooks and a text vocabulary")
  return [f"spec {spec.name}: {NAME} takes {p}" for p in problems]


def _widths(spec, modality) -> dict[str, int]:
  return {"patch_codes": spec.options["group_size"] * len(spec.codebook_sizes)}


def _blank_audio(rows, metadata):
  """Every code of a speech patch set to code 0: what the model hears of the audio is gone (a text patch keeps its
  empty ids, which the model reads as no speech)."""
  sizes = np.tile(np.asarray(metadata.spec.codebook_sizes), metadata.spec.options["group_size"])
  codes = rows["patch_codes"]
  return dict(rows, patch_codes=np.where(codes == sizes, codes, 0).astype(codes.dtype))


MIMO_AUDIO = register(InputFormat(
  NAME, ROWS, check_spec=_spec_problems, widths=_widths,
  blank_audio=_blank_audio))
