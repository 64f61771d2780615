"""Kimi-Audio-7B (base and Instruct) as an architecture of its own: its release config.json read into a
`KimiAudioConfig` (every switch read or refused by name), the release's tensor keys, its scoring step over packed
rows of two id streams and a Whisper feature track, and its registration (config class, parameter tree and axes,
converter). The network is `s2sjax.model.kimi_audio`; the converter `checkpoints_conversion/kimi_release.py`.

Why not a family of the shared decoder: Kimi reads two id streams through one table, mixes continuous Whisper
features in at the code rows and has a second head on a branch of six layers, none of which `ModelConfig` says.

Rows. Until the data side's typed row fields exist, the step's rows are `KIMI_ROWS` (two id streams, the continuous
mask, targets with the head that scores each) plus a float `features [L, 4 x Whisper d_model]` field beside them
that `RowFormat` cannot declare yet (its fields are int32): `KimiScorer` lays it itself. No spec lays these rows
yet, so no build reaches this architecture through `architectures.for_spec`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax import families
from s2sjax.architectures.architecture import Architecture, FitError, register
from s2sjax.families import keymap
from s2sjax.model import layers
from s2sjax.model.config import ConfigError
from s2sjax.model.kimi_audio import (NAME, KimiAudioConfig, abstract_params, hidden_states, audio_logits,
                                     param_logical_axes, text_logits)
from s2sjax.packing import RowShape
from s2sjax.rows import Field, RowFormat
from s2sjax.scoring import ScoringError, _RowScorer, by_target_chunks

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

TEXT_HEAD, AUDIO_HEAD = 0, 1  # target_head: which head scores a target (the text stream's or the audio stream's)

KIMI_ROWS = RowFormat(
  "kimi_streams", marker="audio_tokens",
  own_positions=(Field("audio_tokens", "L", 0), Field("text_tokens", "L", 0), Field("continuous", "L", 0)),
  own_targets=(Field("target_ids", "M", 0), Field("target_head", "M", TEXT_HEAD)),
  scored=("audio_tokens", "text_tokens", "continuous", "target_pos", "target_ids", "target_head"),
  audio_mode=NAME,
)
FEATURES = "features"  # [L, adaptor_input_dim] float32 beside KIMI_ROWS' fields: the Whisper feature of each row


def score_batch(config: KimiAudioConfig, dtype, target_chunk: int, num_slots: int, params, batch: dict,
                audio_head: bool = True, attention: str = "xla", window: layers.LocalWindow | None = None) -> dict:
  """Per target [B, M] `target_nll` (the token's NLL under the head `target_head` names), per slot [B, C]
  `nll_sum` and `n_tokens`, as `s2sjax.scoring.score_batch` for the decoder. Attention is the decoder's over
  segment / branch ids (a prefix shared by its candidates; item-local with a `window`). Without `audio_head` the
  branch is not run and every target must be the text head's. Pure; jitted by `KimiScorer`."""
  if window:
    mask = layers.local_window_mask(batch["segment_ids"], batch["branch_ids"], window)
  else:
    mask = layers.packed_attention_mask(batch["segment_ids"], batch["branch_ids"])
  features = batch[FEATURES] if batch[FEATURES].shape[-1] else None  # width 0: rows without audio
  text, audio = hidden_states(config, params, batch["audio_tokens"], batch["text_tokens"], features,
                              batch["continuous"] > 0, batch["positions"], mask, batch["segment_ids"],
                              batch["branch_ids"], dtype=dtype, attention=attention, window=window,
                              audio_head=audio_head)
  gather = lambda h: jnp.take_along_axis(h, batch["target_pos"][..., None], axis=1)

  def nll_of(logits, ids):
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]

  if audio_head:
    def target_nll(text_h, audio_h, ids, head):
      return jnp.where(head == AUDIO_HEAD, nll_of(audio_logits(params, audio_h), ids),
                       nll_of(text_logits(params, text_h), ids))
    nll = by_target_chunks(target_nll, target_chunk, gather(text), gather(audio), batch["target_ids"],
                           batch["target_head"])
  else:
    nll = by_target_chunks(lambda h, ids: nll_of(text_logits(params, h), ids), target_chunk, gather(text),
                           batch["target_ids"])
  onehot = (batch["target_slot"][..., None] == jnp.arange(num_slots)).astype(jnp.float32)
  return {"target_nll": nll, "nll_sum": jnp.einsum("bm,bmc->bc", nll, onehot, precision=jax.lax.Precision.HIGHEST),
          "n_tokens": onehot.sum(axis=1).astype(jnp.int32)}


