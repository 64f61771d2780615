"""No question is built or scored past the positions its model was trained to.

A release holding one story far longer than the others: `tasks.prepare` finds the model's trained positions beside
the text tokenizer (the converted checkpoint's model_config.json, a transformers folder's config.json, the
tokenizer's model_max_length; `tasks.build.trained_positions`) or takes a smaller `--max_item_tokens`, and refuses
the long story in one line naming it and the positions it reads, or with --skip_bad leaves it out and counts it.
Data built without that limit (elsewhere, for another model) is refused by the evaluator for a checkpoint whose
config says fewer positions, naming the question, before anything is scored.

The positions a question reads are worked out here from the tokenization rule (tasks/encoders.py: the prefix with
the tokenizer's special tokens, the candidate " " + last without; a candidate's last token is predicted, never
read), not taken from the builder.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from s2sjax.data import task_registry
from s2sjax.data.task_data import load_task_data
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.evaluator import EvalError, Evaluator
from s2sjax.model import decoder
from s2sjax.model.config import ModelConfig
from tasks.build import BuildError, PositionLimit, position_limit, trained_positions
from tasks.preparation import prepare

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONG_FIRST = " ".join(f"On day {n} Tom walked to the old mill by the river and counted the geese." for n in range(30))
STORIES = [  # story 0 short, story 1 (uttids 2 and 3) long
  {"uttid": 0, "first": "Tom went out.", "last": "He came back."}, {"uttid": 1, "first": "Tom went out.",
                                                                    "last": "Fish sang."},
  {"uttid": 2, "first": LONG_FIRST, "last": "He went home."}, {"uttid": 3, "first": LONG_FIRST, "last": "Geese sang."}]
MODEL_POSITIONS = 128  # the model's, as its folder says


def _release(root: pathlib.Path) -> pathlib.Path:
  record = task_registry.get("sstorycloze")
  (root / record.release_jsonl).parent.mkdir(parents=True)
  (root / record.release_jsonl).write_text("".join(json.dumps(line) + "\n" for line in STORIES))
  return root


def _reads(tokenizer, first: str, last: str) -> int:
  """Positions the prefix and candidate read: every prefix token, every candidate token but its last."""
  return len(tokenizer(first)["input_ids"]) + len(tokenizer(" " + last, add_special_tokens=False)["input_ids"]) - 1


@pytest.fixture(scope="module")
def long_story(tmp_path_factory, qwen_tokenizer_dir):
  """The release, and Qwen2.5's tokenizer as a transformers model folder whose config.json says 128 positions."""
  from transformers import AutoTokenizer

  root = tmp_path_factory.mktemp("long_story")
  model = root / "model"
  shutil.copytree(qwen_tokenizer_dir, model)
  (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": MODEL_POSITIONS}))
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  reads = max(_reads(tokenizer, line["first"], line["last"]) for line in STORIES[2:])
  assert max(_reads(tokenizer, line["first"], line["last"]) for line in STORIES[:2]) < 64 < MODEL_POSITIONS < reads
  return {"release": _release(root / "release"), "model": model, "reads": reads,
          "short_reads": _reads(tokenizer, STORIES[0]["first"], STORIES[0]["last"])}


def _prepare(tmp_path, long_story, *flags) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "tasks.prepare", "--task=sstorycloze", "--modality=t2t",
                         f"--manual_dir={long_story['release']}", f"--tokenizer_dir={long_story['model']}",
                         f"--data_dir={tmp_path / 'data'}", *flags], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)


@pytest.mark.slow
def test_a_story_past_the_models_positions_is_refused_naming_it_or_left_out_counted(tmp_path, long_story):
  refused = _prepare(tmp_path, long_story)
  assert refused.returncode == 1, refused.stdout + refused.stderr
  assert refused.stderr.splitlines() == [
    f"error: question 2: its prefix and longest candidate read {long_story['reads']} positions, past the "
    f"{MODEL_POSITIONS} of {long_story['model'] / 'config.json'} max_position_embeddings: a model's scores past its "
    "trained positions mean nothing (pass --skip_bad to leave such questions out, counted)",
    "(--verbosity=1 shows where it was raised)"]
  assert not list((tmp_path / "data").rglob("dataset_info.json"))

  built = _prepare(tmp_path, long_story, "--skip_bad")
  assert built.returncode == 0, built.stdout + built.stderr
  report = json.loads(built.stdout.splitlines()[0].split(": ", 1)[1])
  assert (report["questions"], report["skipped"], report["questions_past_max_item_positions"]) == (1, 1, 1)
  assert report["max_item_positions"] == MODEL_POSITIONS and report["row_length"] == 1024
  assert built.stdout.splitlines()[1].startswith(
    f"  left out question 2: its prefix and longest candidate read {long_story['reads']} positions, past the")
  data = load_task_data(str(tmp_path / "data"), "sstorycloze", "t2t", "demo", None)
  assert data.questions.ids == ("0",) and int(data.rows["positions"].max()) < MODEL_POSITIONS


