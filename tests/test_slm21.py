"""ZeroSpeech 2021's sLM21 (sWUGGY, sBLIMP) read from its official layout (tests/slm21_fixture.py writes a tiny one)
as zerospeech-benchmarks 0.9.4 reads it, scored T->T and S->S, and submitted to zrc 0.9.4 itself, whose figures
equal s2sjax's."""

from __future__ import annotations

import csv
import json
import os
import shutil

import numpy as np
import pytest

from s2sjax.data import task_registry
from tasks.release import ReleaseError, check_asked, read_questions
from tasks.zerospeech import frequency_band
from tests.slm21_fixture import SENTENCES, VOICES, WORDS, write_release


@pytest.fixture
def release(tmp_path):
  return write_release(str(tmp_path / "sLM21"), speech=False)


def test_frequency_bands_are_zrcs_cut_left_closed():
  """pd.cut(f, [0, 1, 5, 20, 100, inf], right=False, labels=[oov, 1-5, 6-20, 21-100, >100]), by hand."""
  counts = [0, 1, 4, 5, 19, 20, 99, 100, 250000]
  assert [frequency_band(n) for n in counts] == ["oov", "1-5", "1-5", "6-20", "6-20", "21-100", "21-100", ">100",
                                                 ">100"]


def test_swuggy_pairs_by_id_and_voice_with_zrcs_labels(release):
  questions = read_questions("swuggy", release)
  assert len(questions) == len(WORDS) * len(VOICES)
  gold = list(csv.DictReader(open(os.path.join(release, "lexical", "dev", "gold.csv"))))
  by_name = {row["filename"]: row for row in gold}
  for q in questions:
    word, other = (by_name[u] for u in q.uttids)
    assert (word["correct"], other["correct"]) == ("1", "0") and q.correct == 0
    assert (word["id"], word["voice"]) == (other["id"], other["voice"]) == (q.labels["id"], q.labels["voice"])
    assert q.candidates == (word["phones"], other["phones"])  # no non-word is written: phones (lexical.py:40-42)
    assert q.candidate_audio_paths[1].endswith(f"lexical/dev/{other['filename']}.wav")
  bands = [q.labels["frequency_band"] for q in questions]
  assert bands == sorted(bands, key=["oov", "1-5", "6-20", "21-100", ">100"].index)  # zrc's table order
  assert {q.labels["id"]: (q.labels["frequency_band"], q.labels["in_vocabulary"]) for q in questions} == {
    "w1": ("oov", "no"), "w2": ("1-5", "yes"), "w3": ("6-20", "yes"), "tie": ("6-20", "yes"),
    "w4": ("21-100", "yes"), "w5": (">100", "yes"), "w6": (">100", "yes")}


def test_sblimp_pairs_by_position_with_type_and_item(release):
  questions = read_questions("sblimp", release)
  assert [q.candidates for q in questions] == [(good, bad) for _, _, _, good, bad in SENTENCES for _ in VOICES]
  assert [q.labels["type"] for q in questions[::2]] == [kind for kind, *_ in SENTENCES]
  assert questions[4].labels["item"] == "determiner_noun_agreement/determiner_noun_agreement_1/0"


def test_written_items_are_asked_t2t_and_recordings_s2s_whole(release):
  check_asked("swuggy", "t2t", "s2sbench")
  check_asked("sblimp", "s2s", "utterance")
  for modality, protocol in (("s2t", "s2sbench"), ("s2s", "s2sbench")):
    with pytest.raises(ReleaseError, match=r"sblimp holds grammatical against ungrammatical sentences.*"
                                           r"--modality=t2t,s2s --protocol=utterance"):
      check_asked("sblimp", modality, protocol)


def _edit_gold(release: str, folder: str, edit) -> str:
  path = os.path.join(release, folder, "dev", "gold.csv")
  lines = open(path).read().splitlines(keepends=True)
  open(path, "w").write("".join(edit(lines)))
  return path


