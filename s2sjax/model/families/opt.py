"""OPT (and the TWIST unit LMs built on it): LayerNorm with biases, pre- or post-norm residuals (OPT-350m normalises
after each residual sum), a ReLU MLP (fc1, fc2), biases on q/k/v/out and the MLP, no rope but a learned position
table read at position + 2, and, where word_embed_proj_dim differs from hidden_size, bias-free projections between
the embedding width and the layers. Layout: transformers' (`hf`, OPTForCausalLM)."""

from __future__ import annotations

from typing import Any, Mapping

from s2sjax.model.families import hf_config, keymap
from s2sjax.model.families.family import HF, Family, HfExport, Layout
from s2sjax.model.families.registry import register
from s2sjax.model.config import ConfigError, ModelConfig

NAME = "opt"
# modeling_opt.py: OPTLearnedPositionalEmbedding keeps 2 rows in front of position 0 (fairseq's padding offset).
POSITION_OFFSET = 2
# modeling_opt.py builds every LayerNorm with torch's default eps; config.json has no key for it.
LAYER_NORM_EPS = 1e-5
# ModelConfig field -> OPT's config.json key
HF_KEYS = dict(hf_config.HF_KEYS, intermediate_size="ffn_dim", word_embed_dim="word_embed_proj_dim")


def parse_hf_config(cfg: Mapping[str, Any]) -> ModelConfig:
  """Sizes are required. Of the switches, do_layer_norm_before is required (OPT-350m's differs from the rest);
  the others take OPTConfig's defaults, which configs written before transformers added them mean."""
  require, number = hf_config.require, hf_config.number
  activation = cfg.get("activation_function", "relu")
  if activation != "relu":
    raise ConfigError(f"OPT activation_function={activation!r} is not supported (the MLP is fc1, relu, fc2)")
  if not cfg.get("layer_norm_elementwise_affine", True):
    raise ConfigError("OPT layer_norm_elementwise_affine=false (LayerNorms without scale and bias) is not supported")
  hidden, heads = number(cfg, "hidden_size"), number(cfg, "num_attention_heads")
  if heads > 0 and hidden % heads:
    raise ConfigError(f"OPT hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
  pre_norm = bool(require(cfg, "do_layer_norm_before"))
  # OPTDecoder has a final LayerNorm only with pre-norm, and not when _remove_final_layer_norm (checkpoints
  # fine-tuned before transformers 4.20.1).
  final_norm = pre_norm and not cfg.get("_remove_final_layer_norm", False)
  embed_dim = number(cfg, "word_embed_proj_dim") if cfg.get("word_embed_proj_dim") else hidden  # OPTConfig's rule
  bias = bool(cfg.get("enable_bias", True))
  with hf_config.named_by(HF_KEYS):
    return ModelConfig(
      family=NAME,
      vocab_size=number(cfg, "vocab_size"),
      hidden_size=hidden,
      intermediate_size=number(cfg, "ffn_dim"),
      num_layers=number(cfg, "num_hidden_layers"),
      num_heads=heads,
      num_kv_heads=heads,
      head_dim=hidden // heads if heads > 0 else 0,
      rope_theta=0.0,
      rotary_dim=0,
      rope_interleaved=False,
      rms_norm_eps=LAYER_NORM_EPS,
      qkv_bias=bias,
      o_bias=bias,
      mlp_bias=bias,
      tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),  # OPTConfig's default, unlike other families'
      norm="layer",
      pre_norm=pre_norm,
      final_norm=final_norm,
      mlp="relu",
      position_embedding="learned",
      max_positions=number(cfg, "max_position_embeddings"),
      position_offset=POSITION_OFFSET,
      word_embed_dim=None if embed_dim == hidden else embed_dim,
    )


def export_config(config: ModelConfig) -> dict[str, Any]:
  return dict(
    model_type="opt",
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    ffn_dim=config.intermediate_size,
    num_hidden_layers=config.num_layers,
    num_attention_heads=config.num_heads,
    max_position_embeddings=config.max_positions,
    word_embed_proj_dim=config.embed_dim,
    do_layer_norm_before=config.pre_norm,
    _remove_final_layer_norm=config.pre_norm and not config.final_norm,
    enable_bias=config.qkv_bias,
    layer_norm_elementwise_affine=True,
    activation_function="relu",
    tie_word_embeddings=config.tie_embeddings,
  )


# OPTForCausalLM's keys; the decoder's MLP has no gate: fc1 is `up`, fc2 `down`.
HF_NAMES = keymap.KeyNames(
  embed="model.decoder.embed_tokens",
  positions="model.decoder.embed_positions",
  project_in="model.decoder.project_in",
  project_out="model.decoder.project_out",
  final_norm="model.decoder.final_layer_norm",
  lm_head="lm_head",
  attn_norm="model.decoder.layers.{i}.self_attn_layer_norm",
  mlp_norm="model.decoder.layers.{i}.final_layer_norm",
  q="model.decoder.layers.{i}.self_attn.q_proj",
  k="model.decoder.layers.{i}.self_attn.k_proj",
  v="model.decoder.layers.{i}.self_attn.v_proj",
  o="model.decoder.layers.{i}.self_attn.out_proj",
  up="model.decoder.layers.{i}.fc1",
  down="model.decoder.layers.{i}.fc2",
)


def _opt(hidden: int, ffn: int, layers: int, heads: int, pre_norm: bool, embed_dim: int) -> dict:
  return dict(model_type="opt", hidden_size=hidden, ffn_dim=ffn, num_hidden_layers=layers, num_attention_heads=heads,
              vocab_size=50272, max_position_embeddings=2048, do_layer_norm_before=pre_norm,
              word_embed_proj_dim=embed_dim)


FAMILY = register(Family(
  name=NAME,
  layouts=(Layout(HF, ("opt",), parse_hf_config, keymap.rules_in(HF_NAMES), verifiable=True),),
  audio_inputs=("extended_vocab",),  # TWIST: audio units are token ids
  export=HfExport("OPTForCausalLM", HF, export_config),
  planner_shapes={  # facebook/opt-350m and opt-1.3b, the architectures of TWIST-350M and TWIST-1.3B
    "opt-350m": _opt(1024, 4096, 24, 16, pre_norm=False, embed_dim=512),
    "opt-1.3b": _opt(2048, 8192, 24, 32, pre_norm=True, embed_dim=2048),
  },
))
