"""Step-Audio-2-mini and -mini-Base (stepfun-ai) as an architecture of their own: the release's nested config.json
read into a `StepAudio2Config` (every switch read or refused by name), the release's tensor keys, its scoring step
over the `step_audio2` input format's rows (s2sjax/data/formats/step_audio2.py: ids and the adaptor's rows as a
feature track), the evaluator's and the pre-flight's checks, its log-probs hook, and its registration. The network
is `s2sjax.model.step_audio2`; `checkpoints_conversion.convert` converts a release naming
`StepAudio2ForCausalLM` with no flags (`checkpoints_conversion/step_audio2_release.py`).

Why not a family of the shared decoder: its LLM is Qwen2's, but the forward overwrites the rows after each
`<audio_start>` with an audio encoder's output, which a family's token rows cannot carry.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax.data import modalities
from s2sjax.data.formats.step_audio2 import ENCODER_INERT, ENCODER_KEYS, ROWS, EncoderConfigError, encoder_shape
from s2sjax.data.packing import RowShape
from s2sjax.data.spec import Spec
from s2sjax.model import families
from s2sjax.scoring.architectures.architecture import Architecture, FitError, register
from s2sjax.model.families import keymap
from s2sjax.model.attention import LocalWindow, local_window
from s2sjax.model.config import ConfigError
from s2sjax.model.step_audio2 import (AUDIO_CODES, AUDIO_OFFSET, AUDIO_START, NAME, StepAudio2Config,
  abstract_params, param_logical_axes, sequence_log_probs)
from s2sjax.scoring.scorer import ScoringError, StreamScorer
from s2sjax.scoring.scorer import score_batch as decoder_step
from s2sjax.scoring.sequence_inputs import LogProbsError, check_range, sequence

MODEL_TYPE = "step_audio_2"  # StepAudio2Config.model_type
# text_config: keys read, switches refused unless they hold the value the forward implements, keys that do not
# change the forward (generation and bookkeeping; max_seq_len / max_position_embeddings size no table: rope is
# computed; the lm_head is the release's own Linear whatever tie_word_embeddings says, modeling_step_audio_2.py:330).
TEXT_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
             "rms_norm_eps", "rope_theta")
TEXT_REFUSED = {"rope_scaling": None, "use_sliding_window": False, "hidden_act": "silu"}
TEXT_INERT = ("num_attention_groups", "num_key_value_heads", "max_seq_len", "max_position_embeddings",
              "eos_token_id", "pad_token_id", "bos_token_id", "torch_dtype", "model_type", "architectures",
              "initializer_range", "use_cache", "attention_dropout", "sliding_window", "max_window_layers",
              "tie_word_embeddings", "transformers_version")
TOP_INERT = ("architectures", "auto_map", "model_type", "torch_dtype", "transformers_version", "_name_or_path",
             "text_config", "audio_encoder_config")


def _unknown(section: str, cfg: Mapping[str, Any], known) -> list[str]:
  return [f"unknown {section} key {key!r}" for key in sorted(set(cfg) - set(known))]


def parse_config(cfg: Mapping[str, Any]) -> StepAudio2Config:
  """A release's config.json -> StepAudio2Config; a ConfigError names every key it refuses, lacks or does not know."""
  if cfg.get("model_type") != MODEL_TYPE:
    raise ConfigError(f"Step-Audio 2 config.json: model_type {cfg.get('model_type')!r} is not {MODEL_TYPE!r}")
  text, audio = cfg.get("text_config"), cfg.get("audio_encoder_config")
  if not isinstance(text, dict) or not isinstance(audio, dict):
    raise ConfigError("Step-Audio 2 config.json: needs the nested text_config and audio_encoder_config objects")
  problems = _unknown("config.json", cfg, TOP_INERT)
  problems += _unknown("text_config", text, TEXT_KEYS + tuple(TEXT_REFUSED) + TEXT_INERT)
  problems += _unknown("audio_encoder_config", audio, ENCODER_KEYS + ENCODER_INERT)
  problems += [f"text_config has no {key!r}" for key in TEXT_KEYS if text.get(key) is None]
  problems += [f"audio_encoder_config has no {key!r}" for key in ENCODER_KEYS if audio.get(key) is None]
  problems += [f"text_config {key}={text[key]!r} is not supported (only {allowed!r})"
               for key, allowed in TEXT_REFUSED.items() if text.get(key, allowed) != allowed]
  # configuration_step_audio_2.py asserts num_attention_groups == num_key_value_heads; either names the KV heads
  kv = {text[key] for key in ("num_attention_groups", "num_key_value_heads") if text.get(key) is not None}
  if len(kv) > 1:
    problems.append(f"text_config num_attention_groups and num_key_value_heads differ ({sorted(kv)})")
  if problems:
    raise ConfigError("Step-Audio 2 config.json: " + "; ".join(problems))
  heads = int(text["num_attention_heads"])
  llm = families.get("qwen2").layout(families.HF).parse_config({
    "model_type": "qwen2", **{key: text[key] for key in TEXT_KEYS}, "num_key_value_heads": kv.pop() if kv else heads,
    "hidden_act": "silu", "tie_word_embeddings": False})
  try:
    encoder = encoder_shape(audio)
  except EncoderConfigError as e:
    raise ConfigError(f"Step-Audio 2 config.json: {e}") from None
  return StepAudio2Config(decoder=llm, encoder=encoder)