def test_a_wrong_layout_is_one_line_naming_the_file(release):
  gold = _edit_gold(release, "lexical", lambda lines: [lines[0].replace(",phones,", ",sounds,")] + lines[1:])
  with pytest.raises(ReleaseError, match=rf"^{gold}: no column phones \(an sLM21 gold file has id, filename, "):
    read_questions("swuggy", release)

  dropped = []
  gold = _edit_gold(release, "syntactic", lambda lines: [line for n, line in enumerate(lines)
                                                         if n != 2 or dropped.append(line.split(",")[1])])
  os.remove(os.path.join(release, "syntactic", "dev", f"{dropped[0]}.wav"))
  with pytest.raises(ReleaseError, match=rf"^{gold}:\d+: unpaired recording \w+: 10 grammatical and 9 "):
    read_questions("sblimp", release)


def test_a_recording_outside_the_gold_file_or_unpaired_is_named(release):
  folder = os.path.join(release, "lexical", "dev")
  stray = os.path.join(folder, "zzzzzzzzzzz.wav")
  shutil.copy(os.path.join(folder, next(n for n in os.listdir(folder) if n.endswith(".wav"))), stray)
  with pytest.raises(ReleaseError, match=rf"^{stray} is not in {folder}/gold.csv \(1 such recording"):
    read_questions("swuggy", release)
  os.remove(stray)

  removed = []
  gold = _edit_gold(release, "lexical", lambda lines: lines[:-1] if removed.append(lines[-1].split(",")[1]) is None
                    else lines)  # the last row: the tie's non-word, second voice
  os.remove(os.path.join(folder, f"{removed[0]}.wav"))
  with pytest.raises(ReleaseError, match=rf"^{gold}:\d+: id tie voice Victoria has 1 word\(s\) and 0 non-word\(s\)"):
    read_questions("swuggy", release)


def test_the_submission_scores_each_recording_by_its_log_probability(tmp_path):
  """A recording's score is minus its summed NLL, written in full; each recording once."""
  from s2sjax.data.questions import QuestionScores
  from s2sjax.results import zerospeech

  scores = QuestionScores(("a", "b"), (("r1", "r2"), ("r3", "r4")), (("x", "y"), ("x", "y")), np.array([0, 0]),
                          np.array([[3.25, 4.0], [1 / 3, 1 / 3]]), np.array([[2, 4], [1, 1]]),
                          ({"id": "a"}, {"id": "b"}))
  assert zerospeech.recording_scores(scores, "swuggy") == {"r1": -3.25, "r2": -4.0, "r3": -1 / 3, "r4": -1 / 3}
  twice = QuestionScores(("a",), (("r1", "r1"),), (("x", "y"),), np.array([0]), np.ones((1, 2)),
                         np.ones((1, 2), np.int64), ({"id": "a"},))
  with pytest.raises(zerospeech.SubmissionError, match="recording r1 is scored twice in sblimp's scores"):
    zerospeech.recording_scores(twice, "sblimp")
  assert task_registry.get("sblimp").loss == task_registry.get("swuggy_test").loss == "sum"


def _zrc_figures(judged: dict) -> dict:
  """zrc's figures from its scores CSVs: the overall accuracies (mean over its by_pair rows, submissions/sLM21.py:347,
  386), sWUGGY's in-vocabulary one (the n-weighted mean of the bands but oov, sLM21.py:350-358) and its per-band,
  per-length and sBLIMP's per-type rows."""
  rows = lambda name: judged[f"score_{name}.csv"]
  bands = [r for r in rows("lexical_dev_by_frequency") if r["n"] != "0"]
  in_vocab = [r for r in bands if r["frequency"] != "oov"]
  return {
    "swuggy": float(np.mean([float(r["score"]) for r in rows("lexical_dev_by_pair")])),
    "in_vocabulary": float(np.average([float(r["score"]) for r in in_vocab], weights=[int(r["n"]) for r in in_vocab])),
    "by_frequency_band": {r["frequency"]: (int(r["n"]), float(r["score"])) for r in bands},
    "by_length": {str(int(float(r["length"]))): (int(r["n"]), float(r["score"])) for r in rows("lexical_dev_by_length")},
    "sblimp": float(np.mean([float(r["score"]) for r in rows("syntactic_dev_by_pair")])),
    "by_type": {r["type"]: (int(r["n"]), float(r["score"])) for r in rows("syntactic_dev_by_type")},
  }


