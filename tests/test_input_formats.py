"""How a model takes audio is one registered input format (s2sjax/data/formats): the built-in formats' typed rows, and a
plugin's own (tests/plugins/toy_features.py: two id streams and a float feature track, Kimi-Audio's input in
small) built by tasks.prepare and scored by s2sjax.eval with no project file naming it, every NLL held to a float64
reference computed from its inputs."""

import glob
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.data import formats
from s2sjax.runtime import plugins
from s2sjax.data.rows import STREAM_ROWS, TOKEN_ROWS, Field
from s2sjax.data.spec import SpecError, load_spec, spec_from_dict
from tasks.release import read_questions
from tasks.sample import RELEASE_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASK = "sstorycloze"


def test_every_built_in_spec_names_a_registered_format():
  for name, mode, rows in (("demo", "extended_vocab", TOKEN_ROWS), ("demo_tables", "codebook_tables", TOKEN_ROWS),
                           ("qwen2.5", "none", TOKEN_ROWS), ("moshi", "parallel_streams", STREAM_ROWS)):
    spec = load_spec(name)
    assert spec.input_format is formats.get(mode) and spec.row_format is rows


def test_a_stream_spec_names_the_architecture_whose_protocol_lays_it():
  """Stream rows are laid by the protocol of the architecture the spec names (s2sjax/data/formats/streams.py): a
  stream spec naming none is refused when read, one naming an architecture no protocol is registered for when its
  protocol is asked, each naming the spec."""
  moshi = {"name": "x", "audio_mode": "parallel_streams", "audio_tokenizer": {"type": "precomputed"},
           "codebook_sizes": [8, 8], "stream_delays": [0, 0, 1], "text_initial_id": 16}
  with pytest.raises(SpecError, match=r"spec x: parallel_streams names the architecture whose protocol lays its "
                                      r"streams \(`architecture`\)"):
    spec_from_dict(moshi)
  assert spec_from_dict(dict(moshi, architecture="moshi")).stream_protocol().weights("s2s", 2) == (0, 100, 1)
  with pytest.raises(SpecError, match=r"spec x: unknown stream protocol 'morse'; stream protocols: moshi.*"
                                      r"S2SJAX_PLUGINS"):
    spec_from_dict(dict(moshi, architecture="morse")).stream_protocol()


def test_an_unknown_audio_mode_lists_the_registered_formats():
  with pytest.raises(SpecError, match=r"spec x: audio_mode 'morse' is not one of none, extended_vocab, "
                                      r"codebook_tables, parallel_streams"):
    spec_from_dict({"name": "x", "audio_mode": "morse", "audio_tokenizer": {"type": "precomputed"}})


def test_token_rows_hash_as_the_int32_bytes_they_always_were():
  """Typed fields change no checksum of int32 rows: each field hashed as its little-endian bytes."""
  rows = {"tokens": np.arange(8, dtype=np.int32).reshape(2, 4), "target_ids": np.ones((2, 3), np.int32)}
  digest = hashlib.sha256()
  for name in sorted(rows):
    array = np.ascontiguousarray(rows[name], dtype="<i4")
    digest.update(f"{name}{list(array.shape)}".encode() + b"\0" + array.tobytes())
  assert TOKEN_ROWS.checksum(rows) == digest.hexdigest()


def test_a_float_field_keeps_its_dtype_in_padding_and_refuses_an_unknown_one():
  from tests.plugins.toy_features import ROWS

  empty = ROWS.empty(2, type("Shape", (), {"length": 4, "max_targets": 3, "max_slots": 2})(), {"features": 5})
  assert empty["features"].dtype == np.float32 and empty["features"].shape == (2, 4, 5)
  assert empty["audio_ids"].dtype == np.int32 and ROWS.shapes(None, None, None, {"features": 5})["features"] == (
    None, 5)
  with pytest.raises(ValueError, match="dtype 'float64'"):
    Field("x", "L", 0.0, dtype="float64")