def rules(config: StepAudio2Config) -> list[keymap.Rule]:
  """The LLM's leaves from the release's keys: transformers' Qwen2 under `model.`, the head as `lm_head`."""
  return keymap.decoder_rules(config.decoder, keymap.HF_NAMES)


# ---- the scoring step over packed rows -------------------------------------------------------------------------------


def score_batch(config: StepAudio2Config, dtype, target_chunk: int, num_slots: int, params, batch: dict,
                attention: str = "xla", window: LocalWindow | None = None) -> dict:
  """The shared decoder's step (`s2sjax.scoring.scorer.score_batch`: per target NLL over the full vocabulary, as the
  release's forward gives logits, and whether it is the argmax; per slot their sums) over the rows' ids, with the
  adaptor rows written at the patch rows; per target [B, M, 1] `target_details`, its NLL renormalised over the
  audio ids (`audio_nll`). Rows of a written prefix carry a feature track of width 0. Pure; jitted by the scorer."""
  features = batch["features"] if batch["features"].shape[-1] else None
  return decoder_step(config.decoder, dtype, target_chunk, num_slots, params,
                      dict(batch, tokens=batch["ids"], audio_codes=None), attention, window, features,
                      batch["continuous"] > 0 if features is not None else None, target_details=audio_nll)


def audio_nll(logits: jax.Array, ids: jax.Array) -> jax.Array:
  """[..., 1]: each target's NLL under the softmax over the 6,562 audio ids only (151696 + code, the audio eos
  included), as the oracle's second figure for speech out (PROVENANCE CONVENTIONS 8); meaningless at a text id."""
  audio = jax.lax.slice_in_dim(logits, AUDIO_OFFSET, AUDIO_OFFSET + AUDIO_CODES, axis=-1)
  picked = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]
  return (jax.nn.logsumexp(audio, axis=-1) - picked)[..., None]


def details(config: StepAudio2Config) -> tuple[str, ...]:
  """A spoken candidate's NLL over the audio ids alone, summed over its codes (`audio_nll`)."""
  return ("nll_sum_audio_ids",)


def check_ids(rows: Mapping[str, np.ndarray], config: StepAudio2Config) -> None:
  """Ids beyond the embedding (clamped silently by the gather) and feature rows of another width: refused, naming
  the field, row and position."""
  for field in ("ids", "target_ids"):
    bad = np.argwhere((rows[field] < 0) | (rows[field] >= config.vocab_size))
    if len(bad):
      r, pos = bad[0]
      raise ScoringError(f"{field}[row {r}, position {pos}] = {rows[field][r, pos]} is outside the embedding table "
                         f"({config.vocab_size} rows); {len(bad)} such ids in all")
  if (rows["continuous"] > 0).any() and rows["features"].shape[-1] != config.decoder.hidden_size:
    raise ScoringError(f"rows have audio rows but features of width {rows['features'].shape[-1]}; the adaptor writes "
                       f"{config.decoder.hidden_size}")


def scorer(config: StepAudio2Config, shape: RowShape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
           attention: str = "xla") -> StreamScorer:
  """The compiled step over `step_audio2` rows of `shape` (item-local attention where the shape records its
  longest item), driven by the generic row scorer."""
  window = local_window(shape.max_item, shape.length)
  step = lambda config, dtype, target_chunk, num_slots, params, batch: score_batch(
    config, dtype, target_chunk, num_slots, params, batch, attention, window)
  return StreamScorer(config, shape, step, check_ids, abstract_params(config), param_logical_axes(config), mesh=mesh,
                      batch_size=batch_size, dtype=dtype, row_format=ROWS)


# ---- a spec against the checkpoint -----------------------------------------------------------------------------------


