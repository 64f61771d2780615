"""MiMo-Audio-7B-Base as an architecture of its own: its release config.json (and its tokenizer's <|empty|> id) read
into a `MimoAudioConfig`, every switch read or refused by name, the release's tensor keys, its scoring step over the
`mimo_audio` input format's rows (text targets by the text head, speech patches by the patch decoder), the
evaluator's and the pre-flight's checks of a spec against a checkpoint, the log-probs hook and its registration.
The network is `s2sjax.model.mimo_audio`; the converter `checkpoints_conversion/mimo_release.py`, which
`checkpoints_conversion.convert` runs for a release naming `MiMoAudioForCausalLM`, with no flags.

Why not a family of the shared decoder: a position of its global stack is a patch of one text id and 4 x 8 RVQ
codes, read through a transformer of its own (the input local transformer), and its speech is predicted by a
second one (the patch decoder) with per-channel heads and a delay pattern; none of which `ModelConfig` says.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax.data import modalities
from s2sjax.data.formats.mimo_audio import ROWS
from s2sjax.data.packing import RowShape
from s2sjax.data.spec import AudioIds, Spec
from s2sjax.model import families
from s2sjax.scoring.architectures.architecture import Architecture, FitError, register
from s2sjax.model.families import keymap
from s2sjax.model.attention import LocalWindow
from s2sjax.model.config import ConfigError, ModelConfig
from s2sjax.model.mimo_audio import (NAME, MimoAudioConfig, abstract_params, embed_patches, global_hidden,
  param_logical_axes, patch_nll, sequence_outputs, split_input_ids, text_logits)
from s2sjax.scoring.scorer import ScoringError, StreamScorer, by_target_chunks, row_mask, slot_scores, windowed_scorer
from s2sjax.scoring.sequence_inputs import LogProbsError

# The key under which the converter hands parse_config the <|empty|> id of the release's text tokenizer: upstream
# reads it from the tokenizer (MiMoAudioArguments.empty_idx, mimo_audio.py:69-86), not from config.json.
EMPTY_ID_KEY = "empty_idx"
EMPTY_TOKEN = "<|empty|>"
RELEASE_CLASS = "MiMoAudioForCausalLM"

# MiMoAudioConfig.__init__'s defaults (modeling_mimo_audio.py:118-135), what from_pretrained gives a config.json
# that leaves a key out.
DEFAULTS: dict[str, Any] = {
  "speech_vocab_size": "1025-1025-129-129-129-129-129-129", "speech_zeroemb_idx": "1024-1024-128-128-128-128-128-128",
  "delay_pattern": "0-1-2-3-4-5-6-7", "head_dim": 128, "group_size": 4, "audio_channels": 8, "local_dim": 1024,
  "local_layers": 16, "local_attn_heads": 64, "local_ffn_dim": 4096, "input_local_layers": 6,
  "input_local_dim": None, "input_full_attention": None,
}
# Qwen2Config keys the global stack reads (the rest of the Qwen2 config is the family's parser's business).
QWEN2_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "hidden_act", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
              "max_position_embeddings")
# Switches the modeling file acts on that this port does not implement: refused unless they hold this value.
REFUSED = {"tie_word_embeddings": False, "use_sliding_window": False, "rope_scaling": None}
# Keys that do not change the scoring forward: generation and training settings, bookkeeping (dropout is off at
# evaluation; sliding_window acts only with use_sliding_window, PROVENANCE CONVENTIONS 13).
INERT = ("architectures", "auto_map", "model_type", "torch_dtype", "transformers_version", "_name_or_path",
         "initializer_range", "use_cache", "attention_dropout", "local_attn_dropout", "sliding_window",
         "max_window_layers", "bos_token_id", "eos_token_id", "pad_token_id", EMPTY_ID_KEY)


def _per_channel(cfg: Mapping[str, Any], key: str, channels: int) -> tuple[int, ...]:
  """MiMoAudioConfig._parse_maybe_list (:163-166): "a-b-c" per channel, or one number for all."""
  value = cfg.get(key, DEFAULTS[key])
  if isinstance(value, str) and "-" in value:
    return tuple(int(part) for part in value.split("-"))
  return (int(value),) * channels


def parse_config(cfg: Mapping[str, Any]) -> MimoAudioConfig:
  """A release's config.json (with the tokenizer's <|empty|> id under EMPTY_ID_KEY) -> MimoAudioConfig; a
  ConfigError names every key it refuses or does not know."""
  known = set(DEFAULTS) | set(QWEN2_KEYS) | set(REFUSED) | set(INERT)
  problems = [f"unknown config.json key {key!r}" for key in sorted(set(cfg) - known)]
  problems += [f"{key}={cfg[key]!r} is not supported (only {allowed!r})" for key, allowed in REFUSED.items()
               if cfg.get(key, allowed) != allowed]
  if cfg.get("model_type", "qwen2") != "qwen2":
    problems.append(f"model_type={cfg['model_type']!r} is not MiMo-Audio's ('qwen2': MiMoAudioConfig is a Qwen2Config)")
  if cfg.get(EMPTY_ID_KEY) is None:
    problems.append(f"the text tokenizer's {EMPTY_TOKEN} id is not given ({EMPTY_ID_KEY}; the converter reads it from "
                    "the release's tokenizer files)")
  if problems:
    raise ConfigError("MiMo-Audio config.json: " + "; ".join(problems))
  get = lambda key: cfg[key] if cfg.get(key) is not None else DEFAULTS[key]
  global_stack = families.get("qwen2").layout(families.HF).parse_config(dict(
    {key: cfg[key] for key in QWEN2_KEYS if key in cfg}, model_type="qwen2", head_dim=get("head_dim")))
  channels = int(get("audio_channels"))
  heads = int(get("local_attn_heads"))
  input_dim = int(cfg.get("input_local_dim") or get("local_dim"))

  def stack(width: int, depth: int, ffn: int) -> ModelConfig:
    # local_config / input_local_config (:168-199): the global config with its width, depth, heads (no GQA)
    if width % heads:
      raise ConfigError(f"MiMo-Audio config.json: a local width of {width} does not split into {heads} heads")
    return dataclasses.replace(global_stack, hidden_size=width, num_layers=depth, num_heads=heads,
                               num_kv_heads=heads, head_dim=width // heads, rotary_dim=width // heads,
                               intermediate_size=ffn)

  return MimoAudioConfig(
    decoder=global_stack,
    input_local=stack(input_dim, int(get("input_local_layers")), 4 * input_dim),
    local=stack(int(get("local_dim")), int(get("local_layers")), int(get("local_ffn_dim"))),
    group_size=int(get("group_size")), speech_vocab_sizes=_per_channel(cfg, "speech_vocab_size", channels),
    empty_codes=_per_channel(cfg, "speech_zeroemb_idx", channels),
    delays=_per_channel(cfg, "delay_pattern", channels), empty_id=int(cfg[EMPTY_ID_KEY]),
    input_full_attention=bool(cfg.get("input_full_attention")))


# ---- the release's tensor keys ---------------------------------------------------------------------------------------


def _stack_names(prefix: str) -> keymap.KeyNames:
  """A Qwen2Model under `prefix` (input_local_transformer, local_transformer): only its layers and norm are read."""
  return dataclasses.replace(
    keymap.HF_NAMES, embed=f"{prefix}.embed_tokens", final_norm=f"{prefix}.norm", lm_head=f"{prefix}.lm_head",
    **{field: getattr(keymap.HF_NAMES, field).replace("model.", f"{prefix}.", 1)
       for field in ("attn_norm", "mlp_norm", "q", "k", "v", "o", "gate", "up", "down")})


def rules(config: MimoAudioConfig) -> list[keymap.Rule]:
  """Every leaf of `abstract_params(config)` from the release's keys (meta.json's llm_state_dict in the oracle)."""
  out = keymap.decoder_rules(config.decoder, keymap.HF_NAMES)
  for target, prefix, stack in (("input_local", "input_local_transformer", config.input_local),
                                ("local", "local_transformer", config.local)):
    out += [dataclasses.replace(r, target=(target,) + r.target)
            for r in keymap.decoder_rules(stack, _stack_names(prefix)) if r.target[0] in ("layers", "final_norm")]
  d_in, d_local, d = config.input_local.hidden_size, config.local.hidden_size, config.decoder.hidden_size
  linear = lambda target, key, n_in, n_out: keymap.Rule(target, (keymap.Piece(key, (n_out, n_in)),), "linear")
  for c, n in enumerate(config.speech_vocab_sizes):
    out.append(keymap.copy_rule(("speech_embed", str(c), "embedding"), f"speech_embeddings.{c}.weight", (n, d_in)))
    out.append(linear(("local_heads", str(c), "kernel"), f"local_transformer_lm_heads.{c}.weight", d_local, n))
  out.append(linear(("speech_group_downcast", "kernel"), "speech_group_downcast.weight", config.group_size * d_in, d))
  out.append(linear(("hidden_states_downcast", "kernel"), "hidden_states_downcast.weight", d, d_local))
  if config.projects_speech_to_local:
    out.append(linear(("speech_to_local", "kernel"), "speech_embeddings_to_local.weight", d_in, d_local))
  return out


def empty_token_id(tokenizer_dir: str) -> int:
  """The <|empty|> id of a release's text tokenizer (tokenizer.json's added tokens), as upstream resolves it
  (mimo_audio.py:69-76)."""
  from s2sjax.data import text_tokenizer

  tokenizer = text_tokenizer.load(tokenizer_dir)
  found = tokenizer.convert_tokens_to_ids(EMPTY_TOKEN)
  if found is None or found == tokenizer.unk_token_id:
    raise FitError(f"{tokenizer_dir}: the text tokenizer has no {EMPTY_TOKEN} token, which MiMo-Audio's speech "
                   "patches carry")
  return int(found)


# MiMo-Audio-7B-Base's config.json (XiaomiMiMo; the sizes as the upstream oracle's PROVENANCE.txt lists them beside its
# scaled copy): what the planner sizes a run of the real model by. The <|empty|> id changes no size.
MIMO_AUDIO_7B = {
  "architectures": [RELEASE_CLASS], "model_type": "qwen2", "vocab_size": 151680, "hidden_size": 4096,
  "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
  "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 640000,
  "max_position_embeddings": 8192, "tie_word_embeddings": False, "group_size": 4, "audio_channels": 8,
  "delay_pattern": "0-1-2-3-4-5-6-7", "speech_vocab_size": "1025-1025-129-129-129-129-129-129",
  "speech_zeroemb_idx": "1024-1024-128-128-128-128-128-128", "local_dim": 1024, "local_layers": 16,
  "local_attn_heads": 64, "local_ffn_dim": 4096, "input_local_layers": 6, "input_local_dim": 1024,
  "input_full_attention": True, EMPTY_ID_KEY: 0,
}


# ---- the scoring step over packed rows -------------------------------------------------------------------------------


def score_batch(config: MimoAudioConfig, dtype, target_chunk: int, num_slots: int, params, batch: dict,
                attention: str = "xla", window: LocalWindow | None = None) -> dict:
  """Per target [B, M] `target_nll`, per slot [B, C] `nll_sum` and `n_tokens`, as `s2sjax.scoring.scorer.score_batch`
  for the decoder; each target is read from the global state after the patch at `target_pos`:

    a text target (target_ids >= 0)   its NLL under the text head over the full vocabulary;
    a speech target (target_ids -1)   its patch's NLL under the patch decoder, teacher forced: every channel's
                                      code of every frame (the full head's softmax), summed (`patch_nll`);
                                      and per target [B, M, channels] `target_details`: each channel's part of
                                      it (its 4 frames summed; 0 at a text target): `details`.

  A position is a patch; attention is the decoder's over segment / branch ids (a prefix shared by its candidates;
  item-local with a `window`). The patch decoder runs only for chunks holding a speech target. Pure; jitted by
  the scorer."""
  text_ids = batch["text_ids"]
  codes = batch["patch_codes"].reshape(text_ids.shape + (config.group_size, config.channels))
  inputs = embed_patches(config, params, text_ids, codes, dtype)["inputs"]
  hidden = global_hidden(config, params, inputs, batch["positions"], row_mask(batch, window), batch["segment_ids"],
                         batch["branch_ids"], dtype=dtype, attention=attention, window=window)
  gathered = jnp.take_along_axis(hidden, batch["target_pos"][..., None], axis=1)

  def nll_of(h, ids, target_codes):
    logits = text_logits(params, h)
    text = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, jnp.maximum(ids, 0)[..., None], -1)[..., 0]
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    patches = jnp.maximum(target_codes, 0).reshape(ids.shape + (config.group_size, config.channels))
    per_channel = jax.lax.cond(
      (ids < 0).any(), lambda: patch_nll(config, params, flat(h), flat(patches), dtype).reshape(ids.shape + (-1,)),
      lambda: jnp.zeros(ids.shape + (config.channels,), jnp.float32))
    speech = ids[..., None] < 0
    return jnp.where(speech[..., 0], per_channel.sum(-1), text), jnp.where(speech, per_channel, 0.0)

  nll, per_channel = by_target_chunks(nll_of, target_chunk, gathered, batch["target_ids"], batch["target_codes"])
  return dict(slot_scores(nll, batch, num_slots), target_details=per_channel)


def details(config: MimoAudioConfig) -> tuple[str, ...]:
  """A spoken candidate's NLL per RVQ channel, each summed over its patches' frames: their sum is its NLL."""
  return tuple(f"nll_sum_channel_{c}" for c in range(config.channels))


def _code_problem(field: str, codes: np.ndarray, where: np.ndarray, config: MimoAudioConfig) -> str | None:
  """The first code of `field` [R, N, group * channels] (at the [R, N] entries `where`) past its channel's table."""
  sizes = np.tile(np.asarray(config.speech_vocab_sizes), config.group_size)
  bad = np.argwhere(((codes < 0) | (codes >= sizes)) & where[..., None])
  if not len(bad):
    return None
  r, pos, column = bad[0]
  channel = column % config.channels
  return (f"{field}[row {r}, position {pos}] frame {column // config.channels} channel {channel} = "
          f"{codes[r, pos, column]} is outside channel {channel}'s {config.speech_vocab_sizes[channel]} rows; "
          f"{len(bad)} such codes in all")


