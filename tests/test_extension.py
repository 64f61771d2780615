"""A task and a model family that only the tests define (tests/plugins/, one file each), run end to end through the
command lines — convert, tasks.prepare, s2sjax.eval — with nothing else added: the registries are the only places
that know tasks and families."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoTokenizer

from s2sjax.runtime import plugins
from tasks.sample import RELEASE_DIR
from tests.hf_models import tiny_model, toy_family_checkpoint, torch_log_probs

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGINS = "tests.plugins.toy_task,tests.plugins.toy_family"
STORIES = 4


def _toy_release(root: pathlib.Path) -> list[dict]:
  """The toy task's release: the bundled sample's first stories, in the files its record names (written out
  here, not read from the record, so a record that pointed elsewhere would fail)."""
  lines = [json.loads(line) for line in open(os.path.join(RELEASE_DIR, "StoryCloze", "sStory_s2t.jsonl"))]
  lines = lines[: 2 * STORIES]
  (root / "Toy" / "toy_cloze_wav").mkdir(parents=True)
  with open(root / "Toy" / "toy_cloze.jsonl", "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  for line in lines:
    shutil.copy(os.path.join(RELEASE_DIR, "StoryCloze", "s-story-firstspeech", f"{line['uttid']}.wav"),
                root / "Toy" / "toy_cloze_wav" / f"{line['uttid']}.wav")
  return lines


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, plugins.ENV: PLUGINS}
  done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return done


@pytest.mark.slow
def test_a_plugin_task_and_a_plugin_family_end_to_end(tmp_path, qwen_tokenizer_dir):
  lines = _toy_release(tmp_path / "release")
  model = tiny_model("llama", vocab_size=151_680, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
  source = toy_family_checkpoint(model, str(tmp_path / "toy-source"))
  for name in os.listdir(qwen_tokenizer_dir):
    shutil.copy(os.path.join(qwen_tokenizer_dir, name), source)
  ckpt, data, out = tmp_path / "toy-ckpt", tmp_path / "data", tmp_path / "out"

  _cli("checkpoints_conversion.convert", f"--source={source}", f"--output={ckpt}")
  _cli("tasks.prepare", "--task=toy_cloze", "--modality=text", f"--manual_dir={tmp_path / 'release'}",
       f"--tokenizer_dir={ckpt / 'tokenizer'}", f"--data_dir={data}")
  _cli("s2sjax.eval", "--task=toy_cloze", "--modality=text", f"--checkpoint={ckpt}", f"--data_dir={data}",
       f"--output_dir={out}", "--batch_size=4")

  assert json.load(open(ckpt / "model_config.json"))["family"] == "toyllama"
  result = json.load(open(out / "metrics.json"))["runs"][0]["tasks"]["toy_cloze"]["t2t"]
  assert result["questions"] == STORIES
  assert open(out / "table.md").readline().strip() == "| model | modality | ToyCloze |"

  # every candidate's NLL against transformers on the original weights, the S2SBench way: prefix, then " " + ending
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  scores = [json.loads(line) for line in open(out / "toy-ckpt" / "toy_cloze-t2t.scores.jsonl")]
  by_uttid = {str(line["uttid"]): line for line in lines}
  for score in scores:
    line = by_uttid[score["uttid"]]
    prefix = tokenizer(line["first"])["input_ids"]
    ending = tokenizer(" " + line["last"], add_special_tokens=False)["input_ids"]
    log_probs = torch_log_probs(model, np.array([prefix + ending]))[0]
    reference = -sum(log_probs[len(prefix) - 1 + j, token] for j, token in enumerate(ending)) / len(ending)
    assert score["n_tokens"] == len(ending) and abs(score["nll_sum"] / score["n_tokens"] - reference) <= 1e-4
  # and the task's decision rule (story pairs, strictly lower loss wins) over those scores
  loss = {s["uttid"]: s["nll_sum"] / s["n_tokens"] for s in scores}
  right = [loss[str(2 * k)] < loss[str(2 * k + 1)] for k in range(STORIES)]
  assert result["accuracy"] == sum(right) / STORIES