@pytest.mark.slow
def test_zrc_accepts_the_submission_and_prints_s2sjaxs_figures(tmp_path, tiny_sample):
  """The fixture spoken by espeak-ng, built T->T (the gold's phones and sentences) and S->S (each recording whole,
  the utterance protocol) for the tiny qwen2 under the demo spec, scored by s2sjax.eval; the submission it writes is
  validated and scored by zrc 0.9.4 (its own venv, offline), and zrc's overall, in-vocabulary, per-band, per-length
  and per-type accuracies are s2sjax's metrics.json's to zrc's 4 printed digits. The tie pair ties in both."""
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.builds import Variants
  from s2sjax.results import zerospeech
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare
  from tests import zrc_judge

  try:
    zrc_judge.python()
  except zrc_judge.Unreachable as e:
    pytest.skip(f"pip cannot reach the package registry to install zerospeech-benchmarks 0.9.4: {e}")
  release = write_release(str(tmp_path / "sLM21"))
  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  for task in ("swuggy", "sblimp"):
    prepare(task, "demo", "t2t", None, data, manual_dir=release, tokenizer_dir=tiny_sample["tokenizer"])
    prepare(task, "demo", "s2s", None, data, manual_dir=release, tokenizer_dir=tiny_sample["tokenizer"],
            variants=Variants(protocol="utterance"))
  run(EvalConfig(tasks=("swuggy", "sblimp"), modalities=("t2t", "s2s"), protocols=("utterance",),
                 checkpoints=tiny_sample["ckpt"], data_dir=data, output_dir=out, chunk_rows=4,
                 scoring=ScoringOptions(batch_size=4)))
  metrics = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]
  tasks = metrics["tasks"]
  assert set(metrics["degradation"]["swuggy"]) == set(metrics["degradation"]["sblimp"]) == {"s2s_utterance_vs_t2t"}
  for task in ("swuggy", "sblimp"):
    for modality in ("t2t", "s2s_utterance"):
      assert tasks[task][modality]["ties"] == (2 if task == "swuggy" else 0)  # the tie pair, in each voice

  submission = str(tmp_path / "submission")
  written = zerospeech.write_submission(out, submission)
  assert sorted(os.path.relpath(p, submission) for p in written) == ["lexical/dev.txt", "meta.yaml",
                                                                    "syntactic/dev.txt"]
  judged = zrc_judge.judge(submission, zrc_judge.app_dir(str(tmp_path / "zrc"), release))
  zrc = _zrc_figures(judged)
  ours = tasks["swuggy"]["s2s_utterance"], tasks["sblimp"]["s2s_utterance"]
  printed = lambda value: round(value, 4)
  assert printed(ours[0]["accuracy"]) == printed(zrc["swuggy"])
  assert printed(ours[0]["by_in_vocabulary"]["yes"]["accuracy"]) == printed(zrc["in_vocabulary"])
  for name, by in (("frequency_band", zrc["by_frequency_band"]), ("length", zrc["by_length"])):
    assert {k: (v["n"], printed(v["accuracy"])) for k, v in ours[0][f"by_{name}"].items()} == by
  assert printed(ours[1]["accuracy"]) == printed(zrc["sblimp"])
  assert {k: (v["n"], printed(v["accuracy"])) for k, v in ours[1]["by_type"].items()} == zrc["by_type"]
  # zrc prints no subtypes: each type's figure is its subtypes' n-weighted mean, over the fixture's subtypes
  type_of = {subtype: kind for kind, subtype, *_ in SENTENCES}
  assert ours[1]["by_subtype"].keys() == type_of.keys()
  for kind, by in ours[1]["by_type"].items():
    parts = [v for subtype, v in ours[1]["by_subtype"].items() if type_of[subtype] == kind]
    assert sum(v["n"] for v in parts) == by["n"]
    assert sum(v["n"] * v["accuracy"] for v in parts) / by["n"] == pytest.approx(by["accuracy"])
  assert ours[0]["by_frequency_band"].keys() == {"oov", "1-5", "6-20", "21-100", ">100"}
  assert "sWUGGY (dev) by frequency_band" in open(os.path.join(out, "table.md")).read()
  assert "sBLIMP (dev) by subtype" in open(os.path.join(out, "table.md")).read()


