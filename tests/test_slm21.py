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
from tasks import tfds_builder  # noqa: F401 (the build registers the sLM21 readers)
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