def spec_checks(config: StepAudio2Config, spec: Spec, ids=None) -> list[tuple[str, bool, str]]:
  """Whether the rows a spec lays are what this checkpoint reads: adaptor rows of the LLM's width."""
  width = (spec.options or {}).get("feature_width")
  return [("feature width", width == config.decoder.hidden_size,
           f"spec {spec.name} lays adaptor rows of width {width}; the checkpoint's LLM is "
           f"{config.decoder.hidden_size} wide")]


def check_fit(config: StepAudio2Config, data) -> None:
  """Data laid for this checkpoint: a spoken prefix's adaptor rows of the LLM's width, each run of them right after
  an <audio_start> (where the forward writes them)."""
  if modalities.get(data.modality).prefix != modalities.SPEECH:
    return
  failed = [f"{check}: {detail}" for check, ok, detail in spec_checks(config, data.metadata.spec) if not ok]
  continuous = data.rows["continuous"] > 0
  opens = continuous[:, 1:] & ~continuous[:, :-1]
  before = set(data.rows["ids"][:, :-1][opens].tolist())
  if not before <= {AUDIO_START}:
    failed.append(f"audio rows follow ids {sorted(before)}, the forward writes them after <audio_start> "
                  f"({AUDIO_START}) (build with the release's own tokenizer)")
  if failed:
    raise FitError(f"{data.task}/{data.modality} does not fit this Step-Audio 2 checkpoint: " + "; ".join(failed))


# ---- one sequence's log-probs (s2sjax.logprobs) ----------------------------------------------------------------------


def patch_rows(ids: np.ndarray) -> list[tuple[int, int]]:
  """(first row, count) of each audio's rows: the run of placeholders right after each <audio_start>, which the
  forward overwrites with that audio's adaptor rows (modeling_step_audio_2.py:353-357), in order."""
  runs = []
  for start in np.flatnonzero(ids == AUDIO_START):
    first = start + 1
    stop = first
    while stop < len(ids) and ids[stop] == ids[first]:
      stop += 1
    runs.append((int(first), int(stop - first) if first < len(ids) else 0))
  return runs


def log_probs(config: StepAudio2Config, params, input_ids: np.ndarray, audio_codes: np.ndarray | None = None,
              features: np.ndarray | None = None) -> tuple[np.ndarray, None]:
  """fp32 log-softmax [T, vocab] of one request. `input_ids` [T] as the wrapper lays them; `features` [N, hidden]:
  the adaptor rows of its audios in order (`tasks.audio.step_audio2`), N the placeholders after all
  <audio_start>s."""
  ids = sequence(input_ids)
  check_range("input_ids", ids, config.vocab_size, "the embedding's rows")
  if audio_codes is not None:
    raise LogProbsError("a Step-Audio 2 checkpoint reads speech out as ids (151696 + code) in input_ids: "
                        "--audio_codes does not apply")
  runs = patch_rows(ids)
  needed = sum(count for _, count in runs)
  if not runs:
    if features is not None:
      raise LogProbsError(f"features given, but input_ids hold no <audio_start> ({AUDIO_START})")
    return sequence_log_probs(config, params, ids), None
  width = config.decoder.hidden_size
  rows = None if features is None else np.asarray(features, np.float32)
  if rows is None or rows.ndim != 2 or rows.shape != (needed, width):
    raise LogProbsError(f"input_ids hold {len(runs)} audio(s) of {needed} placeholder rows in all: pass their adaptor "
                        f"rows as --features [{needed}, {width}]; got {None if rows is None else rows.shape}")
  track, continuous = np.zeros((len(ids), width), np.float32), np.zeros(len(ids), bool)
  for first, count in runs:
    continuous[first : first + count] = True
  track[continuous] = rows
  return sequence_log_probs(config, params, ids, track, continuous), None


# Step-Audio-2-mini's config.json (stepfun-ai; the sizes as the upstream oracle's PROVENANCE.txt lists them beside
# its scaled copy): what the planner sizes a run of the real model by.
STEP_AUDIO_2_MINI = {
  "architectures": ["StepAudio2ForCausalLM"], "model_type": MODEL_TYPE, "torch_dtype": "bfloat16",
  "text_config": {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                  "num_attention_groups": 4, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 158720,
                  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None},
  "audio_encoder_config": {"n_mels": 128, "n_audio_ctx": 1500, "n_audio_state": 1280, "n_audio_head": 20,
                           "n_audio_layer": 32, "llm_dim": 3584, "kernel_size": 3, "adapter_stride": 2},
}


ARCHITECTURE = register(Architecture(
  NAME, StepAudio2Config, ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.vocab_size, check_fit=check_fit, check_ids=check_ids,
  parse_config=parse_config, spec_checks=spec_checks, log_probs=log_probs, planned=lambda config: config.decoder,
  planner_shapes={"step-audio-2-mini": STEP_AUDIO_2_MINI}, details=details))
