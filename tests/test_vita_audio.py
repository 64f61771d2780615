"""VITA-Audio (VITA-MLLM/VITA-Audio 0abaf17): a tiny release in its own key layout converts with no flags, keeping the
layers its main path scores and leaving the MCTP modules out by rule, each counted in the converter's report; the
converted model's log-probs are transformers' Qwen2 over those layers, within 1e-4.

The layout is `Qwen2MTPForCausalLM` (vita_audio/models/qwen2_mtp_v4_48_3/modeling_qwen2.py:781-797): a transformers
Qwen2 under `model.` and `lm_head`, num_hidden_layers of them, the last num_nextn_predict_layers being the MCTP
modules' (:867), plus `mtp_projs.{j}` Linear(2H, H) without bias and `mtp_embed_norms.{j}` / `mtp_hidden_norms.{j}`
RMSNorms; config.json as config_7B_mtp10.json (model_type qwen2_mtp) at tiny sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from checkpoints_conversion import convert
from s2sjax import checkpoint, families, logprobs
from s2sjax.model.config import ConfigError
from s2sjax.spec import load_spec
from tests.hf_models import state_numpy, tiny_model, torch_log_probs, write_raw_checkpoint

SCORED, MTP = 2, 3  # the tiny release: 5 layers, the last 3 MCTP modules'


def vita_release(directory) -> tuple[str, dict[str, np.ndarray]]:
  """A tiny VITA-Audio release (config.json as config_7B_mtp10.json spells it) and its tensors."""
  model = tiny_model("qwen2", num_hidden_layers=SCORED + MTP)
  tensors = state_numpy(model)
  rng = np.random.default_rng(0)
  hidden = model.config.hidden_size
  for j in range(MTP):
    tensors[f"mtp_projs.{j}.weight"] = rng.normal(size=(hidden, 2 * hidden)).astype(np.float32)
    tensors[f"mtp_embed_norms.{j}.weight"] = np.ones(hidden, np.float32)
    tensors[f"mtp_hidden_norms.{j}.weight"] = np.ones(hidden, np.float32)
  config = dict(model.config.to_dict(), model_type="qwen2_mtp", architectures=["Qwen2MTPForCausalLM"],
                num_nextn_predict_layers=MTP, use_sliding_window=False)
  return write_raw_checkpoint(str(directory), config, tensors), tensors


def test_vita_audio_release_converts_its_scored_layers_and_scores_as_qwen2(tmp_path):
  source, tensors = vita_release(tmp_path / "release")
  out = str(tmp_path / "ckpt")
  manifest = convert.convert(source, out)
  counted = {f"model.layers.{SCORED + j}.": 12 for j in range(MTP)}  # q/k/v weight and bias, o, mlp x3, 2 norms
  counted.update({"mtp_projs.": MTP, "mtp_embed_norms.": MTP, "mtp_hidden_norms.": MTP})
  assert manifest["skipped_modules"] == counted
  report = convert.report(manifest, out)
  assert f"left out model.layers.{SCORED}.* (12 tensors): MCTP module 0's transformer layer" in report
  assert f"left out mtp_projs.* ({MTP} tensors): the {MTP} MCTP modules' mtp_projs" in report
  assert checkpoint.load_config(out).num_layers == SCORED

  reference = tiny_model("qwen2", num_hidden_layers=SCORED)
  scored = {k: torch.from_numpy(v) for k, v in tensors.items()
            if not k.startswith(tuple(counted)) and not k.endswith("rotary_emb.inv_freq")}
  reference.load_state_dict(scored, strict=True)
  ids = np.random.default_rng(1).integers(0, reference.config.vocab_size, size=(1, 160))
  ours = logprobs.compute(out, ids).text
  assert np.abs(ours - torch_log_probs(reference.eval(), ids)[0]).max() < 1e-4


def test_vita_audio_config_needs_its_scored_layers():
  layout = families.layout_for_model_type("qwen2_mtp")
  shape = families.get("qwen2").planner_shapes["vita-audio-7b"]
  assert layout.parse_config(shape).num_layers == 28  # config_7B_mtp10.json: 38 layers, 10 of them MCTP
  with pytest.raises(ConfigError, match="num_nextn_predict_layers=38"):
    layout.parse_config(dict(shape, num_nextn_predict_layers=38))


# tools/inference_sts.py: the Luke system turn (:219-224) of run_infer's default mode, and its user turn of
# message + "\n<|audio|>" (:497-501) with the default message "" (:462).
LUKE = "Your Name: Luke\nYour Gender: male\n\nRespond in a text-audio interleaved manner."
AUDIO = "<|audio|>"


def test_vita_audio_spec_turns_are_its_chat_template_rendering(qwen_tokenizer_dir):
  """The spec's turns around the audio (or the text) and before the reply are what a Qwen chat template without a
  default system turn renders for the release's own messages, as VITA's qwen2_chat_template does
  (evaluation/get_chat_template.py:1; add_generation_prompt, inference_sts.py:201-205)."""
  from transformers import AutoTokenizer

  spec = load_spec("vita_audio")
  assert (spec.audio_mode, spec.codebook_sizes, spec.unit_token) == ("extended_vocab", (16384,), "<|audio_{}|>")
  template = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  speech = template.apply_chat_template([{"role": "system", "content": LUKE}, {"role": "user", "content": "\n" + AUDIO}],
                                        tokenize=False, add_generation_prompt=True)
  assert speech == spec.chat["speech"] + AUDIO + spec.chat["reply"]
  text = template.apply_chat_template([{"role": "user", "content": "TEXT"}], tokenize=False, add_generation_prompt=True)
  assert text == spec.chat["text"] + "TEXT" + spec.chat["reply"]
