"""Requests longer than the positions a model was trained on, in the lm-eval backend: its max_length comes from the
checkpoint (never 0), and a longer request is cut from the left to it, as lm-eval's hf backend cuts one
(lm_eval/models/huggingface.py, `_loglikelihood_tokens`: `(context + continuation)[-(max_length + 1):]`), with one
warning a call saying how many were cut."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import yaml

from s2sjax.commands.default_checkpoint import default_checkpoint
from s2sjax.commands.lm_eval import S2SJaxLM
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.checkpoints.stacks import maxtext
from tests.stack_fixtures import TINY_RUN, byte_tokenizer, tiny_maxtext_checkpoint


@pytest.fixture(scope="module")
def trained_to_64(tmp_path_factory):
  """The backend on a tiny MaxText run trained on 64 positions (max_target_length=64), whose config.yml (MaxText's
  save_config_to_gcs) names its byte-level tokenizer; rows of 256 positions, four times what it was trained on."""
  root = tmp_path_factory.mktemp("run")
  step = tiny_maxtext_checkpoint(str(root / "run" / "checkpoints" / "1"))
  keys = dict(token.split("=", 1) for token in TINY_RUN.split())
  keys["tokenizer_path"] = byte_tokenizer(str(root / "tokenizer"))
  (root / "run" / "config.yml").write_text(yaml.safe_dump(keys))
  opened = []
  with pytest.MonkeyPatch.context() as patch:
    original = maxtext.StepFolder.__init__
    patch.setattr(maxtext.StepFolder, "__init__", lambda self, *args: opened.append(args[0]) or original(self, *args))
    backend = S2SJaxLM(pretrained=step, row_length=256, batch_size=2, device="cpu:0")
  backend.opened = opened
  return backend


@pytest.mark.slow
def test_the_maximum_is_the_checkpoints_trained_positions(trained_to_64):
  assert trained_to_64.opened == [trained_to_64.checkpoint]  # the folder read once: config, params, tokenizer
  assert trained_to_64.max_length == 64  # not the row's 255
  # a converted checkpoint: its source config.json's max_position_embeddings (SmolLM2-135M: 8,192)
  assert checkpoint.open(default_checkpoint()).max_positions == 8192


@pytest.mark.slow
def test_a_request_past_the_trained_positions_is_cut_from_the_left_with_one_warning(trained_to_64, caplog):
  rng = np.random.default_rng(0)
  long_context, short = rng.integers(1, 256, 200).tolist(), rng.integers(1, 256, 20).tolist()
  continuation = rng.integers(1, 256, 5).tolist()
  pairs = [(("", ""), long_context, continuation), (("", ""), short, continuation),
           (("", ""), long_context[::-1], continuation)]
  with caplog.at_level(logging.WARNING, logger="lm_eval.s2sjax"):
    got = trained_to_64._loglikelihood_tokens(pairs)
  # the hf rule by hand: the last max_length + 1 tokens of context + continuation, the context losing its first
  kept = 64 + 1 - len(continuation)
  cut = trained_to_64._loglikelihood_tokens([(("", ""), long_context[-kept:], continuation),
                                             (("", ""), long_context[::-1][-kept:], continuation)])
  assert [got[0], got[2]] == cut and all(np.isfinite(g[0]) for g in got)
  warnings = [r.getMessage() for r in caplog.records if "contexts cut from the left" in r.getMessage()]
  assert warnings == [
    "2 of 3 requests: contexts cut from the left to fit max_length=64 (the model's trained positions, or "
    "row_length - 1 when fewer) with their continuation, as the hf backend cuts them (the first: request 0)"]
