"""Tiny random Hugging Face models, saved in the layouts users bring, for tests and benchmarks."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import torch
from transformers import GlmConfig, GlmForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from checkpoints_conversion import safetensors_io

SMALL = dict(
  vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
  num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
)


def tiny_model(family: str, tied: bool = False, seed: int = 0, **overrides):
  """A random transformers model of the family with weights big enough that errors show (std 0.1)."""
  torch.manual_seed(seed)
  kwargs = dict(SMALL, tie_word_embeddings=tied, initializer_range=0.1, **overrides)
  if family == "qwen2":
    model = Qwen2ForCausalLM(Qwen2Config(rope_theta=10000.0, **kwargs))
  elif family == "llama":
    model = LlamaForCausalLM(LlamaConfig(rope_theta=50000.0, **kwargs))
  elif family == "glm":
    model = GlmForCausalLM(GlmConfig(head_dim=16, rope_theta=10000.0, pad_token_id=0, **kwargs))
  else:
    raise ValueError(family)
  with torch.no_grad():  # non-trivial norm scales and biases, so a mis-mapped one cannot hide
    for name, param in model.named_parameters():
      if name.endswith(("norm.weight", "layernorm.weight", ".bias")):
        param.copy_(1.0 + 0.2 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
  return model.eval()


def save_hf(model, directory: str, **kwargs) -> str:
  model.save_pretrained(directory, **kwargs)
  return directory


def state_numpy(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def write_raw_checkpoint(directory: str, config: dict, tensors: dict[str, np.ndarray]) -> str:
  """A checkpoint directory in an arbitrary key layout (ChatGLM, Baichuan-Audio) with its config.json."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  safetensors_io.write(os.path.join(directory, "model.safetensors"), tensors)
  return directory


def torch_log_probs(model, ids: np.ndarray, **kwargs) -> np.ndarray:
  with torch.no_grad():
    out = model(torch.from_numpy(ids), **kwargs) if ids is not None else model(**kwargs)
  return torch.log_softmax(out.logits.float(), -1).numpy()


# The non-decoder modules of the real Baichuan-Audio release, one small tensor each, under the names modeling_omni.py
# gives them: OmniForCausalLM.audio_tokenizer (OmniAudioTokenizer: audio_model, audio_bridge_model, audio_decoder,
# audio_flow_matching_decoder), OmniForCausalLM.audio_head (OmniAudioHead: transformer_layers, headnorm, heads),
# OmniModel.visual_model / visual_bridge_model (present when visual_config.enable).
BAICHUAN_RELEASE_SKIPPED = (
  "audio_tokenizer.audio_model.conv1.weight", "audio_tokenizer.audio_model.layers.0.self_attn.k_proj.weight",
  "audio_tokenizer.audio_bridge_model.vq.codebook.embed", "audio_tokenizer.audio_decoder.dconv1.weight",
  "audio_tokenizer.audio_flow_matching_decoder.flow.estimator.time_mlp.linear_1.weight",
  "model.visual_model.blocks.0.attn.qkv.weight", "model.visual_bridge_model.mlp.0.weight",
)
BAICHUAN_RELEASE_KEPT = (
  "audio_head.transformer_layers.0.linear1.weight", "audio_head.headnorm.weight",
)


def baichuan_release_config(codebook_sizes, placeholder) -> dict:
  """configuration_omni.py's sub-configs with the fields modeling_omni.py reads, scaled down."""
  return dict(
    position_embedding_type="rope", sparse_attention_layers=[], sparse_attention_heads=None,
    attention_qkv_pack=True, hidden_act="silu",
    audio_config={"vq_config": {"codebook_sizes": list(codebook_sizes)}, "audio_pad_token_id": placeholder,
                  "audio_start_token_id": placeholder + 1, "audio_end_token_id": placeholder + 2,
                  "audio_head_transformer_layers": 1, "d_model": 16},
    visual_config={"enable": True, "image_pad_token_id": placeholder + 3},
    video_config={"enable": False}, vocoder_config={"enable": True}, flow_matching_config={"enable": True},
  )


