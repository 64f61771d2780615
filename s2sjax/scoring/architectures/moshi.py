"""Moshi (Kyutai's `LMModel`): a text stream and Mimi codebook streams read in parallel, a depth transformer per
step (`s2sjax.model.moshi`). Layout: the PyTorch release (`kyutai/moshiko-pytorch-bf16` and kin): a config.json of
`LMModel` keyword arguments (plus the loader's file names) and `model.safetensors` in upstream's state-dict keys.
Attention comes in either of the spellings Kyutai's loader reads (`LMStateDict`): the releases' fused
`in_proj_weight` / `out_proj.weight` (the depformer's per-step weight sets stacked in them), or today's
`LMModel.state_dict()` names, one module per weight set (`in_projs.{i}.weight` / `out_projs.{i}.weight`, moshi
0.2.13 and so moshi-finetune's outputs). LoRA factors (a LoRA-wrapped `LMModel`'s own state dict, or config.json's
`lora: true` with its `lora_name` file) are merged into the weights they adapt.

Why this is an `Architecture` (s2sjax/scoring/architectures) and not a `Family` of the family registry: a family's layouts
parse into the shared decoder's `ModelConfig`. Moshi's parameters are another tree (stream tables, a depformer with
per-step weights), its rows are stream rows (s2sjax/data/rows.py: several ids per position, whole steps as targets). So
its registration, at the end of this module, carries what the pipeline asks of it: its config and parameter tree,
its scoring step over stream rows (`score_stream_batch`, driven by `s2sjax.scoring.scorer.StreamScorer`), its fit check
(`check_spec`); its converter is checkpoints_conversion's (moshi_release.py, over `parse_config` here and the key
map of moshi_keymap.py). Its checkpoints are
the same directory format (`model_config.json` says `family: moshi`), written and read by `s2sjax.scoring.checkpoints.checkpoint`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from s2sjax.scoring.architectures.architecture import Architecture, FitError, register
from s2sjax.model.config import ConfigError
from s2sjax.model.moshi import (FAMILY, MoshiConfig, MoshiLM, TransformerConfig, abstract_params,
  attention_mask, param_logical_axes, stream_log_probs)
from s2sjax.data.rows import STREAM_ROWS
from s2sjax.scoring.scorer import ScoringError, StreamScorer, by_target_chunks
from s2sjax.scoring.sequence_inputs import LogProbsError, check_range, no_features, sequence

NAME = FAMILY

# config.json keys the loader (`CheckpointInfo.from_hf_repo`) reads for itself and never passes to LMModel.
LOADER_KEYS = ("moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "lora_name", "model_type",
               "lm_gen_config", "tts_config", "stt_config", "model_id", "depformer_causal")
# LMModel's and StreamingTransformer's defaults: what a config.json key left out means to upstream.
DEFAULTS: dict[str, Any] = {
  "delays": [0], "n_q": 8, "dep_q": 8, "card": 1024, "text_card": 32000, "text_card_out": None,
  "demux_second_text_stream": False, "dim": 128, "num_heads": 8, "hidden_scale": 4, "norm": "layer_norm",
  "norm_emb": False, "bias_proj": False, "depformer_dim": 256, "depformer_dim_feedforward": None,
  "depformer_multi_linear": False, "depformer_weights_per_step": False, "depformer_weights_per_step_schedule": None,
  "depformer_low_rank_embeddings": None, "depformer_pos_emb": "sin", "depformer_norm": None,
  "existing_text_padding_id": 3, "existing_text_end_padding_id": 0, "extra_heads_num_heads": 0,
  "extra_heads_dim": 6, "context": None, "causal": True, "quantize": False, "gradient_checkpointing": False,
  # StreamingTransformer / StreamingTransformerLayer keyword arguments (the depformer inherits them unless a
  # `depformer_` key overrides them)
  "positional_embedding": "sin", "max_period": 10000, "positional_scale": 1.0, "layer_scale": None,
  "gating": "none", "kv_repeat": 1, "cross_attention": False, "skip_self_attn": False, "betas": None,
}
# Switches this model does not implement: refused by name when set to anything but the value given.
REFUSED = {
  "demux_second_text_stream": False, "demux_second_stream": False, "norm_emb": False, "quantize": False,
  "causal": True, "cross_attention": False, "skip_self_attn": False, "conditioners": None, "fuser": None,
}
# Keys whose value does not change the model's outputs.
INERT = ("existing_text_end_padding_id", "extra_heads_num_heads", "extra_heads_dim", "gradient_checkpointing",
         "betas", "depformer_context", "depformer_betas")
# LoRA keys (`get_moshi_lm` pops them, moshi/models/loaders.py l.399-401): the converter merges the factors
# (checkpoints_conversion/moshi_keymap.py), so the model never sees them. `lora_rank` is read off the factors' shapes.
LORA_KEYS = ("lora", "lora_rank", "lora_scaling")
# Moshiko / Moshika 7B (kyutai-labs/moshi configs/moshi_7b_202409.json = loaders._lm_kwargs): the published
# architecture, for the planner and as what a release's config.json looks like.
MOSHIKO_CONFIG: dict[str, Any] = {
  "dim": 4096, "text_card": 32000, "existing_text_padding_id": 3, "n_q": 16, "dep_q": 8, "card": 2048,
  "num_heads": 32, "num_layers": 32, "hidden_scale": 4.125, "causal": True, "layer_scale": None, "context": 3000,
  "max_period": 10000, "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
  "depformer_dim": 1024, "depformer_dim_feedforward": 4224, "depformer_num_heads": 16, "depformer_num_layers": 6,
  "depformer_causal": True, "depformer_layer_scale": None, "depformer_multi_linear": True, "depformer_context": 8,
  "depformer_max_period": 10000, "depformer_gating": "silu", "depformer_pos_emb": "none",
  "depformer_weights_per_step": True, "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}


def _gating_hidden(dim: int, dim_feedforward: int) -> int:
  """ActivationGating's hidden width."""
  return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


