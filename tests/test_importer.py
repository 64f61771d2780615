"""The replica importer on the real public files (skipped when ../shared/realdata is absent)."""

import csv
import json
import os

import pytest

from tasks.audio.base import load_audio
from tasks.importer import import_all, read_stories, rewrite_question
from tasks.release import read_questions

REALDATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "realdata")
STORYCLOZE = os.path.join(REALDATA, "storycloze", "cloze_test_test__spring2016 - cloze_test_ALL_test.csv")
XSTORYCLOZE = [os.path.join(REALDATA, "xstorycloze", f"spring2016.val.zh.tsv.split_20_80_{s}.tsv") for s in ("train", "eval")]
CMMLU = os.path.join(REALDATA, "cmmlu", "data", "test")
needs_realdata = pytest.mark.skipif(not os.path.exists(STORYCLOZE), reason="../shared/realdata is absent")


def test_rewrite_rules_by_hand():
  assert rewrite_question("水在标准大气压下（）沸腾。", ["一百度", "十度", "零度", "五度"]) == (
    "水在标准大气压下", ["一百度沸腾。", "十度沸腾。", "零度沸腾。", "五度沸腾。"])
  assert rewrite_question("中国的首都是", ["北京", "上海", "广州", "南京"]) == ("中国的首都是", ["北京", "上海", "广州", "南京"])
  assert rewrite_question("（）是中国的首都", list("ABCD")) == "the blank opens the question (no first half)"
  assert rewrite_question("甲（）乙（）", list("ABCD")) == "2 blanks"
  assert rewrite_question("下列说法正确的是", list("ABCD")) == "refers to the options (下列/以下/哪)"
  assert rewrite_question("这是什么？", list("ABCD")) == "a question with no blank (ends in ？)"
  assert rewrite_question("x是", ["1", "1", "2", "3"]) == "repeated options"


@needs_realdata
def test_full_replica_counts_and_mapping(tmp_path):
  report = import_all(str(tmp_path), STORYCLOZE, XSTORYCLOZE, CMMLU, speech=False)
  assert report["sstorycloze"]["pairs"] == 1871 and report["zh_sstorycloze"]["pairs"] == 1871
  cmmlu = report["scmmlu"]
  assert cmmlu["questions_kept"] + cmmlu["questions_left_out"] == 11582
  assert sum(cmmlu["left_out_reasons"].values()) == cmmlu["questions_left_out"] > 0
  assert len(open(tmp_path / "cmmlu" / "left_out.jsonl").readlines()) == cmmlu["questions_left_out"]
  questions = read_questions("sstorycloze", str(tmp_path))  # the release reader accepts the replica
  assert len(questions) == 1871 and len(read_questions("scmmlu", str(tmp_path))) == cmmlu["questions_kept"]
  with open(STORYCLOZE, encoding="utf-8", newline="") as f:
    rows = list(csv.DictReader(f))
  for k in (0, 1, 2, 500, 1870):  # the right ending follows AnswerRightEnding, on rows of the real file
    row = rows[k]
    right = row[f"RandomFifthSentenceQuiz{row['AnswerRightEnding']}"]
    wrong = row[f"RandomFifthSentenceQuiz{3 - int(row['AnswerRightEnding'])}"]
    assert questions[k].candidates == (right.strip(), wrong.strip()) and questions[k].correct == 0
    assert questions[k].prefixes[0] == " ".join(row[f"InputSentence{i}"].strip() for i in range(1, 5))
  zh = read_stories(XSTORYCLOZE[0], "\t")
  assert zh[0]["right"] and all("\t" not in s for s in zh[0]["sentences"])


@needs_realdata
def test_replica_speech_is_readable_and_plausibly_long(tmp_path):
  report = import_all(str(tmp_path), STORYCLOZE, XSTORYCLOZE, None, speech=True, workers=2, limit=3)
  for task, language in (("sstorycloze", "en"), ("zh_sstorycloze", "zh")):
    assert report[task]["wavs"] == 6 and report[task]["distinct_utterances"] == 3  # 2k and 2k+1 share audio
    per_char = report[task]["seconds_per_character"]
    low, high = (0.03, 0.15) if language == "en" else (0.1, 0.6)
    assert low < per_char["min"] <= per_char["max"] < high, per_char
  for question in read_questions("sstorycloze", str(tmp_path)):
    for path in question.audio_paths:
      assert len(load_audio(path, 16000)) > 16000
  print(json.dumps(report, ensure_ascii=False))
