"""The vendor layouts as their real releases ship them: ChatGLM without multi-query attention, Baichuan-Audio with
its audio tokenizer, audio head and vision modules, and the config switches the decoder refuses by name.

Rules restated from upstream (read, not copied): GLM-4 `modeling_chatglm.py` SelfAttention.forward (the fused
query_key_value is split [q | k | v] with multi_query_attention, else viewed [heads, 3 * head_dim]); Baichuan-Audio
`configuration_omni.py` OmniConfig.__init__ (position_embedding_type rope|alibi, sparse_attention_layers,
attention_qkv_pack) and `modeling_omni.py` (Attention.__init__ / forward, OmniModel.__init__,
OmniForCausalLM.__init__, OmniAudioTokenizer.__init__, OmniModel.get_multimodal_embed)."""

import numpy as np
import pytest

from checkpoints_conversion.convert import convert, report
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model.families import from_hf_config
from s2sjax.model.config import ConfigError
from s2sjax.model.decoder import sequence_log_probs
from tests.hf_models import (
  BAICHUAN_RELEASE_KEPT, BAICHUAN_RELEASE_SKIPPED, SMALL_HEADS, baichuan_audio_checkpoint, baichuan_reference_log_probs,
  baichuan_release_config, chatglm_checkpoint, spoken_prefix, tiny_model, torch_log_probs)


def test_chatglm_without_multi_query_attention_matches_transformers_glm(tmp_path):
  model = tiny_model("glm", num_key_value_heads=SMALL_HEADS)
  convert(chatglm_checkpoint(model, str(tmp_path / "chatglm"), multi_query=False), str(tmp_path / "ckpt"))
  config, params = checkpoint.load_config(tmp_path / "ckpt"), checkpoint.load_params(tmp_path / "ckpt")
  assert config.num_kv_heads == config.num_heads == SMALL_HEADS
  ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, 520))
  diff = np.abs(np.asarray(sequence_log_probs(config, params, ids)) - torch_log_probs(model, ids))
  assert diff.max() <= 1e-4


def _baichuan_config(**overrides):
  return {**tiny_model("qwen2").config.to_dict(), "model_type": "omni", "rotary_emb_base": 10000.0,
          **baichuan_release_config((16, 8), 500), **overrides}


@pytest.mark.parametrize("overrides, named", [
  (dict(position_embedding_type="alibi"), "position_embedding_type='alibi'"),
  (dict(position_embedding_type="ALiBi"), "position_embedding_type='alibi'"),
  (dict(sparse_attention_layers=[1], sparse_attention_heads=2), "sparse_attention_layers=\\[1\\]"),
  (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_baichuan_switches_the_decoder_lacks_are_refused_by_name(overrides, named):
  from_hf_config(_baichuan_config())  # the release's own values parse
  with pytest.raises(ConfigError, match=named):
    from_hf_config(_baichuan_config(**overrides))


def test_chatglm_without_final_layernorm_is_refused():
  glm = {"model_type": "chatglm", "num_layers": 2, "padded_vocab_size": 64, "hidden_size": 32, "ffn_hidden_size": 48,
         "kv_channels": 8, "num_attention_heads": 4, "layernorm_epsilon": 1e-5}
  from_hf_config(glm)
  with pytest.raises(ConfigError, match="post_layer_norm=false"):
    from_hf_config(dict(glm, post_layer_norm=False))


def test_baichuan_release_converts_without_flags_and_scores_audio_like_the_reference(tmp_path):
  model = tiny_model("qwen2")
  sizes, placeholder = (16, 8, 8), 500
  source, tables, _ = baichuan_audio_checkpoint(model, str(tmp_path / "release"), sizes, placeholder, release=True)
  manifest = convert(source, str(tmp_path / "ckpt"), family="baichuan_audio")  # no --skip_prefix
  assert sorted(manifest["skipped"]) == sorted(BAICHUAN_RELEASE_SKIPPED)
  assert manifest["skipped_modules"] == {"audio_tokenizer.": 5, "model.visual_model.": 1,
                                         "model.visual_bridge_model.": 1}
  assert sorted(manifest["kept_as_extras"]) == sorted(BAICHUAN_RELEASE_KEPT + ("audio_head.heads.0.weight",))
  # the command's report names each module left out and what it is, the audio tokenizer as read from the release
  printed = report(manifest, str(tmp_path / "ckpt")).splitlines()
  assert printed[1:] == [
    "left out audio_tokenizer.* (5 tensors): the release's audio tokenizer (wave -> codes); the JAX Baichuan-Audio "
    "tokenizer reads it from the release folder itself: --audio_tokenizer_dir=<that folder>",
    "left out model.visual_model.* (1 tensor): the vision tower (scoring takes no images)",
    "left out model.visual_bridge_model.* (1 tensor): the vision bridge (scoring takes no images)"]
  config, params = checkpoint.load_config(tmp_path / "ckpt"), checkpoint.load_params(tmp_path / "ckpt")

  rng = np.random.default_rng(7)
  length, audio = 540, slice(30, 430)
  tokens, codes = spoken_prefix(rng, length, audio, placeholder, sizes)
  reference = baichuan_reference_log_probs(model, tokens, codes, tables)
  ours = np.asarray(sequence_log_probs(config, params, tokens, codes))
  assert np.abs(ours - reference).max() <= 1e-4
  silent = np.asarray(sequence_log_probs(config, params, tokens, np.where(codes >= 0, 0, -1)))
  assert np.abs(silent - reference).max() > 1e-2  # the codes, not only the placeholder, reach the model