def baichuan_audio_checkpoint(model, directory, codebook_sizes, placeholder, release=False):
  """Baichuan-Audio's layout of a Qwen2 model: fused W_pack, 8-style RVQ tables (size + 1 rows), NormHead,
  and an audio head that is kept, not used. `release` adds the real release's other modules and config fields."""
  sd, c = state_numpy(model), model.config
  rng = np.random.default_rng(5)
  out = {k: v for k, v in sd.items() if ".self_attn.q_proj" not in k and ".self_attn.k_proj" not in k and ".self_attn.v_proj" not in k}
  for i in range(c.num_hidden_layers):
    p = f"model.layers.{i}.self_attn"
    out[f"{p}.W_pack.weight"] = np.concatenate([sd[f"{p}.{n}_proj.weight"] for n in "qkv"])
    out[f"{p}.W_pack.bias"] = np.concatenate([sd[f"{p}.{n}_proj.bias"] for n in "qkv"])
  tables = [rng.normal(0, 0.3, (n + 1, c.hidden_size)).astype(np.float32) for n in codebook_sizes]
  out.update({f"model.audio_embed_layers.{k}.weight": t for k, t in enumerate(tables)})
  out["audio_head.heads.0.weight"] = rng.normal(size=(codebook_sizes[0] + 1, c.hidden_size)).astype(np.float32)
  config = dict(
    c.to_dict(), model_type="omni", architectures=["OmniForCausalLM"], attention_qkv_bias=True, use_norm_head=True,
    audio_config={"vq_config": {"codebook_sizes": list(codebook_sizes)}, "audio_pad_token_id": placeholder},
  )
  config["rope_theta"] = c.rope_parameters["rope_theta"]
  if release:
    config.update(baichuan_release_config(codebook_sizes, placeholder))
    config["rotary_emb_base"] = config.pop("rope_theta")  # OmniConfig.get_rotary_base reads this one first
    config.pop("rope_parameters", None)  # transformers v5's spelling; OmniConfig has none
    out.update({k: rng.normal(size=(4, 4)).astype(np.float32) for k in BAICHUAN_RELEASE_SKIPPED + BAICHUAN_RELEASE_KEPT})
  return write_raw_checkpoint(directory, config, out), tables, out["audio_head.heads.0.weight"]


def spoken_prefix(rng, length: int, audio: slice, placeholder: int, sizes) -> tuple[np.ndarray, np.ndarray]:
  """Random text tokens [1, length] with a spoken stretch at `audio`: placeholder ids there, and one random code
  per codebook (the extra end-of-audio row included, hence n + 1) where codes [1, length, K] are not -1."""
  tokens = rng.integers(0, 400, size=(1, length))
  tokens[0, audio] = placeholder
  codes = np.full((1, length, len(sizes)), -1)
  codes[0, audio] = np.stack([rng.integers(0, n + 1, audio.stop - audio.start) for n in sizes], -1)
  return tokens, codes


def audio_inputs_embeds(model, tokens, codes, tables) -> "torch.Tensor":
  """The reference's `inputs_embeds` for codebook-table audio: the text embedding, replaced at audio positions by
  the sum of the tables' rows (codes -1 = no audio)."""
  with torch.no_grad():
    embeds = model.model.embed_tokens(torch.from_numpy(tokens)).numpy()
  audio = codes[..., 0] >= 0
  embeds[audio] = sum(t[codes[..., k][audio]] for k, t in enumerate(tables))
  return torch.from_numpy(embeds)


def fold_norm_head(model) -> None:
  """Baichuan's NormHead (rows L2-normalised at each forward) applied once to a transformers model's lm_head."""
  with torch.no_grad():
    head = model.lm_head.weight
    head.copy_(head / head.norm(dim=-1, keepdim=True))


def baichuan_reference_log_probs(model, tokens, codes, tables) -> np.ndarray:
  """What Baichuan-Audio's forward gives for a spoken prefix (modeling_omni.py get_multimodal_embed: the summed
  tables at placeholder positions; NormHead at the head), through the transformers model's own layers."""
  embeds = audio_inputs_embeds(model, tokens, codes, tables)
  fold_norm_head(model)
  return torch_log_probs(model, None, inputs_embeds=embeds)


# The toy family's names for transformers' Llama keys, written out here independently of the plugin's KeyNames.
TOY_KEYS = (
  (r"^model\.embed_tokens\.", "tok_emb."),
  (r"^model\.norm\.", "final_ln."),
  (r"^lm_head\.", "unembed."),
  (r"^model\.layers\.(\d+)\.input_layernorm\.", r"blocks.\1.ln_attn."),
  (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"blocks.\1.ln_mlp."),
  (r"^model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.", r"blocks.\1.attn.w\2."),
  (r"^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.", r"blocks.\1.mlp.w_\2."),
)