def test_metrics_average_voices_per_id_then_ids_and_t2t_meets_the_utterance_protocol():
  """By hand, zrc's arithmetic: pair scores 1, 0.5 (a tie), 0; id a's two voices (1, 0) average 0.5, id b's (0.5,
  0.5) 0.5, id c's (1, 1) 1 (by summed NLL: by mean NLL q4 would tie): overall 2/3; bands oov {a}, 1-5 {b, c};
  in-vocabulary (b, c) 0.75. The T->T run
  against the S->S utterance run is the task's degradation pair."""
  from s2sjax.data.metrics import summarize
  from s2sjax.data.modalities import Label
  from s2sjax.data.questions import QuestionScores

  labels = tuple({"id": i, "voice": v, "frequency_band": band, "in_vocabulary": "no" if band == "oov" else "yes",
                  "length": "4"} for i, band in (("a", "oov"), ("b", "1-5"), ("c", "1-5")) for v in VOICES)
  nll = np.array([[1.0, 2.0], [3.0, 2.0], [2.0, 2.0], [5.0, 5.0], [1.0, 4.0], [0.5, 0.75]])
  scores = QuestionScores(tuple(f"q{n}" for n in range(6)), tuple((f"w{n}", f"n{n}") for n in range(6)),
                          (("x", "y"),) * 6, np.zeros(6, np.int64), nll, np.array([[1, 4]] * 6), labels)
  summary = summarize({("swuggy", Label("t2t")): scores, ("swuggy", Label("s2s", "utterance")): scores})
  metrics = summary["swuggy"]["s2s_utterance"]
  assert metrics["accuracy"] == pytest.approx(2 / 3) and metrics["ties"] == 2
  assert metrics["by_frequency_band"] == {"oov": {"n": 1, "accuracy": 0.5, "std": None},
                                          "1-5": {"n": 2, "accuracy": 0.75, "std": pytest.approx(0.5 ** 0.5 / 2)}}
  assert metrics["by_in_vocabulary"]["yes"]["accuracy"] == 0.75
  assert summary["degradation"]["swuggy"]["s2s_utterance_vs_t2t"]["degradation"] == 0.0


