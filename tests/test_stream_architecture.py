"""A second stream architecture that only the tests define (tests/plugins/toy_streams.py: per-codebook bigram
tables over stream rows), registered through S2SJAX_PLUGINS and run through the command lines, tasks.prepare and
s2sjax.eval, with nothing else added: the architecture and row-format registries are the only places that know
which model reads which rows. Its scores are held to the bigram NLLs computed here from the codes themselves."""

import glob
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import plugins
from tasks.release import read_questions
from tasks.sample import RELEASE_DIR
from tests.plugins.toy_streams import CARD, CODEBOOKS, NAME, ToyStreamsConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASK = "sstorycloze"


def _cli(module: str, *args: str) -> None:
  env = {**os.environ, plugins.ENV: "tests.plugins.toy_streams"}
  done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _codes(directory: pathlib.Path) -> dict[str, np.ndarray]:
  """Precomputed codes: `<uttid>.npy` per spoken prefix and `candidates/<name>.npy` per spoken ending."""
  rng = np.random.default_rng(0)
  (directory / "candidates").mkdir(parents=True)
  written = {}
  for question in read_questions(TASK, RELEASE_DIR):
    prefix = rng.integers(0, CARD, (int(rng.integers(3, 12)), CODEBOOKS))
    for c, uttid in enumerate(question.uttids):
      name = "candidates/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]
      written[uttid], written[name] = prefix, rng.integers(0, CARD, (int(rng.integers(2, 8)), CODEBOOKS))
  for name, codes in written.items():
    np.save(directory / f"{name}.npy", codes)
  return written


def _bigram_nll(table: np.ndarray, prefix: np.ndarray, candidate: np.ndarray) -> float:
  """Each candidate code's -log softmax(table[k][previous code]), the first predicted from the prefix's last code
  (from the initial token, CARD, with no prefix), summed over codebooks and steps."""
  codes = np.concatenate([prefix, candidate])
  total = 0.0
  for j in range(len(candidate)):
    t = len(prefix) + j
    for k in range(CODEBOOKS):
      logits = table[k, codes[t - 1, k] if t > 0 else CARD].astype(np.float64)
      total += np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[codes[t, k]]
  return total


@pytest.mark.slow
def test_a_plugin_stream_architecture_builds_and_scores(tmp_path, qwen_tokenizer_dir):
  codes = _codes(tmp_path / "codes")
  table = np.random.default_rng(1).normal(size=(CODEBOOKS, CARD + 1, CARD)).astype(np.float32)
  config = ToyStreamsConfig(text_vocab=151_680, codebooks=CODEBOOKS, card=CARD)
  ckpt, data, out = tmp_path / "ckpt", tmp_path / "data", tmp_path / "out"
  checkpoint.save_params(ckpt, config, {"bigram": table}, tokenizer_dir=qwen_tokenizer_dir)

  _cli("tasks.prepare", f"--task={TASK}", "--modality=s2s", f"--spec={NAME}", "--row_length=256",
       f"--manual_dir={RELEASE_DIR}", f"--tokenizer_dir={qwen_tokenizer_dir}",
       f"--audio_tokenizer_dir={tmp_path / 'codes'}", f"--data_dir={data}")
  _cli("s2sjax.eval", f"--task={TASK}", "--modality=s2s", f"--spec={NAME}", "--row_length=256",
       f"--checkpoint={ckpt}", f"--data_dir={data}", f"--output_dir={out}", "--batch_size=4")

  (path,) = glob.glob(str(out / "*" / f"{TASK}-s2s.scores.jsonl"))
  lines = [json.loads(line) for line in open(path)]
  by_id = {q.id: q for q in read_questions(TASK, RELEASE_DIR)}
  assert len(lines) == 2 * len(by_id)
  for line in lines:
    question, c = by_id[line["question"]], line["candidate"]
    prefix = codes[question.uttids[c]]
    candidate = codes["candidates/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]]
    assert line["n_tokens"] == len(candidate)
    expected = _bigram_nll(table, prefix, candidate)
    assert abs(line["nll_sum"] - expected) <= 1e-4 * max(1.0, abs(expected)), (line, expected)
