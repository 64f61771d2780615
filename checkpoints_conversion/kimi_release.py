"""Kimi-Audio releases (moonshotai/Kimi-Audio-7B, -7B-Instruct) -> s2sjax checkpoints: Kimi-Audio's own
converter (`checkpoints_conversion/own_converters.py` registers it), which `checkpoints_conversion.convert` calls
for a folder whose config.json names `MoonshotKimiaForCausalLM`, with no flags.

A release folder as shipped: `config.json` as `KimiAudioConfig.save_pretrained` writes it (MoonshotAI/Kimi-Audio
`finetune_codes/model.py:58`), the LM's safetensors in the release's keys, and `whisper-large-v3/`, the Whisper
encoder saved beside it (`model.py:63-75`), which the converter leaves where it is: the builder reads it from the
release folder to compute the feature track. The text tokenizer (tiktoken, shipped as code) is not copied either:
evaluate with the release folder as the tokenizer directory. Every key and shape is checked before any tensor is read.
"""

from __future__ import annotations

import os

import jax.numpy as jnp

from checkpoints_conversion import own_release
from checkpoints_conversion.convert import ConversionError, interrupts_between_leaves, with_progress
from checkpoints_conversion.sources import SafetensorsSource, TensorSource
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.architectures import kimi_audio
from s2sjax.model.families import keymap
from s2sjax.model.config import ConfigError
from s2sjax.model.kimi_audio import KimiAudioConfig, abstract_params


def plan(source: TensorSource) -> tuple[KimiAudioConfig, list[keymap.Rule]]:
  """The release's config and the rules of every target leaf, checked against its keys and shapes: every problem
  (a refused config switch, a missing, mis-shaped or unexpected tensor) is listed at once."""
  try:
    config = kimi_audio.parse_config(source.config)
  except ConfigError as e:
    raise ConversionError(f"{source.description}: {e}") from None
  ruled = kimi_audio.rules(config)
  own_release.check_release(source, abstract_params(config), ruled, "Kimi-Audio")
  return config, ruled


def convert(source_path: str, output: str, dtype: str = "float32", overwrite: bool = False) -> dict:
  """A Kimi-Audio release folder -> a Kimi-Audio checkpoint; returns the manifest."""
  source = SafetensorsSource(source_path)
  config, ruled = plan(source)
  whisper = os.path.join(source_path, kimi_audio.WHISPER_FOLDER)
  manifest = {
    "source": os.path.abspath(source_path), "source_description": f"{source.description} (Kimi-Audio release)",
    "source_model_type": kimi_audio.NAME, "source_config": source.config, "dtype": dtype,
    "whisper_encoder": (f"{kimi_audio.WHISPER_FOLDER}/ left in the release folder for the builder"
                        if os.path.isdir(whisper) else f"none: the release has no {kimi_audio.WHISPER_FOLDER}/"),
    "tokenizer": {"note": "not copied (the release's tiktoken tokenizer is code): evaluate with the release folder "
                          "as --tokenizer_dir"},
  }
  leaves = with_progress(own_release.iter_leaves(abstract_params(config, jnp.dtype(dtype)), ruled, source),
                         own_release.leaf_count(ruled), f"converting {os.path.basename(os.path.normpath(source_path))}")
  with interrupts_between_leaves() as between:
    checkpoint.write_checkpoint(output, config, between(leaves), manifest=manifest, overwrite=overwrite)
  return manifest
