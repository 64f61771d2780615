"""A model family only the tests define, in one plugin module (S2SJAX_PLUGINS): a Llama decoder whose config.json
says `model_type: "toyllama"` with its own key spelling, and whose checkpoints use their own tensor names."""

from s2sjax.model import families
from s2sjax.model.families import keymap
from s2sjax.model.families.hf_config import require
from s2sjax.model.config import ModelConfig

NAME = "toyllama"

TOY_NAMES = keymap.KeyNames(
  embed="tok_emb",
  final_norm="final_ln",
  lm_head="unembed",
  attn_norm="blocks.{i}.ln_attn",
  mlp_norm="blocks.{i}.ln_mlp",
  q="blocks.{i}.attn.wq",
  k="blocks.{i}.attn.wk",
  v="blocks.{i}.attn.wv",
  o="blocks.{i}.attn.wo",
  gate="blocks.{i}.mlp.w_gate",
  up="blocks.{i}.mlp.w_up",
  down="blocks.{i}.mlp.w_down",
)


def parse_config(cfg) -> ModelConfig:
  head_dim = require(cfg, "width") // require(cfg, "heads")
  return ModelConfig(
    family=NAME, vocab_size=require(cfg, "vocab"), hidden_size=require(cfg, "width"),
    intermediate_size=require(cfg, "ffn_width"), num_layers=require(cfg, "depth"), num_heads=require(cfg, "heads"),
    num_kv_heads=require(cfg, "kv_heads"), head_dim=head_dim, rope_theta=float(require(cfg, "rope_base")),
    rotary_dim=head_dim, rope_interleaved=False, rms_norm_eps=float(require(cfg, "norm_eps")), qkv_bias=False,
    o_bias=False, mlp_bias=False, tie_embeddings=bool(cfg.get("tied", False)),
  )


FAMILY = families.register(families.Family(
  name=NAME,
  layouts=(families.Layout("toy", (NAME,), parse_config, keymap.rules_in(TOY_NAMES)),),
  audio_inputs=("extended_vocab",),
  planner_shapes={"toyllama-1b": dict(model_type=NAME, width=2048, ffn_width=5632, depth=22, heads=32, kv_heads=4,
                                      vocab=32000, norm_eps=1e-5, rope_base=1e4)},
))
