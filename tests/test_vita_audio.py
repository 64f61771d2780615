"""VITA-Audio (VITA-MLLM/VITA-Audio 0abaf17): a tiny release in its own key layout converts with no flags, keeping the
layers its main path scores and leaving the MCTP modules out by rule, each counted in the converter's report; the
converted model's log-probs are transformers' Qwen2 over those layers, within 1e-4.

The layout is `Qwen2MTPForCausalLM` (vita_audio/models/qwen2_mtp_v4_48_3/modeling_qwen2.py:781-797): a transformers
Qwen2 under `model.` and `lm_head`, num_hidden_layers of them, the last num_nextn_predict_layers being the MCTP
modules' (:867), plus `mtp_projs.{j}` Linear(2H, H) without bias and `mtp_embed_norms.{j}` / `mtp_hidden_norms.{j}`
RMSNorms; config.json as config_7B_mtp10.json (model_type qwen2_mtp) at tiny sizes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from checkpoints_conversion import convert
from s2sjax.scoring import log_probs
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model import families
from s2sjax.model.config import ConfigError
from s2sjax.data.spec import load_spec
from tests.hf_models import state_numpy, tiny_model, torch_log_probs, write_raw_checkpoint
from tests.test_audio_builds import needs_oracles

SCORED, MTP = 2, 3  # the tiny release: 5 layers, the last 3 MCTP modules'


def vita_release(directory, **overrides) -> tuple[str, dict[str, np.ndarray]]:
  """A tiny VITA-Audio release (config.json as config_7B_mtp10.json spells it) and its tensors."""
  model = tiny_model("qwen2", num_hidden_layers=SCORED + MTP, **overrides)
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


MCTP_KEYS = {f"model.layers.{SCORED + j}.": 12 for j in range(MTP)}  # q/k/v weight and bias, o, mlp x3, 2 norms
MCTP_KEYS.update({"mtp_projs.": MTP, "mtp_embed_norms.": MTP, "mtp_hidden_norms.": MTP})


def scored_reference(tensors: dict[str, np.ndarray], **overrides):
  """transformers' Qwen2 over the release's scored layers, its MCTP tensors left out."""
  reference = tiny_model("qwen2", num_hidden_layers=SCORED, **overrides)
  scored = {k: torch.from_numpy(v) for k, v in tensors.items()
            if not k.startswith(tuple(MCTP_KEYS)) and not k.endswith("rotary_emb.inv_freq")}
  reference.load_state_dict(scored, strict=True)
  return reference.eval()


def test_vita_audio_release_converts_its_scored_layers_and_scores_as_qwen2(tmp_path):
  source, tensors = vita_release(tmp_path / "release")
  out = str(tmp_path / "ckpt")
  manifest = convert.convert(source, out)
  assert manifest["skipped_modules"] == MCTP_KEYS
  report = convert.report(manifest, out)
  assert f"left out model.layers.{SCORED}.* (12 tensors): MCTP module 0's transformer layer" in report
  assert f"left out mtp_projs.* ({MTP} tensors): the {MTP} MCTP modules' mtp_projs" in report
  assert checkpoint.load_config(out).num_layers == SCORED

  reference = scored_reference(tensors)
  ids = np.random.default_rng(1).integers(0, reference.config.vocab_size, size=(1, 160))
  ours = log_probs.compute(out, ids).text
  assert np.abs(ours - torch_log_probs(reference, ids)[0]).max() < 1e-4


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


def laid_requests(td) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
  """Per (question, candidate) its token rows read back: (prefix ids, candidate ids), the candidate's last token
  from the target table (it is predicted, not laid)."""
  rows, out = td.rows, {}
  for record in td.metadata.questions:
    for c, (item, j) in enumerate(record["slots"]):
      r, s = np.argwhere((rows["slot_item"] == item) & (rows["slot_candidate"] == j))[0]
      targets = rows["target_ids"][r][rows["target_slot"][r] == s]
      segment = rows["segment_ids"][r, rows["target_pos"][r][rows["target_slot"][r] == s][0]]
      prefix = rows["tokens"][r][(rows["segment_ids"][r] == segment) & (rows["branch_ids"][r] == 0)]
      out[(record["id"], c)] = prefix, targets
  return out


@pytest.mark.slow
@needs_oracles  # GLM-4-Voice's tokenizer, from the oracles
def test_the_spec_scores_the_bundled_sample_end_to_end(tmp_path, qwen_tokenizer_dir):
  """The bundled sample's S->T and T->T built with the vita_audio spec (its GLM-4-Voice units from the project's JAX
  tokenizer, at the oracle tokenizer's 128 codes) and scored by s2sjax.eval on a tiny converted release: each
  request is the release's chat turns around the prefix, and each candidate's NLL is transformers' Qwen2 over the
  scored layers on those ids; the Table 1 file gains the model's S->T and T->T rows."""
  from transformers import AutoTokenizer

  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.scoring.evaluator import ScoringOptions
  from s2sjax.data.task_data import load_task_data
  from tasks.audio.glm4_voice import Glm4VoiceTokenizer
  from tasks.preparation import prepare
  from tests.test_audio_builds import ORACLES, oracle_spec, text_tokenizer

  glm4 = Glm4VoiceTokenizer(str(ORACLES / "glm4voice_tokenizer"))
  spec_path = oracle_spec(tmp_path, "vita_audio", glm4)
  spec = load_spec(spec_path)
  tokenizer_dir = text_tokenizer(tmp_path, qwen_tokenizer_dir, spec)
  tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
  size = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64)
  source, tensors = vita_release(tmp_path / "release", **size)
  tokenizer.save_pretrained(source)
  ckpt = str(tmp_path / "vita-tiny")
  convert.convert(source, ckpt)
  data = str(tmp_path / "data")
  for modality in ("t2t", "s2t"):
    prepare("sstorycloze", spec_path, modality, None, data, tokenizer_dir=tokenizer_dir,
            audio_tokenizer_dir=str(ORACLES / "glm4voice_tokenizer"))
  out = str(tmp_path / "out")
  run(EvalConfig(tasks=("sstorycloze",), modalities=("t2t", "s2t"), checkpoints=ckpt, spec=spec_path, data_dir=data,
                 output_dir=out, chunk_rows=4, scoring=ScoringOptions(batch_size=4)))

  reference = scored_reference(tensors, **size)
  for modality, turn in (("t2t", spec.chat["text"]), ("s2t", spec.chat["speech"])):
    lines = {(line["question"], line["candidate"]): line
             for line in map(json.loads, open(os.path.join(out, "vita-tiny", f"sstorycloze-{modality}.scores.jsonl")))}
    laid = laid_requests(load_task_data(data, "sstorycloze", modality, spec_path, None))
    assert set(laid) == set(lines) and len(lines) == 48
    for key, (prefix, candidate) in list(laid.items())[:8]:
      text = tokenizer.decode(prefix)
      assert text.startswith(turn) and text.endswith(spec.chat["reply"])
      assert ("<|begin_of_audio|><|audio_" in text) == (modality == "s2t")
      ids = np.concatenate([prefix, candidate])[None]
      log_probs = torch_log_probs(reference, ids)[0]
      expected = -log_probs[np.arange(len(prefix) - 1, ids.shape[1] - 1), candidate].sum()
      assert lines[key]["n_tokens"] == len(candidate)
      assert abs(lines[key]["nll_sum"] - expected) < 1e-4 * len(candidate), (key, lines[key]["nll_sum"], expected)
  table = open(os.path.join(out, "table.md")).read()
  assert "| vita-tiny | T→T |" in table and "| vita-tiny | S→T |" in table
