"""Kimi-Audio-7B (base and Instruct) as an architecture of its own: its release config.json read into a
`KimiAudioConfig` (every switch read or refused by name), the release's tensor keys, its scoring step over the
`kimi_audio` input format's rows (s2sjax/data/formats/kimi_audio.py: two id streams and a Whisper feature track), the
evaluator's and the pre-flight's checks of a spec against a checkpoint, its log-probs hook, and its registration.
The network is `s2sjax.model.kimi_audio`; the converter `checkpoints_conversion/kimi_release.py`, which
`checkpoints_conversion.convert` runs for a release naming `MoonshotKimiaForCausalLM`, with no flags.

Why not a family of the shared decoder: Kimi reads two id streams through one table, mixes continuous Whisper
features in at the code rows and has a second head on a branch of six layers, none of which `ModelConfig` says.
Its scoring step runs the main stack and the text head only: the format lays text candidates alone (its `refuse`
says why spoken ones are not Kimi's protocol); the audio head is read by `log_probs`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from s2sjax.model import families
from s2sjax.data import modalities
from s2sjax.scoring.architectures.architecture import Architecture, FitError, register
from s2sjax.model.families import keymap
from s2sjax.data.formats.kimi_audio import ROWS
from s2sjax.model.attention import local_window, local_window_mask, LocalWindow, packed_attention_mask
from s2sjax.model.config import ConfigError
from s2sjax.model.kimi_audio import (NAME, KimiAudioConfig, abstract_params, hidden_states, param_logical_axes,
  sequence_log_probs, text_logits)
from s2sjax.data.packing import RowShape
from s2sjax.scoring.scorer import ScoringError, StreamScorer, row_mask, text_head_scores, windowed_scorer
from s2sjax.scoring.sequence_inputs import LogProbsError, check_range, sequence
from s2sjax.data.spec import AudioIds, Spec

# The Whisper-large-v3 encoder saved beside the LM (finetune_codes/model.py:63-75; read back by
# kimia_infer/api/prompt_manager.py:23-25): the feature track is computed from it.
WHISPER_FOLDER = "whisper-large-v3"

# KimiAudioConfig.__init__'s defaults (finetune_codes/configuration_moonshot_kimia.py:7-31), what from_pretrained
# gives a config.json that leaves a key out.
DEFAULTS: dict[str, Any] = {
  "vocab_size": 163840, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "rms_norm_eps": 1e-6,
  "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False, "kimia_mimo_layers": 6,
  "kimia_mimo_transformer_from_layer_index": 21, "kimia_audio_output_vocab": 16896,
  "kimia_text_output_vocab": 152064, "num_audio_special_tokens": 512, "kimia_token_offset": 152064,
  "use_whisper_feature": True, "kimia_adaptor_input_dim": 5120, "kimia_media_begin": 151661,
  "kimia_media_end": 151663,
}
# Switches the modeling file acts on that this port does not implement: refused unless they hold this value.
REFUSED = {"tie_word_embeddings": False, "use_sliding_window": False, "rope_scaling": None}
# Keys that do not change the forward: generation and training settings, bookkeeping, sizes the forward ignores
# (the rope table is recomputed past max_position_embeddings, :223-224; the padding row only matters to training).
INERT = ("architectures", "auto_map", "model_type", "torch_dtype", "transformers_version", "_name_or_path",
         "initializer_range", "use_cache", "attention_dropout", "max_position_embeddings", "max_window_layers",
         "sliding_window", "pad_token_id", "bos_token_id", "eos_token_id", "num_base_tokens",
         "kimia_mimo_audiodelaytokens")


def parse_config(cfg: Mapping[str, Any]) -> KimiAudioConfig:
  """A release's config.json -> KimiAudioConfig; a ConfigError names every key it refuses or does not know."""
  problems = [f"unknown config.json key {key!r}" for key in sorted(set(cfg) - set(DEFAULTS) - set(REFUSED)
                                                                    - set(INERT))]
  problems += [f"{key}={cfg[key]!r} is not supported (only {allowed!r})" for key, allowed in REFUSED.items()
               if cfg.get(key, allowed) != allowed]
  get = lambda key: cfg[key] if cfg.get(key) is not None else DEFAULTS[key]
  heads = int(get("num_attention_heads"))
  if int(get("hidden_size")) % heads:
    problems.append(f"hidden_size={get('hidden_size')} is not a multiple of num_attention_heads={heads}")
  if problems:
    raise ConfigError("Kimi-Audio config.json: " + "; ".join(problems))
  # The main stack is Qwen2's layer (MoonshotAttention: q/k/v biases, no o bias; Qwen2MLP; Qwen2RMSNorm).
  text = families.get("qwen2").layout(families.HF).parse_config({
    "model_type": "qwen2", "vocab_size": get("vocab_size"), "hidden_size": get("hidden_size"),
    "intermediate_size": get("intermediate_size"), "num_hidden_layers": get("num_hidden_layers"),
    "num_attention_heads": heads, "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
    "hidden_act": get("hidden_act"), "rms_norm_eps": get("rms_norm_eps"), "rope_theta": get("rope_theta"),
    "tie_word_embeddings": False})
  codes = int(get("kimia_audio_output_vocab")) - int(get("num_audio_special_tokens"))
  return KimiAudioConfig(
    decoder=text, mimo_layers=int(get("kimia_mimo_layers")),
    mimo_from_layer=int(get("kimia_mimo_transformer_from_layer_index")),
    adaptor_input_dim=int(get("kimia_adaptor_input_dim")) if get("use_whisper_feature") else None,
    token_offset=int(get("kimia_token_offset")), audio_codes=codes,
    text_output_vocab=int(get("kimia_text_output_vocab")), media_begin=int(get("kimia_media_begin")),
    media_end=int(get("kimia_media_end")))