def parse_config(cfg: Mapping[str, Any]) -> MoshiConfig:
  """A release's config.json -> MoshiConfig; a ConfigError names every key it refuses."""
  model_type = cfg.get("model_type", "moshi")
  if model_type != "moshi":
    raise ConfigError(f"config.json model_type {model_type!r}: only 'moshi' releases are read (the loader changes "
                      f"{model_type} weights after loading them)")
  cfg = {k: v for k, v in cfg.items() if k not in LOADER_KEYS}
  known = set(DEFAULTS) | set(REFUSED) | set(INERT) | set(LORA_KEYS) | {
    "num_layers", "depformer_num_heads", "depformer_num_layers", "depformer_layer_scale", "depformer_gating",
    "depformer_max_period", "depformer_kv_repeat", "depformer_positional_scale"}
  unknown = sorted(set(cfg) - known)
  problems = [f"unknown config.json key {k!r}" for k in unknown]
  for key, allowed in REFUSED.items():
    if key in cfg and cfg[key] != allowed and not (allowed is None and not cfg[key]):
      problems.append(f"{key}={cfg[key]!r} is not supported (only {allowed!r})")
  get = lambda key: cfg.get(key, DEFAULTS.get(key))
  if get("norm") not in ("rms_norm", "rms_norm_f32"):
    problems.append(f"norm={get('norm')!r} is not supported (rms_norm, rms_norm_f32)")
  if get("gating") != "silu":
    problems.append(f"gating={get('gating')!r} is not supported (silu)")
  if cfg.get("depformer_gating", get("gating")) != "silu":
    problems.append(f"depformer_gating={cfg.get('depformer_gating')!r} is not supported (silu)")
  if isinstance(get("depformer_dim_feedforward"), list):
    problems.append("depformer_dim_feedforward as a list (one width per step) is not supported")
  if "num_layers" not in cfg:
    problems.append("num_layers is missing (StreamingTransformer has no default)")
  if problems:
    raise ConfigError("Moshi config.json: " + "; ".join(problems))

  n_q, dep_q, dim = int(get("n_q")), int(get("dep_q")), int(get("dim"))
  temporal = TransformerConfig(
    dim=dim, num_heads=int(get("num_heads")), num_layers=int(cfg["num_layers"]), kv_repeat=int(get("kv_repeat")),
    hidden=_gating_hidden(dim, int(get("hidden_scale") * dim)), activation=get("gating"), norm=get("norm"),
    positional_embedding=get("positional_embedding"), max_period=float(get("max_period")),
    positional_scale=float(get("positional_scale")), context=get("context"), layer_scale=get("layer_scale") is not None,
  )
  schedule = get("depformer_weights_per_step_schedule")
  if schedule is not None and len(schedule) != dep_q:
    raise ConfigError(f"depformer_weights_per_step_schedule has {len(schedule)} entries, dep_q={dep_q}")
  schedule = tuple(schedule) if schedule is not None else tuple(range(dep_q))
  depformer = None
  if dep_q:
    if "depformer_num_heads" not in cfg:
      raise ConfigError("depformer_num_heads is missing (LMModel passes no num_heads to its depformer)")
    ddim = int(get("depformer_dim"))
    dff = get("depformer_dim_feedforward") or int(get("hidden_scale") * ddim)
    per_step = bool(get("depformer_weights_per_step"))
    depformer = TransformerConfig(
      dim=ddim, num_heads=int(cfg["depformer_num_heads"]),
      num_layers=int(cfg.get("depformer_num_layers", cfg["num_layers"])),
      kv_repeat=int(cfg.get("depformer_kv_repeat", get("kv_repeat"))), hidden=_gating_hidden(ddim, int(dff)),
      activation=cfg.get("depformer_gating", get("gating")), norm=get("norm"),
      positional_embedding=get("depformer_pos_emb"),
      max_period=float(cfg.get("depformer_max_period", get("max_period"))),
      positional_scale=float(cfg.get("depformer_positional_scale", get("positional_scale"))),
      context=None,  # LMModel sets the depformer's context to None whatever depformer_context says
      layer_scale=cfg.get("depformer_layer_scale", get("layer_scale")) is not None,
      weight_sets=(max(schedule) + 1) if per_step else 1,
    )
  return MoshiConfig(
    n_q=n_q, dep_q=dep_q, card=int(get("card")), text_card=int(get("text_card")),
    text_card_out=int(get("text_card_out") or get("text_card")), delays=tuple(int(d) for d in get("delays")),
    temporal=temporal, depformer=depformer, depformer_multi_linear=bool(get("depformer_multi_linear")),
    depformer_schedule=schedule, depformer_low_rank=get("depformer_low_rank_embeddings"),
    depformer_norm=get("depformer_norm"), bias_proj=bool(get("bias_proj")),
    existing_text_padding_id=int(get("existing_text_padding_id")),
  )