@pytest.mark.slow
def test_a_unit_lm_scores_each_sblimp_recording_by_its_log_probability(tmp_path):
  """A TWIST-style unit LM (SlamKit's layout of the mel k-means units, tests/test_spoken_storycloze.unit_lm): each
  recording `<bos> units <eos>` scored whole, its summed NLL the naive transformers forward's within 1e-4, and the
  accuracy zrc's arithmetic on those sums (by position pairs, voices averaged per item)."""
  import soundfile
  import torch

  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.builds import Variants
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.audio.mel_kmeans import MelKmeansTokenizer
  from tasks.preparation import prepare
  from tasks.sample import MEL_KMEANS_CODEBOOK
  from tests.test_spoken_storycloze import unit_lm

  release = write_release(str(tmp_path / "sLM21"), words=(), sentences=SENTENCES[:3])
  spec, model, ckpt = unit_lm(tmp_path)
  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  prepare("sblimp", str(spec), "s2s", 1024, data, manual_dir=release, variants=Variants(protocol="utterance"))
  run(EvalConfig(tasks=("sblimp",), modalities=("s2s",), protocols=("utterance",), checkpoints=ckpt, spec=str(spec),
                 data_dir=data, output_dir=out, row_length=1024, chunk_rows=2, scoring=ScoringOptions(batch_size=2)))
  lines = {(line["question"], line["candidate"]): line
           for line in map(json.loads, open(os.path.join(out, "unit_lm", "sblimp-s2s_utterance.scores.jsonl")))}
  tokenizer = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  questions = read_questions("sblimp", release)
  naive = np.zeros((len(questions), 2))
  for q, question in enumerate(questions):
    for c, path in enumerate(question.candidate_audio_paths):
      ids = [1] + (2 + tokenizer.encode(soundfile.read(path, dtype="float32")[0], "x")[:, 0]).tolist() + [1]
      with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
      naive[q, c] = -float(sum(log_probs[j, ids[j + 1]] for j in range(len(ids) - 1)))
      assert abs(lines[(question.id, c)]["nll_sum"] - naive[q, c]) < 1e-4 * len(ids)
  pair = (naive[:, 0] < naive[:, 1]) + 0.5 * (naive[:, 0] == naive[:, 1])
  by_item: dict[str, list[float]] = {}
  for question, value in zip(questions, pair):
    by_item.setdefault(question.labels["item"], []).append(value)
  accuracy = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]["sblimp"]["s2s_utterance"]
  assert accuracy["accuracy"] == pytest.approx(np.mean([np.mean(v) for v in by_item.values()]))


def test_the_submission_names_what_an_output_directory_lacks(tmp_path):
  from s2sjax.results import zerospeech

  (tmp_path / "out" / "ckpt").mkdir(parents=True)
  (tmp_path / "out" / "ckpt" / "run.json").write_text("{}")
  with pytest.raises(zerospeech.SubmissionError, match=r"ckpt/swuggy-s2s_utterance\.scores\.jsonl does not exist: "
                                                       r"score swuggy into this output directory first"):
    zerospeech.write_submission(str(tmp_path / "out"), str(tmp_path / "submission"))
  with pytest.raises(zerospeech.SubmissionError, match=r"holds no run 'other' \(runs: ckpt\)"):
    zerospeech.write_submission(str(tmp_path / "out"), str(tmp_path / "submission"), checkpoint="other")


@pytest.mark.slow
def test_the_default_model_scores_each_sblimp_sentence_alone_as_transformers(tmp_path, smollm2_transformers):
  """T->T with the embedded default model (SmolLM2-135M-Instruct): each sentence scored after the tokenizer's bos
  (lm-eval's HFLM.prefix_token_id for an empty context), its summed NLL transformers' within 1e-4 per token."""
  import torch

  from s2sjax.commands.default_checkpoint import default_checkpoint
  from s2sjax.commands.eval import EvalConfig, run
  from tasks.preparation import prepare

  model, tokenizer = smollm2_transformers
  ckpt = default_checkpoint()
  release = write_release(str(tmp_path / "sLM21"), speech=False, words=(), sentences=SENTENCES[:2])
  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  prepare("sblimp", "demo", "t2t", None, data, manual_dir=release, tokenizer_dir=os.path.join(ckpt, "tokenizer"))
  run(EvalConfig(tasks=("sblimp",), modalities=("t2t",), checkpoints=ckpt, data_dir=data, output_dir=out,
                 chunk_rows=2))
  (folder,) = [p for p in os.listdir(out) if os.path.exists(os.path.join(out, p, "run.json"))]
  lines = list(map(json.loads, open(os.path.join(out, folder, "sblimp-t2t.scores.jsonl"))))
  assert len(lines) == 2 * len(VOICES) * 2
  for line in lines:
    ids = [tokenizer.bos_token_id] + tokenizer(line["text"], add_special_tokens=False).input_ids
    with torch.no_grad():
      log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    expected = -float(sum(log_probs[j, ids[j + 1]] for j in range(len(ids) - 1)))
    assert line["n_tokens"] == len(ids) - 1 and abs(line["nll_sum"] - expected) < 1e-4 * len(ids)
