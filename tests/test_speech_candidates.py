"""Spoken candidates (T->S, S->S) and unit LMs, against a naive PyTorch forward of each prefix + candidate.

The sequences the reference scores are written out here from the templates of s2sjax/data/spec.py, not taken from the
builder, so a template that drifts fails. SlamKit's rules (slp-rl/slamkit, read, not copied):
  * slamkit/tokeniser/unit_tokeniser.py, UnitTokeniser.__init__ (lines 20-46): pad 0, bos = eos = 1, unit k is
    id k + 2 (`offset = max(eos, bos, pad) + 1`), a vocabulary of 502 for 500 units, every utterance
    `<S> $0 <S>` (bos first, eos last); lines 56-60: runs of one unit collapsed (itertools.groupby).
  * slamkit/model/unit_lm.py, UnitLM.log_likelihood (lines 185-194): logits of the whole utterance, targets
    shifted by one, only pad masked, so bos is never a target and the closing eos is; calc_nll(len_norm=mean_nll)
    with mean_nll: true by default (config/metric/default.yaml): the mean over those targets.
  * slamkit/metric/modelling_metric.py (lines 26-30, 91-94): each candidate is one whole recording, story and
    ending together; right when the right one's likelihood is higher.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil

import numpy as np
import pytest
import torch
import yaml

from checkpoints_conversion.convert import convert
from s2sjax.data import task_registry
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.evaluator import EvalError, Evaluator, ScoringOptions
from s2sjax.data.spec import SpecError, load_spec, resolve_audio_ids
from s2sjax.data.builds import Variants
from s2sjax.data.task_data import load_task_data
from tasks.audio.base import AudioError, dedup
from tasks.preparation import prepare
from tasks.release import read_questions
from tasks.sample import RELEASE_DIR
from tests.hf_models import save_hf, tiny_model

UNITS = 11  # past the Qwen2.5 tokenizer's 151,669 tokens: ids 151669..151679 of the tiny 151,680-row model
QWEN_TOKENS = 151_669


def _release(root: str) -> str:
  """Three stories and two sCMMLU questions in the release layout, spoken prefixes and candidates included."""
  stories = [{"uttid": k, "first": f"Story {k // 2} begins.", "last": ["It ends well.", "Fish sing."][k % 2]}
             for k in range(6)]
  cmmlu = [{"uttid": k, "first": "水的沸点是", "A": "一百度。", "B": "十度。", "C": "零度。", "D": "五度。",
            "answer": "A"} for k in range(2)]
  wav = os.path.join(RELEASE_DIR, task_registry.get("sstorycloze").release_audio_dir, "0.wav")
  for task, lines in (("sstorycloze", stories), ("scmmlu", cmmlu)):
    record = task_registry.get(task)
    for folder in (record.release_audio_dir, record.release_candidate_audio_dir):
      os.makedirs(os.path.join(root, folder), exist_ok=True)
    with open(os.path.join(root, record.release_jsonl), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    for line in lines:
      shutil.copy(wav, os.path.join(root, record.release_audio_dir, f"{line['uttid']}.wav"))
      names = [str(line["uttid"])] if task == "sstorycloze" else [f"{line['uttid']}_{o}" for o in "ABCD"]
      for name in names:
        shutil.copy(wav, os.path.join(root, record.release_candidate_audio_dir, f"{name}.wav"))
  return root


def _codes(directory: str, root: str, units: int, seed: int = 0) -> str:
  """Precomputed codes for every prefix (`<uttid>.npy`) and candidate (`candidates/<name>.npy`), random lengths;
  the two lines of a story share their prefix's codes, as they share its recording."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(directory, "candidates"))
  for task in ("sstorycloze", "scmmlu"):
    for question in read_questions(task, root):
      prefix = rng.integers(0, units, (int(rng.integers(20, 60)), 1))
      for c, uttid in enumerate(question.uttids):
        np.save(os.path.join(directory, f"{uttid}.npy"), prefix)
        name = os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]
        np.save(os.path.join(directory, "candidates", f"{name}.npy"), rng.integers(0, units, (int(rng.integers(5, 30)), 1)))
  return directory