# ---- the spec's contract ---------------------------------------------------------------------------------------------


def check_spec(config: MoshiConfig, codebook_sizes: Sequence[int], delays: Sequence[int],
               initial_ids: Sequence[int]) -> None:
  """Refuses a spec whose streams do not fit the model: Moshi reads its own speech as dep_q codebook streams of
  `card` codes (and, past them, the user's, which the benchmark leaves silent), each stream delayed and opened as
  the model's config says. The spec's streams are the text stream and its codebooks, in that order."""
  codebooks = len(codebook_sizes)
  if codebooks != config.dep_q:
    raise ConfigError(f"the spec's audio tokenizer gives {codebooks} codebooks per frame, but the model predicts "
                      f"dep_q={config.dep_q} (and reads n_q={config.n_q}: its own and the user's)")
  if any(size != config.card for size in codebook_sizes):
    raise ConfigError(f"the spec's codebooks have {list(codebook_sizes)} codes, the model's card is {config.card}")
  streams = 1 + codebooks
  if tuple(delays) != config.delays[:streams]:
    raise ConfigError(f"the spec's stream_delays {list(delays)} are not the model's {list(config.delays[:streams])} "
                      "(text, then its own codebooks)")
  if tuple(initial_ids) != config.initial_ids[:streams]:
    raise ConfigError(f"the spec's initial tokens {list(initial_ids)} (text_initial_id, then each codebook's size) "
                      f"are not the model's {list(config.initial_ids[:streams])} (text_card, then card)")


# ---- the scoring step over stream rows -------------------------------------------------------------------------------
#
# The temporal transformer over every position, its outputs gathered at the targets, then at each target the text
# head and the depformer (conditioned on the predicted step's earlier streams); fp32 `logsumexp - logit[target]`
# per stream, weighted by `target_weight` (the protocol's per-stream weights, s2sjax/data/formats/moshi_protocol.py),
# summed per slot.


def silent_streams(config: MoshiConfig, positions: jax.Array, laid: int) -> jax.Array:
  """The streams past the `laid` ones of the rows (Moshi's user streams) as silence [B, L, num_streams - laid]:
  each stream's initial token at the steps its delay fills, -1 after, which is what `LMModel.forward` makes of
  codes of -1 (positions are step indices from the item's initial step)."""
  delays, initial = np.asarray(config.delays[laid:]), np.asarray(config.initial_ids[laid:])
  return jnp.where(positions[..., None] <= delays, initial, -1).astype(jnp.int32)