def _cli(module: str, *args: str) -> None:
  env = {**os.environ, plugins.ENV: "tests.plugins.toy_features"}
  done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _codes(directory: pathlib.Path, card: int) -> dict[str, np.ndarray]:
  """Precomputed codes of one codebook: `<uttid>.npy` per spoken prefix, `candidates/<name>.npy` per ending."""
  rng = np.random.default_rng(0)
  (directory / "candidates").mkdir(parents=True)
  written = {}
  for question in read_questions(TASK, RELEASE_DIR):
    prefix = rng.integers(0, card, (int(rng.integers(3, 10)), 1))
    for c, uttid in enumerate(question.uttids):
      name = "candidates/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]
      written[uttid], written[name] = prefix, rng.integers(0, card, (int(rng.integers(2, 7)), 1))
  for name, codes in written.items():
    np.save(directory / f"{name}.npy", codes)
  return written


def _log_softmax(logits: np.ndarray) -> np.ndarray:
  top = logits.max()
  return logits - top - np.log(np.exp(logits - top).sum())


@pytest.mark.slow
def test_a_plugin_model_of_two_id_streams_and_a_feature_track_builds_and_scores(tmp_path, qwen_tokenizer_dir):
  from transformers import AutoTokenizer

  from tests.plugins import toy_features as toy

  codes = _codes(tmp_path / "codes", toy.CARD)
  config = toy.ToyFeaturesConfig(text_vocab=toy.TEXT_VOCAB, card=toy.CARD, dim=8, feature_width=toy.FEATURE_WIDTH)
  rng = np.random.default_rng(1)
  params = {name: rng.normal(size=leaf.shape).astype(np.float32)
            for name, leaf in toy.abstract_params(config).items()}
  ckpt, data = tmp_path / "ckpt", tmp_path / "data"
  checkpoint.save_params(ckpt, config, params, tokenizer_dir=qwen_tokenizer_dir)
  common = [f"--task={TASK}", f"--spec={toy.NAME}", f"--data_dir={data}"]  # a row length chosen from its items
  _cli("tasks.prepare", *common, "--modality=s2t,s2s", f"--manual_dir={RELEASE_DIR}",
       f"--tokenizer_dir={qwen_tokenizer_dir}", f"--audio_tokenizer_dir={tmp_path / 'codes'}")
  _cli("s2sjax.eval", *common, "--modality=s2t,s2s", f"--checkpoint={ckpt}", f"--output_dir={tmp_path / 'out'}",
       "--batch_size=4")

  # The reference, in float64 from the inputs: each scored token predicted by the position before it, whose state
  # is both ids' embeddings and, on a spoken prefix's frames, the adapted features; text by the text head, codes by
  # the audio head.
  p64 = {name: value.astype(np.float64) for name, value in params.items()}
  special = toy.ids(toy.TEXT_VOCAB)
  state = lambda audio, text, features: p64["embed"][audio] + p64["embed"][text] + (
    0 if features is None else features.astype(np.float64) @ p64["adaptor"])
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  by_id = {q.id: q for q in read_questions(TASK, RELEASE_DIR)}
  for modality in ("s2t", "s2s"):
    (path,) = glob.glob(str(tmp_path / "out" / "*" / f"{TASK}-{modality}.scores.jsonl"))
    lines = [json.loads(line) for line in open(path)]
    assert len(lines) == 2 * len(by_id)
    for line in lines:
      question, c = by_id[line["question"]], line["candidate"]
      prefix = codes[question.uttids[c]]
      states = [state(special["audio_offset"] + code, special["text_blank"], feature)
                for code, feature in zip(prefix[:, 0], toy.features_of(prefix))]
      if modality == "s2t":
        targets = tokenizer(question.candidates[c], add_special_tokens=False)["input_ids"]
        states += [state(special["audio_blank"], token, None) for token in targets[:-1]]
        head = p64["text_head"]
      else:
        targets = codes["candidates/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]][:, 0]
        states += [state(special["audio_offset"] + code, special["text_blank"], None) for code in targets[:-1]]
        head = p64["audio_head"]
      predicting = states[len(prefix) - 1:]
      expected = -sum(_log_softmax(s @ head)[t] for s, t in zip(predicting, targets))
      assert line["n_tokens"] == len(targets)
      assert abs(line["nll_sum"] - expected) <= 1e-4 * max(1.0, abs(expected)), (line, expected)