def _spec(path: str, **fields) -> str:
  with open(path, "w") as f:
    yaml.safe_dump({"audio_mode": "extended_vocab", "audio_tokenizer": {"type": "precomputed"}, **fields}, f)
  return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory, qwen_tokenizer_dir, tiny_sample):
  root = tmp_path_factory.mktemp("speech_candidates")
  release = _release(str(root / "release"))
  unit_lm = tiny_model("qwen2", vocab_size=502)
  convert(save_hf(unit_lm, str(root / "unit_lm_hf")), str(root / "unit_lm"))
  return {
    "root": root, "release": release, "qwen": qwen_tokenizer_dir,
    "interleaved": (tiny_sample["ckpt"], tiny_sample["hf"]),  # 151,680 rows: text + 15 units
    "unit_lm": (str(root / "unit_lm"), unit_lm),
    "interleaved_spec": _spec(str(root / "interleaved.yaml"), name="units_past_text", codebook_sizes=[UNITS],
                              unit_offset=QWEN_TOKENS, start_token="<|vision_start|>", end_token="<|vision_end|>"),
    "unit_lm_spec": _spec(str(root / "unit_lm.yaml"), name="unit_lm", codebook_sizes=[500], unit_offset=2,
                       text_vocabulary=False, bos_id=1),
    "interleaved_codes": _codes(str(root / "codes_interleaved"), release, UNITS),
    "unit_lm_codes": _codes(str(root / "codes_unit_lm"), release, 500, seed=1),
  }


def _score(setup, kind, task, modality, variants=Variants()):
  ckpt = setup[kind][0]
  data_dir = str(setup["root"] / "data")
  spec, codes = setup[f"{kind}_spec"], setup[f"{kind}_codes"]
  prepare(task, spec, modality, 1024, data_dir, manual_dir=setup["release"], variants=variants,
          tokenizer_dir=setup["qwen"] if kind == "interleaved" else None, audio_tokenizer_dir=codes)
  td = load_task_data(data_dir, task, modality, spec, 1024, variants)
  config, params = checkpoint.load_config(ckpt), checkpoint.load_params(ckpt)
  return td, Evaluator(config, [td], ScoringOptions(batch_size=2)).score(params, td)


def _expected_sequences(setup, kind, task, modality, protocol="s2sbench"):
  """Per question and candidate: (the ids before the scored ones, the scored ids), by s2sjax/data/spec.py's templates."""
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(setup["qwen"])
  codes_dir = setup[f"{kind}_codes"]
  load = lambda name: np.load(os.path.join(codes_dir, f"{name}.npy"))[:, 0]
  offset, (bos, eos) = (QWEN_TOKENS, tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])) \
    if kind == "interleaved" else (2, (1, 1))
  instruction = "Below is a segment of alternating speech and text content: "
  if task == "scmmlu":
    instruction = "下面是一段语音和文本交错的内容："
  text = lambda s: tokenizer(s)["input_ids"]
  out = []
  for question in read_questions(task, setup["release"]):
    pairs = []
    for c, uttid in enumerate(question.uttids):
      spoken = "candidates/" + os.path.splitext(os.path.basename(question.candidate_audio_paths[c]))[0]
      first, ending = offset + load(uttid), offset + load(spoken)
      opening = [bos] if kind == "unit_lm" else text(instruction) + [bos]
      if protocol == "utterance":
        pairs.append(([bos], list(first) + list(ending) + [eos]))
      elif modality == "t2s":
        pairs.append((text(instruction + question.prefixes[c]) + [bos], list(ending)))
      else:
        pairs.append((opening + list(first), list(ending)))
    out.append(pairs)
  return out


def _naive_nll(model, prefix, scored):
  ids = torch.tensor([prefix + scored])
  with torch.no_grad():
    log_probs = torch.log_softmax(model(ids).logits[0].float(), -1)
  return -sum(float(log_probs[len(prefix) - 1 + j, t]) for j, t in enumerate(scored))


