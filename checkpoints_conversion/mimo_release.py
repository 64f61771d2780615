"""MiMo-Audio releases (XiaomiMiMo/MiMo-Audio-7B-Base) -> s2sjax checkpoints: MiMo-Audio's own converter
(`checkpoints_conversion/own_converters.py` registers it), which `checkpoints_conversion.convert` calls
for a folder whose config.json names `MiMoAudioForCausalLM`, with no flags.

A release folder as shipped: `config.json` (a Qwen2 config with MiMo-Audio's keys), the LM's safetensors in the
release's keys (bf16; `--dtype=bfloat16` keeps every number as released) and its text tokenizer, which holds the
<|empty|> id upstream reads from it (mimo_audio.py:69-86) and is copied into the checkpoint. The audio tokenizer
(MiMo-Audio-Tokenizer) is a release of its own, read by the builder (`--audio_tokenizer_dir`). Every key and shape
is checked before any tensor is read.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import jax.numpy as jnp

from checkpoints_conversion import own_release
from checkpoints_conversion.convert import ConversionError, interrupts_between_leaves, with_progress
from checkpoints_conversion.sources import SafetensorsSource, TensorSource
from s2sjax.runtime.errors import UserError
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.architectures import mimo_audio
from s2sjax.model.families import keymap
from s2sjax.model.config import ConfigError
from s2sjax.model.mimo_audio import MimoAudioConfig, abstract_params

# The text tokenizer's files a release folder may hold (transformers' fast and slow spellings).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt")


def plan(source: TensorSource, empty_id: int) -> tuple[MimoAudioConfig, list[keymap.Rule]]:
  """The release's config and the rules of every target leaf, checked against its keys and shapes: every problem
  (a refused config switch, a missing, mis-shaped or unexpected tensor) is listed at once."""
  try:
    config = mimo_audio.parse_config(dict(source.config, **{mimo_audio.EMPTY_ID_KEY: empty_id}))
  except ConfigError as e:
    raise ConversionError(f"{source.description}: {e}") from None
  ruled = mimo_audio.rules(config)
  own_release.check_release(source, abstract_params(config), ruled, "MiMo-Audio")
  return config, ruled


def convert(source_path: str, output: str, dtype: str = "float32", overwrite: bool = False) -> dict:
  """A MiMo-Audio release folder -> a MiMo-Audio checkpoint (its text tokenizer copied in); returns the manifest."""
  source = SafetensorsSource(source_path)
  try:
    empty_id = mimo_audio.empty_token_id(source_path)
  except (UserError, OSError, ValueError) as e:
    raise ConversionError(f"{source_path}: MiMo-Audio's text tokenizer cannot be read ({e})") from None
  config, ruled = plan(source, empty_id)
  manifest = {
    "source": os.path.abspath(source_path), "source_description": f"{source.description} (MiMo-Audio release)",
    # the config parse_config read: config.json with the tokenizer's <|empty|> id, which the pre-flight parses again
    "source_model_type": mimo_audio.NAME, "source_config": dict(source.config, **{mimo_audio.EMPTY_ID_KEY: empty_id}),
    "dtype": dtype, "empty_token_id": empty_id,
    "tokenizer": {"note": "the release's text tokenizer, copied"},
  }
  leaves = with_progress(own_release.iter_leaves(abstract_params(config, jnp.dtype(dtype)), ruled, source),
                         own_release.leaf_count(ruled), f"converting {os.path.basename(os.path.normpath(source_path))}")
  with tempfile.TemporaryDirectory() as staging:
    for name in TOKENIZER_FILES:
      if os.path.isfile(os.path.join(source_path, name)):
        shutil.copy(os.path.join(source_path, name), staging)
    with interrupts_between_leaves() as between:
      checkpoint.write_checkpoint(output, config, between(leaves), tokenizer_dir=staging, manifest=manifest,
                                  overwrite=overwrite)
  return manifest