def score_stream_batch(config: MoshiConfig, dtype, target_chunk: int, num_slots: int, params, batch: dict) -> dict:
  """Per target [B, M] `target_nll`, the step's scored tokens' NLL, each times its stream's weight
  (`target_weight`); per slot [B, C] (as `s2sjax.scoring.scorer.score_batch`): `nll_sum`, the candidate's summed over its
  steps, and `n_tokens`, its steps (its targets: one per frame of the candidate). So the reported loss,
  nll_sum / n_tokens, is the weighted NLL per timestep, Kyutai's S->S score "normalized by the sequence length"
  (above). Dividing by the candidate's total weight instead ranks candidates of equal length alike; across lengths
  it can differ on near-ties only, as the total is not exactly a multiple of the steps: a delayed stream's last
  `delay` tokens lie past the candidate's steps (upstream's mask), so S->S's total is
  (100 + K - 1) * steps - sum(acoustic delays).
  Pure; jitted by StreamScorer."""
  model = MoshiLM(config, dtype=dtype)
  mask = attention_mask(batch["segment_ids"], batch["branch_ids"], batch["positions"], config.temporal.context)
  streams = batch[STREAM_ROWS.marker]
  if streams.shape[-1] < config.num_streams:
    streams = jnp.concatenate([streams, silent_streams(config, batch["positions"], streams.shape[-1])], axis=-1)
  hidden = model.apply({"params": params}, streams, batch["positions"], mask)
  hidden = jnp.take_along_axis(hidden, batch["target_pos"][..., None], axis=1)  # [B, M, D]
  predicted = 1 + config.dep_q

  def nll_of(logits, ids):
    ids = jnp.clip(ids, 0, logits.shape[-1] - 1)  # unscored entries (-1, initial tokens) weigh 0
    return jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]

  def target_nll(h, frame, weight):  # [B, c, D], [B, c, S], [B, c, S]
    nll = [nll_of(model.apply({"params": params}, h, method=MoshiLM.text_logits), frame[..., 0])]
    if config.dep_q:
      flat = lambda x: x.reshape(-1, x.shape[-1])
      audio = model.apply({"params": params}, flat(h), flat(frame), method=MoshiLM.audio_logits)
      audio = audio.reshape(*h.shape[:2], config.dep_q, config.card)
      nll += list(jnp.moveaxis(nll_of(audio, frame[..., 1:predicted]), -1, 0))
    return (jnp.stack(nll, axis=-1) * weight[..., :predicted].astype(jnp.float32)).sum(-1)

  nll = by_target_chunks(target_nll, target_chunk, hidden, batch["target_frame"], batch["target_weight"])
  onehot = (batch["target_slot"][..., None] == jnp.arange(num_slots)).astype(jnp.float32)
  return {"target_nll": nll, "nll_sum": jnp.einsum("bm,bmc->bc", nll, onehot, precision=jax.lax.Precision.HIGHEST),
          "n_tokens": onehot.sum(axis=1).astype(jnp.int32)}


def check_stream_ids(rows: dict[str, np.ndarray], config: MoshiConfig) -> None:
  """Stream ids beyond their tables (or a scored code beyond the card) would be clamped silently by the gather:
  refuse them (a ScoringError, as the decoder's twin check), naming row, position and stream. -1 (no token) and
  each stream's initial token are ids too."""
  tokens = rows[STREAM_ROWS.marker]
  if not 1 + config.dep_q <= tokens.shape[-1] <= config.num_streams:
    raise ScoringError(f"rows carry {tokens.shape[-1]} streams; the model predicts {1 + config.dep_q} (text + "
                     f"{config.dep_q} codebooks) and reads {config.num_streams}: rows must carry at least the first")
  limits = np.asarray(config.initial_ids[: tokens.shape[-1]])  # text_card for text, card for codebooks: initial
  for field, values, top in ((STREAM_ROWS.marker, tokens, limits), ("target_frame", rows["target_frame"], limits)):
    bad = np.argwhere((values < -1) | (values > top))
    if len(bad):
      r, pos, k = bad[0]
      raise ScoringError(f"{field}[row {r}, position {pos}, stream {k}] = {values[r, pos, k]} is outside the "
                       f"{'text vocabulary' if k == 0 else 'codebook'} ({top[k]} ids and the initial token); "
                       f"{len(bad)} such ids in all — were the codes made for another model?")
  scored = rows["target_weight"] > 0
  heads = np.asarray((config.text_card_out,) + (config.card,) * (tokens.shape[-1] - 1))
  bad = np.argwhere(scored & ((rows["target_frame"] < 0) | (rows["target_frame"] >= heads)))
  if len(bad):
    r, m, k = bad[0]
    raise ScoringError(f"target_frame[row {r}, target {m}, stream {k}] = {rows['target_frame'][r, m, k]} is scored but "
                     f"not an id the model predicts (0..{heads[k] - 1})")
  if (scored[..., 1 + config.dep_q :]).any():
    raise ScoringError(f"rows score streams past the {config.dep_q} codebooks the depformer predicts")