@pytest.mark.slow
@pytest.mark.parametrize("kind, task, modality, protocol", [
  ("interleaved", "sstorycloze", "t2s", "s2sbench"),
  ("interleaved", "scmmlu", "s2s", "s2sbench"),
  ("unit_lm", "sstorycloze", "s2s", "s2sbench"),
  ("unit_lm", "scmmlu", "s2s", "utterance"),
])
def test_spoken_candidates_match_a_naive_forward_and_sharing_changes_nothing(setup, kind, task, modality, protocol):
  if kind == "interleaved":
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(setup["interleaved"][1], dtype=torch.float32).eval()
  else:
    model = setup["unit_lm"][1]
  td, scores = _score(setup, kind, task, modality, Variants(protocol=protocol))
  expected = _expected_sequences(setup, kind, task, modality, protocol)
  assert len(scores) == len(expected)
  for q, pairs in enumerate(expected):
    for c, (prefix, scored) in enumerate(pairs):
      assert scores.n_tokens[q, c] == len(scored)
      reference = _naive_nll(model, prefix, scored)
      assert abs(scores.nll_sum[q, c] - reference) / len(scored) <= 1e-4, (q, c)
  _, unshared = _score(setup, kind, task, modality, Variants(share_prefix=False, protocol=protocol))
  np.testing.assert_allclose(unshared.loss, scores.loss, atol=1e-5)


def test_slamkit_unit_rule_and_the_twist_spec():
  """pad 0, bos = eos = 1, unit k at 2 + k, 502 ids for 500 units, runs collapsed (itertools.groupby)."""
  twist = load_spec("twist")
  assert (twist.unit_offset, twist.bos_id, twist.codebook_sizes, twist.text_vocabulary) == (2, 1, (500,), False)
  assert twist.audio_tokenizer["dedup"] is True
  ids = resolve_audio_ids(twist, None).unit_ids
  assert ids == list(range(2, 502)) and 0 not in ids and 1 not in ids
  units = np.array([5, 5, 5, 7, 5, 5, 0, 0, 499, 499])
  assert dedup(units[:, None])[:, 0].tolist() == [k for k, _ in itertools.groupby(units.tolist())]


@pytest.mark.slow
def test_unit_lm_rows_follow_slamkit_and_ids_past_the_vocabulary_are_refused(setup):
  td, _ = _score(setup, "unit_lm", "sstorycloze", "s2s")
  tokens = td.rows["tokens"][td.rows["segment_ids"] > 0]
  assert tokens.min() >= 1 and tokens.max() < 502  # no pad inside an item; units within 2..501
  starts = np.flatnonzero(np.diff(np.concatenate([[0], td.rows["segment_ids"][0]])) != 0)
  assert all(td.rows["tokens"][0][s] == 1 for s in starts if td.rows["segment_ids"][0][s] > 0)  # bos opens each
  # a spec whose units run past the model's 502 rows: refused when scored, naming the id
  wide = _spec(str(setup["root"] / "wide.yaml"), name="wide", codebook_sizes=[600], unit_offset=2,
               text_vocabulary=False, bos_id=1)
  codes = str(setup["root"] / "codes_wide")
  shutil.copytree(setup["unit_lm_codes"], codes)
  np.save(os.path.join(codes, "candidates", "0.npy"), np.array([[599]]))
  data_dir = str(setup["root"] / "data_wide")
  prepare("sstorycloze", wide, "s2s", 1024, data_dir, manual_dir=setup["release"], audio_tokenizer_dir=codes)
  wide_data = load_task_data(data_dir, "sstorycloze", "s2s", wide, 1024)
  ckpt = setup["unit_lm"][0]
  with pytest.raises(ValueError, match=r"= 601 is outside the embedding table \(502 rows\)"):
    Evaluator(checkpoint.load_config(ckpt), [wide_data]).score(checkpoint.load_params(ckpt), wide_data)