def check_ids(rows: Mapping[str, np.ndarray], config: MimoAudioConfig) -> None:
  """Ids beyond a table (clamped silently by the gather) refused, naming the field, row, position and channel: text
  ids, text targets, every patch's codes and every speech target's (target_ids -1)."""
  for field, low in (("text_ids", 0), ("target_ids", -1)):
    bad = np.argwhere((rows[field] < low) | (rows[field] >= config.vocab_size))
    if len(bad):
      r, pos = bad[0]
      raise ScoringError(f"{field}[row {r}, position {pos}] = {rows[field][r, pos]} is outside the text table "
                         f"({config.vocab_size} rows); {len(bad)} such ids in all")
  width = config.group_size * config.channels
  for field in ("patch_codes", "target_codes"):
    if rows[field].shape[-1] != width:
      raise ScoringError(f"rows lay {rows[field].shape[-1]} {field} a patch; the checkpoint reads "
                         f"{config.group_size} frames of {config.channels} channels")
  problem = (_code_problem("patch_codes", rows["patch_codes"], np.ones(rows["patch_codes"].shape[:-1], bool), config)
             or _code_problem("target_codes", rows["target_codes"], rows["target_ids"] < 0, config))
  if problem:
    raise ScoringError(problem)


def scorer(config: MimoAudioConfig, shape: RowShape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
           attention: str = "xla") -> StreamScorer:
  """The compiled step over `mimo_audio` rows of `shape` (item-local attention where the shape records its longest
  item), driven by the generic row scorer."""
  return windowed_scorer(config, shape, score_batch, check_ids, abstract_params(config), param_logical_axes(config),
                         ROWS, mesh, batch_size, dtype, attention)


