"""Qwen2 / Qwen2.5: q/k/v biases, whole-head rotate-half rope. Layouts: transformers' (`hf`, also read from GGUF),
Baichuan-Audio's (`baichuan_audio`, `OmniForCausalLM`): a Qwen2.5 decoder with fused `W_pack` attention, a
NormHead, and K RVQ embedding tables summed at an audio placeholder token; and VITA-Audio's (`vita_audio`,
`Qwen2MTPForCausalLM`): Qwen2.5-7B-Instruct whose last layers are multi-token-prediction modules scoring never runs."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from s2sjax.model.families import hf_config, keymap
from s2sjax.model.families.family import HF, Family, GgufLayout, HfExport, Layout
from s2sjax.model.families.registry import register
from s2sjax.model.config import ConfigError, ModelConfig

NAME = "qwen2"


def parse_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  if cfg.get("use_sliding_window"):
    raise ConfigError("Qwen2 sliding-window attention (config.json use_sliding_window=true) is not supported")
  head_dim = hf_config.derived_head_dim(cfg)
  # Qwen2Config's fallback of 32 kv heads is one model's value, not the checkpoint's: required.
  fields = hf_config.decoder_fields(
    cfg, head_dim=head_dim, num_kv_heads=hf_config.number(cfg, "num_key_value_heads"),
    rotary_dim=hf_config.whole_head_rotary_dim(cfg, head_dim),
  )
  with hf_config.named_by():
    return ModelConfig(family=NAME, rope_interleaved=False, qkv_bias=True, o_bias=False, mlp_bias=False, **fields)


BAICHUAN_AUDIO_KEYS = dict(hf_config.HF_KEYS, audio_codebook_sizes="audio_config.vq_config.codebook_sizes (+ 1 each)",
                           audio_placeholder_id="audio_config.audio_pad_token_id")


def parse_baichuan_audio_config(cfg: Mapping[str, Any]) -> ModelConfig:
  """The text decoder as in `hf`, with its own rope and bias keys, and one table per codebook, each one row longer
  than the codebook for the end-of-audio code."""
  # configuration_omni.py (OmniConfig.__init__) accepts these switches; modeling_omni.py's Attention acts on them.
  position = str(cfg.get("position_embedding_type", "rope")).lower()
  if position != "rope":
    raise ConfigError(f"Baichuan-Audio position_embedding_type={position!r} (ALiBi attention biases) is not "
                      "supported: only rope")
  if cfg.get("sparse_attention_layers"):
    raise ConfigError(f"Baichuan-Audio sparse_attention_layers={cfg['sparse_attention_layers']} (layers with "
                      "sparse_attention_heads heads of their own W_pack) are not supported")
  audio = cfg.get("audio_config") or {}
  sizes = (audio.get("vq_config") or {}).get("codebook_sizes")
  if not sizes or audio.get("audio_pad_token_id") is None:
    raise ConfigError(
      "Baichuan-Audio config.json lacks audio_config.vq_config.codebook_sizes or audio_config.audio_pad_token_id"
    )
  # OmniConfig derives the kv heads from the heads when the config leaves them out (configuration_omni.py).
  kv_heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
  text = parse_hf_config(dict(cfg, rope_theta=cfg.get("rotary_emb_base", cfg.get("rope_theta")),
                              num_key_value_heads=kv_heads))
  with hf_config.named_by(BAICHUAN_AUDIO_KEYS):
    return dataclasses.replace(
      text,
      qkv_bias=bool(cfg.get("attention_qkv_bias", False)),
      audio_codebook_sizes=tuple(n + 1 if isinstance(n, int) else n for n in sizes),  # ModelConfig checks each
      audio_placeholder_id=audio["audio_pad_token_id"],
    )


BAICHUAN_AUDIO_NAMES = dataclasses.replace(
  keymap.HF_NAMES, q=None, k=None, v=None, qkv="model.layers.{i}.self_attn.W_pack"
)
# modeling_omni.py: OmniForCausalLM holds `audio_tokenizer` (OmniAudioTokenizer: audio_model, audio_bridge_model,
# audio_decoder, audio_flow_matching_decoder: wave <-> codes, run before the decoder or after it) and `audio_head`
# (next-code prediction: kept, since a generator needs it); OmniModel holds `visual_model` / `visual_bridge_model`
# when visual_config or video_config is enabled. Scoring with precomputed codes runs none of them: each is left out
# by its prefix, with what the converter's report says of it.
BAICHUAN_AUDIO_MODULES = {
  "audio_tokenizer.": "the release's audio tokenizer (wave -> codes); the JAX Baichuan-Audio tokenizer reads it from "
                      "the release folder itself: --audio_tokenizer_dir=<that folder>",
  "model.visual_model.": "the vision tower (scoring takes no images)",
  "model.visual_bridge_model.": "the vision bridge (scoring takes no images)",
}


def baichuan_audio_rules(config: ModelConfig, cfg: Mapping[str, Any]) -> list[keymap.Rule]:
  # OmniConfig's attention_qkv_pack=false gives q_proj / k_proj / v_proj (modeling_omni.py Attention.__init__).
  names = BAICHUAN_AUDIO_NAMES if cfg.get("attention_qkv_pack", True) else keymap.HF_NAMES
  # NormHead L2-normalises lm_head's rows at every forward; the converter does it once.
  rules = keymap.decoder_rules(config, names, normalize_head=bool(cfg.get("use_norm_head", True)))
  for k, size in enumerate(config.audio_codebook_sizes):
    rules.append(keymap.copy_rule((f"audio_embed_{k}", "embedding"), f"model.audio_embed_layers.{k}.weight",
                                  (size, config.hidden_size)))
  return rules


# VITA-Audio (VITA-MLLM/VITA-Audio 0abaf17, vita_audio/models/qwen2_mtp_v4_48_3/): config.json lists
# num_hidden_layers layers of which the last num_nextn_predict_layers are the MCTP modules (config_7B_mtp10.json:2,21:
# 38 and 10). Qwen2MTPForCausalLM.forward scores with the first num_hidden_layers - num_nextn_predict_layers
# (modeling_qwen2.py:1120), then model.norm and lm_head (:642, :1130); MCTP module j is layer that + j with its
# mtp_projs.{j} / mtp_embed_norms.{j} / mtp_hidden_norms.{j}, run only to draft tokens when generating (:819-867).
MTP_LAYERS_DEFAULT = 1  # Qwen2MTPConfig's num_nextn_predict_layers default (configuration_qwen2.py:163)
MTP_MODULES = ("mtp_projs.", "mtp_embed_norms.", "mtp_hidden_norms.")


def _scored_layers(cfg: Mapping[str, Any]) -> tuple[int, int]:
  """(layers the main path runs, MCTP modules) of a VITA-Audio config.json."""
  total = hf_config.require(cfg, "num_hidden_layers")
  mtp = cfg.get("num_nextn_predict_layers", MTP_LAYERS_DEFAULT)
  if not isinstance(mtp, int) or not 0 <= mtp < total:
    raise ConfigError(f"VITA-Audio num_nextn_predict_layers={mtp!r} must be an integer in [0, num_hidden_layers="
                      f"{total})")
  return total - mtp, mtp


def parse_vita_audio_config(cfg: Mapping[str, Any]) -> ModelConfig:
  """The decoder the main path runs: Qwen2 over the layers before the MCTP modules."""
  return parse_hf_config(dict(cfg, num_hidden_layers=_scored_layers(cfg)[0]))


def vita_audio_mtp_modules(cfg: Mapping[str, Any]) -> dict[str, str]:
  """The MCTP modules' keys, which the converter leaves out: their transformer layers (after the scored ones) and
  their projections and norms."""
  first, mtp = _scored_layers(cfg)
  why = f"(multi-token prediction drafts tokens when generating; scoring runs the first {first} layers, " \
        "modeling_qwen2.py:1120)"
  modules = {f"model.layers.{first + j}.": f"MCTP module {j}'s transformer layer {why}" for j in range(mtp)}
  return {**modules, **{prefix: f"the {mtp} MCTP modules' {prefix[:-1]} {why}" for prefix in MTP_MODULES}}


def export_config(config: ModelConfig) -> dict[str, Any]:
  return dict(hf_config.export_fields(config), model_type="qwen2")


def _qwen25(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, tied: bool) -> dict:
  return dict(model_type="qwen2", hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab, tie_word_embeddings=tied,
              rope_theta=1e6, rms_norm_eps=1e-6)


FAMILY = register(Family(
  name=NAME,
  layouts=(
    Layout(HF, ("qwen2",), parse_hf_config, keymap.rules_in(keymap.HF_NAMES),
           ignored_suffixes=keymap.HF_IGNORED_SUFFIXES, verifiable=True),
    Layout("baichuan_audio", ("omni",), parse_baichuan_audio_config, baichuan_audio_rules,
           kept_prefixes=("audio_head.",), skipped_prefixes=tuple(BAICHUAN_AUDIO_MODULES),
           skipped_notes=BAICHUAN_AUDIO_MODULES,
           ignored_suffixes=keymap.HF_IGNORED_SUFFIXES),
    Layout("vita_audio", ("qwen2_mtp",), parse_vita_audio_config, keymap.rules_in(keymap.HF_NAMES),
           skipped_by_config=vita_audio_mtp_modules, ignored_suffixes=keymap.HF_IGNORED_SUFFIXES),
  ),
  audio_inputs=("codebook_tables", "extended_vocab"),
  export=HfExport("Qwen2ForCausalLM", HF, export_config),
  gguf=GgufLayout("qwen2", "qwen2", keymap.llama_cpp_to_hf_key),  # llama.cpp stores qwen2's q/k rows unpermuted
  planner_shapes={
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, 151936, True),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, 151936, True),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, 152064, False),
    # VITA-Audio-Boost / -Balance: config_7B_mtp10.json's sizes (its 28 scored layers; the 10 MCTP ones left out)
    "vita-audio-7b": dict(_qwen25(3584, 18944, 38, 28, 4, 168072, False), model_type="qwen2_mtp",
                          num_nextn_predict_layers=10),
  },
))