# ---- the release's tensor keys ---------------------------------------------------------------------------------------

# MoonshotKimiaModel's audio branch and MoonshotKimiaForCausalLM's second head, in the decoder's KeyNames.
_BRANCH_NAMES = dataclasses.replace(
  keymap.HF_NAMES, final_norm="model.mimo_norm", lm_head="mimo_output",
  attn_norm="model.mimo_layers.{i}.input_layernorm", mlp_norm="model.mimo_layers.{i}.post_attention_layernorm",
  q="model.mimo_layers.{i}.self_attn.q_proj", k="model.mimo_layers.{i}.self_attn.k_proj",
  v="model.mimo_layers.{i}.self_attn.v_proj", o="model.mimo_layers.{i}.self_attn.o_proj",
  gate="model.mimo_layers.{i}.mlp.gate_proj", up="model.mimo_layers.{i}.mlp.up_proj",
  down="model.mimo_layers.{i}.mlp.down_proj")
_BRANCH_TARGETS = {"layers": "mimo_layers", "final_norm": "mimo_norm", "lm_head": "mimo_output"}
ADAPTOR = "model.vq_adaptor.layers"  # nn.Sequential: 0 Linear, 1 SiLU, 2 Dropout, 3 Linear, 4 LayerNorm


def rules(config: KimiAudioConfig) -> list[keymap.Rule]:
  """Every leaf of `abstract_params(config)` from the release's keys (meta.json's llm_state_dict_keys in the oracle):
  the main stack as transformers' Qwen2, the branch under `model.mimo_layers` / `model.mimo_norm` / `mimo_output`,
  the adaptor's Sequential. Rules of stacked leaves read one piece per layer."""
  out = keymap.decoder_rules(config.decoder, keymap.HF_NAMES)
  branch = keymap.decoder_rules(dataclasses.replace(config.decoder, num_layers=config.mimo_layers), _BRANCH_NAMES)
  out += [dataclasses.replace(r, target=(_BRANCH_TARGETS[r.target[0]],) + r.target[1:]) for r in branch
          if r.target[0] in _BRANCH_TARGETS]
  if config.adaptor_input_dim:
    d, f = config.decoder.hidden_size, config.adaptor_input_dim
    linear = lambda target, index, n_in: [
      keymap.Rule(("vq_adaptor", target, "kernel"), (keymap.Piece(f"{ADAPTOR}.{index}.weight", (d, n_in)),), "linear"),
      keymap.copy_rule(("vq_adaptor", target, "bias"), f"{ADAPTOR}.{index}.bias", (d,))]
    out += linear("in", 0, f) + linear("out", 3, d)
    out += [keymap.copy_rule(("vq_adaptor", "norm", "scale"), f"{ADAPTOR}.4.weight", (d,)),
            keymap.copy_rule(("vq_adaptor", "norm", "bias"), f"{ADAPTOR}.4.bias", (d,))]
  return out


# ---- the scoring step over packed rows -------------------------------------------------------------------------------