# ---- a spec's ids against the checkpoint: the evaluator's fit check and the pre-flight's verdicts --------------------


def spec_checks(config: MimoAudioConfig, spec: Spec, ids: AudioIds | None = None) -> list[tuple[str, bool, str]]:
  """Whether the rows a spec lays are what this checkpoint reads: its frames per patch and its channels, each
  channel's codes below that channel's empty id (which a text patch carries)."""
  options = spec.options or {}
  return [
    ("group size", options.get("group_size") == config.group_size,
     f"spec {spec.name} lays {options.get('group_size')} frames a patch; the checkpoint's group_size is "
     f"{config.group_size}"),
    ("codebooks", tuple(spec.codebook_sizes) == config.empty_codes,
     f"spec {spec.name}'s codebooks {tuple(spec.codebook_sizes)} against the checkpoint's channels, whose empty ids "
     f"(speech_zeroemb_idx) are {config.empty_codes}"),
  ]


def check_fit(config: MimoAudioConfig, data) -> None:
  """Data laid for this checkpoint: its spec's patch shape and codebooks, and (a spoken prefix) its speech patches'
  text id, the checkpoint's <|empty|>."""
  failed = [f"{check}: {detail}" for check, ok, detail in spec_checks(config, data.metadata.spec) if not ok]
  if modalities.get(data.modality).prefix == modalities.SPEECH:
    sizes = np.tile(np.asarray(data.metadata.spec.codebook_sizes), config.group_size)
    codes = data.rows["patch_codes"]
    laid = data.rows["segment_ids"] > 0
    speech = laid & ((codes != sizes).any(-1) if codes.shape[-1] == len(sizes) else False)
    marks = set(np.unique(data.rows["text_ids"][speech]).tolist())
    if marks and marks != {config.empty_id}:
      failed.append(f"speech patches: the rows' speech patches carry text ids {sorted(marks)}; the checkpoint's "
                    f"{EMPTY_TOKEN} is {config.empty_id} (build with the release's own tokenizer)")
  if failed:
    raise FitError(f"{data.task}/{data.modality} does not fit this MiMo-Audio checkpoint: " + "; ".join(failed))