def scorer(config: MoshiConfig, shape, mesh=None, batch_size: int = 8, dtype=jnp.float32, attention: str = "xla",
           target_chunk: int | None = None) -> StreamScorer:
  """The stream scorer over Moshi's step (`attention` is the shared decoder's choice: Moshi's runs the dense mask)."""
  del attention
  return StreamScorer(config, shape, score_stream_batch, check_stream_ids, abstract_params(config),
                      param_logical_axes(config), mesh=mesh, batch_size=batch_size, dtype=dtype,
                      target_chunk=target_chunk)


def check_fit(config: MoshiConfig, data) -> None:
  """Stream rows laid as the model reads them (`check_spec`)."""
  spec = data.metadata.spec
  try:
    check_spec(config, spec.codebook_sizes, spec.stream_delays, spec.stream_initial_ids)
  except ConfigError as e:
    raise FitError(f"{data.task}/{data.modality} (spec {spec.name}) does not fit the {NAME} checkpoint: {e}") from None


def log_probs(config: MoshiConfig, params, input_ids: np.ndarray, audio_codes: np.ndarray | None = None,
              features: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
  """Moshi's text head `[T, text_vocab]` and depformer `[T, dep_q, card]` log-softmax (`s2sjax.logprobs`'s
  docstring)."""
  no_features(features, "Moshi")
  text = sequence(input_ids)
  check_range("input_ids", text, config.text_card, "the text stream's ids", silent=True)
  streams = np.full((1 + config.n_q, len(text)), -1, np.int64)
  streams[0] = text
  if audio_codes is not None:
    codes = np.asarray(audio_codes)
    if codes.ndim != 2 or codes.shape[0] != len(text) or not 0 < codes.shape[1] <= config.n_q:
      raise LogProbsError(f"audio_codes must be [T={len(text)}, K] time-aligned with input_ids, K <= n_q="
                          f"{config.n_q} codebook streams; got {codes.shape}")
    check_range("audio_codes", codes, config.card, "the codebooks", silent=True)
    streams[1 : 1 + codes.shape[1]] = codes.T
  text_lp, _, audio_lp, _ = stream_log_probs(config, params, streams[None])
  codebooks = None if audio_lp is None else np.moveaxis(np.asarray(audio_lp, np.float32)[0], 0, 1)
  return np.asarray(text_lp, np.float32)[0], codebooks


def spec_checks(config: MoshiConfig, spec, ids) -> list[tuple[str, bool, str]]:
  """The pre-flight's verdict on a spec's streams (`check_spec`)."""
  if spec.row_format is not STREAM_ROWS:
    return [("spec streams", False, f"spec {spec.name} lays {spec.row_format.name} rows; {NAME} reads stream rows")]
  try:
    check_spec(config, spec.codebook_sizes, spec.stream_delays, spec.stream_initial_ids)
  except ConfigError as e:
    return [("spec streams", False, str(e))]
  return [("spec streams", True, f"spec {spec.name}: the text stream and {len(spec.codebook_sizes)} codebooks of "
                                 f"{config.card} codes, delays {list(spec.stream_delays)}, as the model reads them")]


ARCHITECTURE = register(Architecture(
  NAME, MoshiConfig, STREAM_ROWS, abstract_params, param_logical_axes, scorer,
  text_rows=lambda config: config.text_card, check_fit=check_fit, check_ids=check_stream_ids,
  parse_config=parse_config, spec_checks=spec_checks, log_probs=log_probs))
