"""The in-training Evaluator: the two-stage example trains what each stage should, and logs S2SBench curves."""

import os

import jax
import numpy as np
import pytest

from s2sjax.examples.two_stage_training import train

pytestmark = pytest.mark.slow  # trains and evaluates a model


def test_two_stage_schedule_freezes_the_right_params_and_logs_curves(tmp_path, qwen_tokenizer_dir):
  out = str(tmp_path / "out")
  summary = train(qwen_tokenizer_dir, str(tmp_path / "data"), out, steps_per_stage=2, eval_every=2)
  initial = summary["initial_params"]
  stage1, stage2 = summary["params_after_stage"]
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert same(stage1["layers"], initial["layers"]) and same(stage1["embed"], initial["embed"])
  assert not same(stage1["audio_embed_0"], initial["audio_embed_0"]) and not same(stage1["lm_head"], initial["lm_head"])
  assert same(stage2["embed"], stage1["embed"]) and same(stage2["lm_head"], stage1["lm_head"])
  assert not same(stage2["layers"], stage1["layers"]) and not same(stage2["audio_embed_0"], stage1["audio_embed_0"])
  losses = [entry["train_loss"] for entry in summary["train_log"]]
  assert len(losses) == 4 and losses[-1] < losses[0]
  assert [h["step"] for h in summary["history"]] == [2, 4]
  assert summary["compilations"] == 2  # text rows and speech rows: two shapes, each compiled once
  for name in ("curves_accuracy.png", "curves_loss.png", "training_history.json"):
    assert os.path.exists(os.path.join(out, name))