def score_batch(config: KimiAudioConfig, dtype, target_chunk: int, num_slots: int, params, batch: dict,
                attention: str = "xla", window: LocalWindow | None = None) -> dict:
  """Per target [B, M] `target_nll` (the token's NLL under the text head, over the full vocabulary as
  utils/sampler.py:138 reads it), per slot [B, C] `nll_sum` and `n_tokens`, as `s2sjax.scoring.scorer.score_batch` for the
  decoder. Attention is the decoder's over segment / branch ids (a prefix shared by its candidates; item-local with
  a `window`). Rows of a written prefix carry a feature track of width 0. Pure; jitted by the scorer."""
  features = batch["features"] if batch["features"].shape[-1] else None
  text, _ = hidden_states(config, params, batch["audio_ids"], batch["text_ids"], features, batch["continuous"] > 0,
                          batch["positions"], row_mask(batch, window), batch["segment_ids"], batch["branch_ids"],
                          dtype=dtype, attention=attention, window=window, audio_head=False)
  return text_head_scores(lambda h: text_logits(params, h), text, batch, target_chunk, num_slots)


def check_ids(rows: Mapping[str, np.ndarray], config: KimiAudioConfig) -> None:
  """Ids beyond the embedding (clamped silently by the gather) and feature rows the adaptor cannot read: refused,
  naming the field, row and position."""
  for field in ("audio_ids", "text_ids", "target_ids"):
    bad = np.argwhere((rows[field] < 0) | (rows[field] >= config.vocab_size))
    if len(bad):
      r, pos = bad[0]
      raise ScoringError(f"{field}[row {r}, position {pos}] = {rows[field][r, pos]} is outside the embedding table "
                         f"({config.vocab_size} rows); {len(bad)} such ids in all")
  if (rows["continuous"] > 0).any():
    width = rows["features"].shape[-1]
    if width != config.adaptor_input_dim:
      raise ScoringError(f"rows have continuous positions but features of width {width}; the adaptor reads "
                         f"{config.adaptor_input_dim or 'none (use_whisper_feature is false)'}")


def scorer(config: KimiAudioConfig, shape: RowShape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
           attention: str = "xla") -> StreamScorer:
  """The compiled step over `kimi_audio` rows of `shape` (item-local attention where the shape records its longest
  item), driven by the generic row scorer."""
  return windowed_scorer(config, shape, score_batch, check_ids, abstract_params(config), param_logical_axes(config),
                         ROWS, mesh, batch_size, dtype, attention)


# ---- a spec's ids against the checkpoint: the evaluator's fit check and the pre-flight's verdicts --------------------


def spec_checks(config: KimiAudioConfig, spec: Spec, ids: AudioIds | None = None) -> list[tuple[str, bool, str]]:
  """Whether the rows a spec lays are the ids this checkpoint reads: its codes at the config's offset and within its
  code range, its feature track the adaptor's width. (The media markers are the tokenizer's, by name: `check_fit`
  holds the rows' own to the config.)"""
  options = spec.options or {}
  return [
    ("code offset", options.get("token_offset") == config.token_offset,
     f"spec {spec.name} lays code k at audio id {options.get('token_offset')} + k; the checkpoint's kimia_token_offset "
     f"is {config.token_offset}"),
    ("code range", bool(spec.codebook_sizes) and spec.codebook_sizes[0] <= config.audio_codes,
     f"spec {spec.name}'s {spec.codebook_sizes[0] if spec.codebook_sizes else 0} codes against the checkpoint's "
     f"{config.audio_codes}"),
    ("feature width", options.get("feature_width") == config.adaptor_input_dim,
     f"spec {spec.name} lays Whisper features of width {options.get('feature_width')}; the checkpoint's adaptor reads "
     f"{config.adaptor_input_dim}"),
  ]


def media_markers(rows: Mapping[str, np.ndarray]) -> tuple[set[int], set[int]]:
  """The audio-stream ids just before and just after each run of continuous rows: what the rows open and close
  their audio messages with."""
  continuous = rows["continuous"] > 0
  opens = continuous[:, 1:] & ~continuous[:, :-1]
  closes = continuous[:, :-1] & ~continuous[:, 1:]
  audio = rows["audio_ids"]
  return set(audio[:, :-1][opens].tolist()), set(audio[:, 1:][closes].tolist())


def check_fit(config: KimiAudioConfig, data) -> None:
  """Data laid for this checkpoint (a spoken prefix's checks; text rows carry no audio): its spec's offset, codes
  and feature width, and the media markers its rows hold, the config's."""
  if modalities.get(data.modality).prefix != modalities.SPEECH:
    return
  failed = [f"{check}: {detail}" for check, ok, detail in spec_checks(config, data.metadata.spec) if not ok]
  opening, closing = media_markers(data.rows)
  if not opening <= {config.media_begin} or not closing <= {config.media_end}:
    failed.append(f"media markers: the rows open their audio with ids {sorted(opening)} and close it with "
                  f"{sorted(closing)}; the checkpoint's kimia_media_begin / kimia_media_end are {config.media_begin} / "
                  f"{config.media_end} (build with the release's own tokenizer)")
  if failed:
    raise FitError(f"{data.task}/{data.modality} does not fit this Kimi-Audio checkpoint: " + "; ".join(failed))


