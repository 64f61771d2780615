"""The input formats of the shared decoder: token rows (s2sjax/data/rows.py's TOKEN_ROWS, packed by `packing.pack`),
one id per position, audio entering as the model's family accepts it (s2sjax/model/families: a family lists these names
among its `audio_inputs`).

  none             text only: nothing spoken can be asked of the spec
  extended_vocab   audio unit k is an ordinary token id (`unit_token` names it, or `unit_offset` + k): GLM-4-Voice,
                   TWIST, SIMS, the demo spec's untrained rows; a spec without a text vocabulary is a unit LM.
                   K codebooks are flattened frame by frame, K tokens a frame (`unit_token` of code and codebook:
                   Llama-Mimi), and a spoken candidate is scored on its first codebook's tokens (and the utterance's
                   closing token), as Llama-Mimi's authors score it; option `max_audio_seconds` cuts each
                   recording before it is tokenized
  codebook_tables  K codebooks summed at a placeholder token (Baichuan-Audio); its audio is predicted by an audio
                   head the decoder does not run, so spoken candidates cannot be scored
"""

from __future__ import annotations

import numpy as np

from s2sjax.data.formats.format import InputFormat, register
from s2sjax.data.modalities import SPEECH
from s2sjax.data.rows import TOKEN_ROWS



def _unit_lm_problems(spec) -> list[str]:
  """A spec without a text vocabulary reads units only, by id: the unit LM rule of `extended_vocab`."""
  if spec.text_vocabulary or (spec.audio_mode == "extended_vocab" and spec.unit_offset is not None
                              and spec.bos_id is not None):
    return []
  return [f"spec {spec.name}: a spec without a text vocabulary is a unit LM: it needs audio_mode extended_vocab with "
          "unit_offset and bos_id (no token names to look up)"]


UNIT_OPTIONS = ("max_audio_seconds",)


def _names_code_and_codebook(unit_token: str | None) -> bool:
  """Whether a unit token's format string tells codes and codebooks apart (its two positional fields)."""
  try:
    return unit_token is not None and len({unit_token.format(0, 0), unit_token.format(0, 1),
                                            unit_token.format(1, 0)}) == 3
  except (IndexError, KeyError, ValueError):
    return False


def _units_problems(spec) -> list[str]:
  problems = []
  if not spec.codebook_sizes or (spec.unit_token is None) == (spec.unit_offset is None):
    problems.append(f"spec {spec.name}: extended_vocab needs its codebooks and exactly one of unit_token, unit_offset")
  elif len(spec.codebook_sizes) > 1 and not _names_code_and_codebook(spec.unit_token):
    problems.append(f"spec {spec.name}: {len(spec.codebook_sizes)} codebooks in the vocabulary need a unit_token of "
                    f"code and codebook, such as '<{{}}_{{}}>' (found {spec.unit_token!r})")
  options = spec.options or {}
  seconds = options.get("max_audio_seconds")
  if set(options) - set(UNIT_OPTIONS) or (seconds is not None and not (isinstance(seconds, (int, float))
                                                                        and seconds > 0)):
    problems.append(f"spec {spec.name}: extended_vocab's options are {', '.join(UNIT_OPTIONS)} (seconds > 0); found "
                    f"{options}")
  return problems + _unit_lm_problems(spec)


def _tables_problems(spec) -> list[str]:
  problems = [] if spec.placeholder_token else [f"spec {spec.name}: codebook_tables needs placeholder_token"]
  return problems + _unit_lm_problems(spec)


def _tables_refuse(spec, modality) -> str | None:
  if modality.candidate != SPEECH:
    return None
  return (f"spec {spec.name} feeds audio as codebook tables at a placeholder token: its audio is predicted by the "
          f"checkpoint's own audio head (kept under extras/, not run by s2sjax), not by the text head, so spoken "
          f"candidates ({modality.name}, {modality.title}) cannot be scored for it")


def _tables_codebooks(spec, modality) -> int:
  """Codes ride on the placeholders of a spoken prefix; rows without one carry none."""
  return len(spec.codebook_sizes) if modality.prefix == SPEECH else 0


def _token_widths(codebooks):
  return lambda spec, modality: {"codebooks": codebooks(spec, modality)}


def _blank_units(rows, metadata):
  """Every audio unit replaced by unit 0."""
  units = metadata.audio_ids.unit_ids if metadata.audio_ids else None
  if not units:
    return None
  tokens = rows["tokens"]
  return dict(rows, tokens=np.where(np.isin(tokens, units), units[0], tokens).astype(tokens.dtype))


def _blank_codes(rows, metadata):
  """The codes at the placeholders zeroed."""
  codes = rows["audio_codes"]
  if not codes.shape[-1]:
    return None
  return dict(rows, audio_codes=np.where(codes >= 0, 0, -1).astype(codes.dtype))


NONE = register(InputFormat("none", TOKEN_ROWS, takes_audio=False, chat=True, check_spec=_unit_lm_problems,
                            widths=_token_widths(lambda spec, modality: 0)))
EXTENDED_VOCAB = register(InputFormat(
  "extended_vocab", TOKEN_ROWS, chat=True, check_spec=_units_problems,
  widths=_token_widths(lambda spec, modality: 0), blank_audio=_blank_units))
CODEBOOK_TABLES = register(InputFormat(
  "codebook_tables", TOKEN_ROWS, chat=True, check_spec=_tables_problems, refuse=_tables_refuse,
  num_codebooks=_tables_codebooks, widths=_token_widths(_tables_codebooks), blank_audio=_blank_codes))