# ---- one sequence's log-probs (s2sjax.logprobs) ----------------------------------------------------------------------


def log_probs(config: MimoAudioConfig, params, input_ids: np.ndarray, audio_codes: np.ndarray | None = None,
              features: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(text head [T, vocab] after every patch, patch decoder [T - 1, group_size, channels, max channel vocab]) fp32
  log-softmax of one request. `input_ids` [1 + channels, group_size * T] as upstream's get_input_ids lays it (text
  in each patch's first slot); the patch decoder's row g is patch g + 1's codes read from patch g, teacher
  forced, -inf past a channel's own vocabulary."""
  ids = np.asarray(input_ids)
  rows, width = 1 + config.channels, config.group_size
  if ids.ndim != 2 or ids.shape[0] != rows or ids.shape[1] % width or not ids.shape[1] \
      or not np.issubdtype(ids.dtype, np.integer):
    raise LogProbsError(f"a MiMo-Audio checkpoint reads input_ids [{rows}, {width} x patches] (the text row, then "
                        f"each channel's frames); got {ids.dtype} {ids.shape}")
  if audio_codes is not None or features is not None:
    raise LogProbsError("a MiMo-Audio checkpoint reads its codes in input_ids' rows 1..: --audio_codes and --features "
                        "do not apply")
  text, codes = split_input_ids(config, ids)
  if ((text < 0) | (text >= config.vocab_size)).any():
    raise LogProbsError(f"input_ids[0] holds text ids outside the text table (0..{config.vocab_size - 1}) in a "
                        "patch's first slot")
  for c, size in enumerate(config.speech_vocab_sizes):
    if ((codes[..., c] < 0) | (codes[..., c] >= size)).any():
      raise LogProbsError(f"input_ids[{c + 1}] (channel {c}) holds codes outside its table (0..{size - 1})")
  out = sequence_outputs(config, params, text, codes)
  widest = max(config.speech_vocab_sizes)
  local = np.full((len(text) - 1, config.group_size, config.channels, widest), -np.inf, np.float32)
  for c, channel in enumerate(out["local"]):
    local[:, :, c, : channel.shape[-1]] = channel
  return out["text"], local


ARCHITECTURE = register(Architecture(
  NAME, MimoAudioConfig, ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.vocab_size, check_fit=check_fit, check_ids=check_ids,
  parse_config=parse_config, spec_checks=spec_checks, log_probs=log_probs, planned=lambda config: config.decoder,
  planner_shapes={"mimo-audio-7b": MIMO_AUDIO_7B}, details=details))