@pytest.mark.slow
def test_max_item_tokens_below_the_models_positions_refuses_the_stories_past_it(tmp_path, long_story):
  done = _prepare(tmp_path, long_story, "--max_item_tokens=4")
  assert done.returncode == 1 and done.stderr.startswith(
    f"error: question 0: its prefix and longest candidate read {long_story['short_reads']} positions, past the 4 of "
    "--max_item_tokens:"), done.stderr


def test_the_trained_positions_are_read_where_the_tokenizer_folder_says_them(tmp_path, qwen_tokenizer_dir):
  """A converted checkpoint's model_config.json before config.json before tokenizer_config.json's
  model_max_length; transformers' "no limit" (int(1e30)) and a checkpoint's 0 say nothing."""
  ckpt = tmp_path / "ckpt"
  folder = ckpt / "tokenizer"
  shutil.copytree(qwen_tokenizer_dir, folder)
  settings = json.loads((folder / "tokenizer_config.json").read_text())
  assert trained_positions(str(folder)) == PositionLimit(
    settings["model_max_length"], f"{folder / 'tokenizer_config.json'} model_max_length")  # Qwen2.5's: 131072
  (folder / "tokenizer_config.json").write_text(json.dumps(dict(settings, model_max_length=int(1e30))))
  assert trained_positions(str(folder)) is None
  (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
  assert trained_positions(str(folder)) == PositionLimit(4096, f"{folder / 'config.json'} max_position_embeddings")
  (ckpt / checkpoint.CONFIG).write_text(json.dumps({"family": "llama", "max_positions": 0}))
  assert trained_positions(str(folder)).positions == 4096
  (ckpt / checkpoint.CONFIG).write_text(json.dumps({"family": "llama", "max_positions": 8192}))
  assert trained_positions(str(folder)) == PositionLimit(8192, f"{ckpt / checkpoint.CONFIG} max_positions")
  assert position_limit(100, str(folder)) == PositionLimit(100, "--max_item_tokens")
  assert position_limit(10_000, str(folder)).positions == 8192 and position_limit(None, None) is None
  with pytest.raises(BuildError, match=r"--max_item_tokens=0: the most positions an item may read is a positive"):
    position_limit(0, None)


def _tiny(max_positions: int) -> ModelConfig:
  return ModelConfig(family="qwen2", vocab_size=151_680, hidden_size=32, intermediate_size=64, num_layers=1,
                     num_heads=2, num_kv_heads=1, head_dim=16, rope_theta=1e4, rotary_dim=16, rope_interleaved=False,
                     qkv_bias=True,
                     rms_norm_eps=1e-6, o_bias=False, mlp_bias=False, tie_embeddings=True, max_positions=max_positions)


@pytest.mark.slow
def test_data_built_without_the_limit_is_refused_by_a_checkpoint_trained_to_fewer_positions(tmp_path, long_story,
                                                                                           qwen_tokenizer_dir):
  """Built with the bare Qwen2.5 tokenizer (131,072 positions) the long story is laid; a checkpoint whose config
  says 128 refuses the data in the evaluator, naming the question and what it reads, and `s2sjax.eval` exits 1
  with that line, writing no score; one that says enough positions, or none, takes it."""
  prepare("sstorycloze", "demo", "t2t", 1024, str(tmp_path / "data"), manual_dir=str(long_story["release"]),
          tokenizer_dir=qwen_tokenizer_dir)
  data = load_task_data(str(tmp_path / "data"), "sstorycloze", "t2t", "demo", 1024)
  said = (f"sstorycloze/t2t: question 2 candidate 0 reads {long_story['reads']} positions (its prefix and "
          f"candidate), past the {MODEL_POSITIONS} the checkpoint was trained to; 1 row(s) hold such items: rebuild "
          f"the data with python -m tasks.prepare --max_item_tokens={MODEL_POSITIONS}, which refuses them by name "
          "(--skip_bad leaves them out)")
  with pytest.raises(EvalError) as refused:
    Evaluator(_tiny(MODEL_POSITIONS), [data])
  assert str(refused.value) == said
  for enough in (0, long_story["reads"]):
    Evaluator(_tiny(enough), [data])

  config = _tiny(MODEL_POSITIONS)
  params = jax.tree.map(lambda leaf: np.full(leaf.shape, 0.01, leaf.dtype), decoder.abstract_params(config))
  checkpoint.save_params(tmp_path / "ckpt", config, params, tokenizer_dir=qwen_tokenizer_dir)
  done = subprocess.run([sys.executable, "-m", "s2sjax.eval", f"--checkpoint={tmp_path / 'ckpt'}",
                         f"--data_dir={tmp_path / 'data'}", "--task=sstorycloze", "--modality=t2t", "--row_length=1024",
                         f"--output_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 1 and f"error: {said}" in done.stderr.splitlines(), done.stderr[-3000:]
  assert not list(tmp_path.glob("out/**/*.scores.jsonl"))