def _toy_key(hf_key: str) -> str:
  for pattern, replacement in TOY_KEYS:
    key, found = re.subn(pattern, replacement, hf_key)
    if found:
      return key
  raise AssertionError(f"no toy name for {hf_key}")


def toy_family_checkpoint(model, directory: str) -> str:
  """The model's weights under the toy family's (tests/plugins/toy_family.py) tensor names, with a config.json in
  the toy's own spelling."""
  c = model.config
  config = {
    "model_type": "toyllama", "width": c.hidden_size, "ffn_width": c.intermediate_size, "depth": c.num_hidden_layers,
    "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads, "vocab": c.vocab_size,
    "norm_eps": c.rms_norm_eps, "rope_base": c.rope_parameters["rope_theta"], "tied": c.tie_word_embeddings,
  }
  return write_raw_checkpoint(directory, config, {_toy_key(k): v for k, v in state_numpy(model).items()})


SMALL_HEADS = 4  # as many kv heads as heads: what a ChatGLM config without multi_query_attention means


def per_head_qkv(q, k, v, heads):
  """[heads * hd, ...] q, k, v -> the per-head fused layout: head h's q rows, then its k rows, then its v rows."""
  split = lambda x: x.reshape(heads, -1, *x.shape[1:])
  return np.concatenate([split(q), split(k), split(v)], axis=1).reshape(-1, *q.shape[1:])


def chatglm_checkpoint(model, directory, multi_query: bool = True):
  """The THUDM ChatGLM (GLM-4 / GLM-4-Voice) layout of a transformers Glm model: fused qkv, dense_h_to_4h. With
  multi-query attention the fused q/k/v is `[q | k | v]`; without it (as many kv heads as heads) it is laid out
  per head, as modeling_chatglm.py's SelfAttention views it: `[heads, 3 * head_dim]`."""
  sd, c = state_numpy(model), model.config
  fuse = np.concatenate if multi_query else lambda qkv: per_head_qkv(*qkv, c.num_attention_heads)
  out = {
    "transformer.embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
    "transformer.encoder.final_layernorm.weight": sd["model.norm.weight"],
    "transformer.output_layer.weight": sd["lm_head.weight"],
    "transformer.rotary_pos_emb.inv_freq": np.ones(c.head_dim // 4, np.float32),  # a buffer ChatGLM saves
  }
  for i in range(c.num_hidden_layers):
    src, dst = f"model.layers.{i}", f"transformer.encoder.layers.{i}"
    qkv = {part: [sd[f"{src}.self_attn.{n}_proj.{part}"] for n in "qkv"] for part in ("weight", "bias")}
    out.update({
      f"{dst}.input_layernorm.weight": sd[f"{src}.input_layernorm.weight"],
      f"{dst}.post_attention_layernorm.weight": sd[f"{src}.post_attention_layernorm.weight"],
      f"{dst}.self_attention.query_key_value.weight": fuse(qkv["weight"]),
      f"{dst}.self_attention.query_key_value.bias": fuse(qkv["bias"]),
      f"{dst}.self_attention.dense.weight": sd[f"{src}.self_attn.o_proj.weight"],
      f"{dst}.mlp.dense_h_to_4h.weight": sd[f"{src}.mlp.gate_up_proj.weight"],
      f"{dst}.mlp.dense_4h_to_h.weight": sd[f"{src}.mlp.down_proj.weight"],
    })
  config = {
    "model_type": "chatglm", "architectures": ["ChatGLMModel"], "num_layers": c.num_hidden_layers,
    "padded_vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "ffn_hidden_size": c.intermediate_size,
    "kv_channels": c.head_dim, "num_attention_heads": c.num_attention_heads, "multi_query_attention": multi_query,
    "layernorm_epsilon": c.rms_norm_eps, "rope_ratio": c.rope_parameters["rope_theta"] / 10000.0,
    "add_qkv_bias": True, "add_bias_linear": False, "rmsnorm": True, "original_rope": True,
    "apply_residual_connection_post_layernorm": False, "post_layer_norm": True,
  }
  if multi_query:
    config["multi_query_group_num"] = c.num_key_value_heads
  return write_raw_checkpoint(directory, config, out)