# ---- one sequence's log-probs (s2sjax.logprobs) ----------------------------------------------------------------------


def continuous_rows(config: KimiAudioConfig, audio_ids: np.ndarray) -> np.ndarray:
  """bool [T]: the rows between the audio stream's media_begin and media_end, where the model places a message's
  Whisper features (modeling_kimia.py:678-698; one audio message per sequence, kimia_prompt's rule)."""
  begins, ends = np.flatnonzero(audio_ids == config.media_begin), np.flatnonzero(audio_ids == config.media_end)
  mask = np.zeros(len(audio_ids), bool)
  if len(begins) > 1 or len(begins) != len(ends) or (len(begins) and ends[0] < begins[0]):
    raise LogProbsError(f"the audio stream holds {len(begins)} media_begin ({config.media_begin}) and {len(ends)} "
                        f"media_end ({config.media_end}) ids: Kimi-Audio reads one audio message, opened then closed")
  if len(begins):
    mask[begins[0] + 1 : ends[0]] = True
  return mask


def log_probs(config: KimiAudioConfig, params, input_ids: np.ndarray, audio_codes: np.ndarray | None = None,
              features: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(text head, audio head) fp32 log-softmax [T, vocab] of one request. `input_ids` [2, T]: the audio stream
  (upstream's `input_ids`) over the text stream (`text_input_ids`); `features` [N, adaptor_input_dim]: its audio
  message's Whisper features (`whisper_input_feature`), read at the rows between media_begin and media_end."""
  streams = np.asarray(input_ids)
  if streams.ndim != 2 or streams.shape[0] != 2 or not np.issubdtype(streams.dtype, np.integer):
    raise LogProbsError(f"a Kimi-Audio checkpoint reads input_ids [2, T]: the audio stream, then the text stream; got "
                        f"{streams.dtype} {streams.shape}")
  if audio_codes is not None:
    raise LogProbsError("a Kimi-Audio checkpoint reads its codes on the audio stream (input_ids[0], code + "
                        "kimia_token_offset): --audio_codes does not apply")
  audio, text = sequence(streams[0]), sequence(streams[1])
  check_range("input_ids[0]", audio, config.vocab_size, "the embedding's rows")
  check_range("input_ids[1]", text, config.vocab_size, "the embedding's rows")
  continuous = continuous_rows(config, audio)
  track = None
  if continuous.any():
    if features is None:
      raise LogProbsError(f"the audio stream holds an audio message of {int(continuous.sum())} code rows: pass its "
                          f"Whisper features as --features [{int(continuous.sum())}, {config.adaptor_input_dim}]")
    rows = np.asarray(features, np.float32)
    if rows.ndim != 2 or rows.shape[1] != config.adaptor_input_dim or len(rows) < continuous.sum():
      raise LogProbsError(f"features must be [N >= {int(continuous.sum())}, {config.adaptor_input_dim}] (one row per "
                          f"code row of the audio message); got {rows.shape}")
    track = np.zeros((len(audio), rows.shape[1]), np.float32)
    track[continuous] = rows[: continuous.sum()]
  elif features is not None:
    raise LogProbsError("features given, but the audio stream holds no audio message (media_begin ... media_end)")
  return sequence_log_probs(config, params, audio, text, track, continuous)


# Kimi-Audio-7B / -7B-Instruct's config.json (moonshotai; the sizes as the upstream oracle's PROVENANCE.txt lists
# them beside its scaled copy): what the planner sizes a run of the real model by.
KIMI_AUDIO_7B = {
  "architectures": ["MoonshotKimiaForCausalLM"], "model_type": "qwen2", "vocab_size": 168448, "hidden_size": 3584,
  "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
  "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "kimia_mimo_layers": 6,
  "kimia_mimo_transformer_from_layer_index": 21, "kimia_audio_output_vocab": 16896, "kimia_text_output_vocab": 152064,
  "num_audio_special_tokens": 512, "kimia_token_offset": 152064, "use_whisper_feature": True,
  "kimia_adaptor_input_dim": 5120, "kimia_media_begin": 151661, "kimia_media_end": 151663,
}


ARCHITECTURE = register(Architecture(
  NAME, KimiAudioConfig, ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.text_output_vocab, check_fit=check_fit, check_ids=check_ids,
  parse_config=parse_config, spec_checks=spec_checks, log_probs=log_probs, planned=lambda config: config.decoder,
  planner_shapes={"kimi-audio-7b": KIMI_AUDIO_7B}))