def check_rows(rows: Mapping[str, np.ndarray], config: KimiAudioConfig, audio_head: bool) -> None:
  """Ids beyond the embedding (clamped silently by the gather), features of the wrong width, audio-head targets for
  a step without the branch: refused, naming the field, row and position."""
  for field in ("audio_tokens", "text_tokens", "target_ids"):
    bad = np.argwhere((rows[field] < 0) | (rows[field] >= config.vocab_size))
    if len(bad):
      r, pos = bad[0]
      raise ScoringError(f"{field}[row {r}, position {pos}] = {rows[field][r, pos]} is outside the embedding table "
                         f"({config.vocab_size} rows); {len(bad)} such ids in all")
  if (rows["continuous"] > 0).any():
    width = rows[FEATURES].shape[-1]
    if width != config.adaptor_input_dim:
      raise ScoringError(f"rows have continuous positions but {FEATURES} of width {width}; the adaptor reads "
                         f"{config.adaptor_input_dim or 'none (use_whisper_feature is false)'}")
  if not audio_head and (rows["target_head"] == AUDIO_HEAD).any():
    raise ScoringError("rows score targets with the audio head, but the step was built without it (audio_head=True)")


class KimiScorer(_RowScorer):
  """`s2sjax.scoring.Scorer` for Kimi-Audio rows (`KIMI_ROWS` and their `features`): one compiled step per row shape
  over a mesh, rows split over processes. `features=False` compiles the step for rows without audio (T->T), which
  then carry no feature track; `audio_head=False` for rows whose targets are all the text head's (the branch is
  not run)."""

  def __init__(self, config: KimiAudioConfig, shape: RowShape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
               attention: str = "xla", target_chunk: int = 256, audio_head: bool = True, features: bool = True,
               local_attention: bool = True):
    self.audio_head = audio_head
    window = layers.local_window(shape.max_item, shape.length) if local_attention else None
    width = (config.adaptor_input_dim or 0) if features else 0

    def empty(count: int, rows: dict) -> dict:
      padding = KIMI_ROWS.empty(count, shape, width=0)
      padding[FEATURES] = np.zeros((count, shape.length, width), np.float32)
      return padding

    score = lambda params, batch: score_batch(config, dtype, target_chunk, shape.max_slots, params, batch,
                                              audio_head, attention, window)
    super().__init__(config, shape, mesh, batch_size, param_logical_axes(config), abstract_params(config),
                     KIMI_ROWS.step_fields + (FEATURES,), {FEATURES: 3}, empty, score)

  def score(self, params, rows: dict[str, np.ndarray], progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Scores all rows (the same full set on every process; rows without audio may leave `features` out); returns
    (nll_sum, n_tokens) [R, C]."""
    if FEATURES not in rows:
      rows = {**rows, FEATURES: np.zeros(rows["segment_ids"].shape + (0,), np.float32)}
    check_rows(rows, self.config, self.audio_head)
    slots = self._score_rows(params, rows, progress)
    return slots["nll_sum"], slots["n_tokens"]


def scorer(config: KimiAudioConfig, shape: RowShape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
           attention: str = "xla") -> KimiScorer:
  return KimiScorer(config, shape, mesh=mesh, batch_size=batch_size, dtype=dtype, attention=attention)


def check_fit(config: KimiAudioConfig, data) -> None:
  """No build lays Kimi-Audio's rows yet: its builder comes with the data side's feature-carrying row formats."""
  raise FitError(f"{data.task}/{data.modality}: no build lays Kimi-Audio's rows yet (two id streams and the Whisper "
                 "feature track); its data is built once the row formats carry float features")


ARCHITECTURE = register(Architecture(
  NAME, KimiAudioConfig, KIMI_ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.text_output_vocab, check_fit=check_fit,
  converter="checkpoints_conversion.kimi_release:convert"))
