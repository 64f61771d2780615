"""The shared decoder as an architecture: every family of `s2sjax.families`, scoring token rows
(`s2sjax.scoring.Scorer`), audio taken the ways its family accepts (codebook tables, units in the vocabulary)."""

from __future__ import annotations

import jax.numpy as jnp

from s2sjax import families, modalities
from s2sjax.architectures.architecture import DECODER, Architecture, FitError, register
from s2sjax.model import decoder
from s2sjax.model.config import ModelConfig
from s2sjax.rows import TOKEN_ROWS
from s2sjax.scoring import Scorer


def scorer(config: ModelConfig, shape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
           attention: str = "xla") -> Scorer:
  return Scorer(config, shape, mesh=mesh, batch_size=batch_size, dtype=dtype, attention=attention)


def check_fit(config: ModelConfig, data) -> None:
  """Spoken data laid as the checkpoint's family takes audio: its audio input, its codebook tables and the
  placeholder id it reads codes at."""
  spec = data.metadata.spec
  if not modalities.get(data.modality).speaks:
    return
  accepted = families.get(config.family).audio_inputs
  if spec.audio_mode not in accepted:
    raise FitError(f"spec {spec.name} feeds audio as {spec.audio_mode}; the {config.family} family takes "
                   f"{', '.join(accepted) or 'no audio'}")
  if spec.audio_mode == "codebook_tables":
    sizes = spec.codebook_sizes
    if len(config.audio_codebook_sizes) != len(sizes) or any(m < d for m, d in zip(config.audio_codebook_sizes, sizes)):
      raise FitError(
        f"spec {spec.name} needs {len(sizes)} audio codebook tables of sizes {sizes}; the checkpoint has "
        f"{config.audio_codebook_sizes or 'none'} (convert it with its audio tables, or use a spec that fits)"
      )
    # Codes reach the model only at the checkpoint's placeholder id: at any other id every S->T NLL would be the
    # model reading N copies of one text token, and the run would finish normally.
    placeholder = data.metadata.audio_ids.placeholder if data.metadata.audio_ids else None
    if placeholder != config.audio_placeholder_id:
      raise FitError(
        f"{data.task}/{data.modality}: the data lays audio at placeholder id {placeholder} (spec {spec.name}'s "
        f"{spec.placeholder_token!r} in the data's tokenizer), the checkpoint's config reads codes at "
        f"audio_placeholder_id {config.audio_placeholder_id}: rebuild the data with the checkpoint's tokenizer "
        "(--tokenizer_dir=CHECKPOINT/tokenizer) or use the spec whose placeholder is that id"
      )


DECODER_ARCHITECTURE = register(Architecture(
  DECODER, ModelConfig, TOKEN_ROWS, decoder.abstract_params, decoder.param_logical_axes, scorer,
  text_rows=lambda config: config.vocab_size, check_fit=check_fit))
