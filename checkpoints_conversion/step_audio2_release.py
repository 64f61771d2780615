"""Step-Audio-2-mini / -mini-Base releases (stepfun-ai) -> s2sjax checkpoints: Step-Audio 2's own converter
(`checkpoints_conversion/own_converters.py` registers it), which `checkpoints_conversion.convert` calls for a folder
whose config.json names `StepAudio2ForCausalLM`, with no flags.

A release folder as shipped: the nested `config.json` (text_config, audio_encoder_config) and the safetensors of
`StepAudio2ForCausalLM` (the Qwen2 LLM under `model.` and `lm_head`, the audio encoder under `encoder.`, the adaptor
under `adapter.`). The checkpoint holds the LLM; the encoder and adaptor run at build time over the recordings
(`tasks/audio/step_audio2.py`, reading them from the release folder), so they are checked here, key and shape,
and left where they are. Every key and shape is checked before any tensor is read; the release's bf16 values are
kept exactly in a bfloat16 or float32 checkpoint. The tokenizer (the release's Qwen2 tokenizer with its added
tokens) is not copied: evaluate with the release folder as the tokenizer directory.
"""

from __future__ import annotations

import os

import jax.numpy as jnp

from checkpoints_conversion import own_release
from checkpoints_conversion.convert import ConversionError, interrupts_between_leaves, with_progress
from checkpoints_conversion.sources import SafetensorsSource, TensorSource
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.architectures import step_audio2
from s2sjax.model.families import keymap
from s2sjax.model.config import ConfigError
from s2sjax.model.step_audio2 import StepAudio2Config, abstract_params, release_audio_tensors


def plan(source: TensorSource) -> tuple[StepAudio2Config, list[keymap.Rule]]:
  """The release's config and the rules of every LLM leaf, checked against its keys and shapes with the encoder's
  and adaptor's tensors: every problem (a refused config switch, a missing, mis-shaped or unexpected tensor) is
  listed at once."""
  try:
    config = step_audio2.parse_config(source.config)
  except ConfigError as e:
    raise ConversionError(f"{source.description}: {e}") from None
  ruled = step_audio2.rules(config)
  own_release.check_release(source, abstract_params(config), ruled, "Step-Audio 2",
                            also=release_audio_tensors(config.encoder))
  return config, ruled


def convert(source_path: str, output: str, dtype: str = "float32", overwrite: bool = False) -> dict:
  """A Step-Audio 2 release folder -> a Step-Audio 2 checkpoint; returns the manifest."""
  source = SafetensorsSource(source_path)
  config, ruled = plan(source)
  manifest = {
    "source": os.path.abspath(source_path), "source_description": f"{source.description} (Step-Audio 2 release)",
    "source_model_type": step_audio2.MODEL_TYPE, "source_config": source.config, "dtype": dtype,
    "audio_encoder": "encoder.* and adapter.* left in the release folder for the builder (--audio_tokenizer_dir)",
    "tokenizer": {"note": "not copied: evaluate with the release folder as --tokenizer_dir"},
  }
  leaves = with_progress(own_release.iter_leaves(abstract_params(config, param_dtype=jnp.dtype(dtype)), ruled, source),
                         own_release.leaf_count(ruled), f"converting {os.path.basename(os.path.normpath(source_path))}")
  with interrupts_between_leaves() as between:
    checkpoint.write_checkpoint(output, config, between(leaves), manifest=manifest, overwrite=overwrite)
  return manifest