def test_what_a_spec_cannot_be_asked_is_refused_by_name(setup):
  data_dir = str(setup["root"] / "refused")
  with pytest.raises(SpecError, match=r"spec unit_lm is a unit LM without a text vocabulary: only s2s .* not s2t"):
    prepare("sstorycloze", setup["unit_lm_spec"], "s2t", 1024, data_dir, manual_dir=setup["release"],
            audio_tokenizer_dir=setup["unit_lm_codes"])
  with pytest.raises(SpecError, match=r"spec demo_tables feeds audio as codebook tables .* audio head .* cannot be "
                                      r"scored for it"):
    prepare("sstorycloze", "demo_tables", "t2s", 1024, data_dir, manual_dir=setup["release"],
            tokenizer_dir=setup["qwen"])
  with pytest.raises(SpecError, match=r"spec qwen2.5 is text-only: it has no audio units for s2s"):
    prepare("sstorycloze", "qwen2.5", "s2s", 1024, data_dir, manual_dir=setup["release"], tokenizer_dir=setup["qwen"])
  with pytest.raises(ValueError, match=r"the utterance protocol .* is S→S only, not t2s"):
    prepare("sstorycloze", setup["interleaved_spec"], "t2s", 1024, data_dir, manual_dir=setup["release"],
            variants=Variants(protocol="utterance"), tokenizer_dir=setup["qwen"],
            audio_tokenizer_dir=setup["interleaved_codes"])


def test_missing_or_unreadable_spoken_candidates_name_the_file(setup, tmp_path):
  release = _release(str(tmp_path / "release"))
  record = task_registry.get("sstorycloze")
  os.remove(os.path.join(release, record.release_candidate_audio_dir, "3.wav"))
  build = lambda task, **kw: prepare(task, "demo", "s2s", 1024, str(tmp_path / "data"), manual_dir=release,
                                     tokenizer_dir=setup["qwen"], **kw)
  with pytest.raises(AudioError, match=r"s-story-lastspeech/3.wav does not exist"):
    build("sstorycloze")
  skipped = build("sstorycloze", skip_bad=True).report
  assert skipped["questions"] == 2 and skipped["skipped_questions"][0]["where"] == "question 2"
  options = os.path.join(release, task_registry.get("scmmlu").release_candidate_audio_dir)
  with open(os.path.join(options, "1_C.wav"), "wb") as f:
    f.write(b"RIFF not really a wav")
  with pytest.raises(AudioError, match=r"cmmlu_rewrite_options/1_C.wav cannot be read"):
    build("scmmlu")


def test_a_spoken_candidate_too_long_for_the_row_names_its_question(setup, tmp_path):
  codes = str(tmp_path / "codes")
  shutil.copytree(setup["unit_lm_codes"], codes)
  np.save(os.path.join(codes, "candidates", "2.npy"), np.zeros((300, 1), np.int64))
  build = lambda **kw: prepare("sstorycloze", setup["unit_lm_spec"], "s2s", 256, str(tmp_path / "data"),
                               manual_dir=setup["release"], audio_tokenizer_dir=codes, **kw)
  with pytest.raises(ValueError, match=r"question 2: a candidate of 300 tokens exceeds a row.s 256 targets"):
    build()
  assert build(skip_bad=True).report["skipped_questions"][0]["where"] == "question 2"


@pytest.mark.slow
def test_spoken_candidates_of_codebook_table_data_are_refused_when_scored(setup):
  """Data built by hand (or an older version) that asks a codebook-table spec for spoken candidates."""
  td, _ = _score(setup, "interleaved", "sstorycloze", "t2s")
  td.metadata = dataclasses.replace(td.metadata, spec=dataclasses.replace(load_spec("demo_tables"), codebook_sizes=(256,)))
  ckpt = setup["interleaved"][0]
  with pytest.raises(EvalError, match=r"sstorycloze/t2s: spec demo_tables feeds audio as codebook tables"):
    Evaluator(checkpoint.load_config(ckpt), [td])
