"""The replica importer on the real public files (skipped when ../shared/realdata is absent)."""

import csv
import json
import os
import shutil

import pytest

from s2sjax.data import task_registry
from tasks.audio.base import load_audio
from tasks.importer import import_all, read_stories, rewrite_question, write_task
from tasks.release import read_questions

pytestmark = pytest.mark.slow  # speech synthesis and the real public files

REALDATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "realdata")
STORYCLOZE = os.path.join(REALDATA, "storycloze", "cloze_test_test__spring2016 - cloze_test_ALL_test.csv")
XSTORYCLOZE = [os.path.join(REALDATA, "xstorycloze", f"spring2016.val.zh.tsv.split_20_80_{s}.tsv") for s in ("train", "eval")]
CMMLU = os.path.join(REALDATA, "cmmlu", "data", "test")
needs_realdata = pytest.mark.skipif(not os.path.exists(STORYCLOZE), reason="../shared/realdata is absent")
needs_espeak = pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("sox")),
                                  reason="espeak-ng or sox is not installed")


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
@needs_espeak
def test_replica_speech_is_readable_and_plausibly_long(tmp_path):
  report = import_all(str(tmp_path), STORYCLOZE, XSTORYCLOZE, None, speech=True, workers=2, limit=3)
  for task, language in (("sstorycloze", "en"), ("zh_sstorycloze", "zh")):
    assert report[task]["wavs"] == 6 and report[task]["candidate_wavs"] == 6
    assert report[task]["distinct_utterances"] == 9  # 2k and 2k+1 share their prefix's audio, not their ending's
    per_char = report[task]["seconds_per_character"]
    low, high = (0.03, 0.15) if language == "en" else (0.1, 0.6)
    assert low < per_char["min"] <= per_char["max"] < high, per_char
  for question in read_questions("sstorycloze", str(tmp_path)):
    for path in question.audio_paths:
      assert len(load_audio(path, 16000)) > 16000
    for path in question.candidate_audio_paths:
      assert len(load_audio(path, 16000)) > 8000
  print(json.dumps(report, ensure_ascii=False))


def _write_csv(path, header, rows):
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)


def _sources(root, first_story, first_question):
  """A two-story StoryCloze CSV and a three-question CMMLU subject whose first entries are given."""
  stories = str(root / "stories.csv")
  _write_csv(stories, ["InputStoryid", *(f"InputSentence{i}" for i in range(1, 5)), "RandomFifthSentenceQuiz1",
                       "RandomFifthSentenceQuiz2", "AnswerRightEnding"],
             [["a", *first_story, "He smiled.", "He flew.", "1"], ["b", "Ann sang.", "It rained.", "She ran.",
                                                                   "She hid.", "She got wet.", "She was dry.", "1"]])
  cmmlu = root / "cmmlu"
  cmmlu.mkdir(exist_ok=True)
  _write_csv(str(cmmlu / "water.csv"), ["", "Question", "A", "B", "C", "D", "Answer"],
             [["0", first_question, "一百度", "十度", "零度", "五度", "A"],
              ["1", "冰在（）融化", "零度", "十度", "五十度", "一百度", "A"],
              ["2", "人有（）只眼睛", "两", "三", "四", "五", "A"]])
  return stories, str(cmmlu)


def _same_audio(path, text, language, tmp_path):
  from tasks.speech import speak

  reference = str(tmp_path / "reference.wav")
  speak(text, language, reference)  # espeak-ng and sox -D are deterministic: same text, same bytes
  return open(path, "rb").read() == open(reference, "rb").read()


@needs_espeak
def test_reimporting_changed_texts_never_keeps_old_audio(tmp_path):
  """Re-import into the same directory after a story's text changed and a CMMLU question dropped out (renumbering
  the rest): every wav speaks its own line's text, and only the changed text is synthesized again."""
  out = str(tmp_path / "replica")
  first = ["Tom woke up.", "He was hungry.", "He cooked eggs.", "He ate them."]
  stories, cmmlu = _sources(tmp_path, first, "水在标准大气压下（）沸腾")
  report = import_all(out, stories, [], cmmlu, speech=True, workers=1)
  # 2 prefixes + 4 endings; tStoryCloze's texts are all sStoryCloze's; 3 prefixes + 12 distinct options
  assert report["sstorycloze"]["synthesized"] == 6 and report["scmmlu"]["synthesized"] == 15
  assert report["tstorycloze"]["synthesized"] == 0 and report["tstorycloze"]["candidate_wavs"] == 4
  changed = ["Tom woke up late.", *first[1:]]
  stories, cmmlu = _sources(tmp_path, changed, "下列哪个温度是水的沸点")  # question 0 is now left out
  report = import_all(out, stories, [], cmmlu, speech=True, workers=1)
  assert report["sstorycloze"]["synthesized"] == 1 and report["scmmlu"]["synthesized"] == 0
  assert report["scmmlu"]["questions_kept"] == 2 and report["scmmlu"]["stale_wavs_removed"] == 1
  assert report["scmmlu"]["stale_candidate_wavs_removed"] == 4  # question 2's options, renumbered away
  for task in ("sstorycloze", "tstorycloze", "scmmlu"):
    for question in read_questions(task, out):
      for path, text in zip(question.audio_paths + question.candidate_audio_paths,
                            question.prefixes + question.candidates):
        assert _same_audio(path, text, task_registry.get(task).language, tmp_path), (path, text)
  topical = read_questions("tstorycloze", out)  # the wrong ending is the other story's right one
  assert [q.candidates for q in topical] == [("He smiled.", "She got wet."), ("She got wet.", "He smiled.")]
  story = read_questions("sstorycloze", out)[0]
  assert story.prefixes[0] == " ".join(changed)
  assert sorted(os.listdir(os.path.join(out, task_registry.get("scmmlu").release_audio_dir))) == ["0.wav", "1.wav"]
  stories, _ = _sources(tmp_path, first, "水在标准大气压下（）沸腾")  # without speech: relinked from the cache
  assert import_all(out, stories, [], None, speech=False)["sstorycloze"]["wavs"] == 4
  assert _same_audio(read_questions("sstorycloze", out)[0].audio_paths[0], " ".join(first), "en", tmp_path)


def test_reimporting_a_replica_made_without_a_speech_cache_keeps_its_matching_audio(tmp_path):
  # an earlier importer wrote <uttid>.wav files and no cache: their texts are in the old jsonl
  record = task_registry.get("sstorycloze")
  audio_dir = tmp_path / record.release_audio_dir
  audio_dir.mkdir(parents=True)
  old = [{"uttid": 0, "first": "A story.", "last": "Good end."}, {"uttid": 1, "first": "A story.", "last": "Bad."},
         {"uttid": 2, "first": "Another.", "last": "End."}, {"uttid": 3, "first": "Another.", "last": "No."}]
  (tmp_path / record.release_jsonl).write_text("".join(json.dumps(line) + "\n" for line in old))
  for uttid in range(4):
    (audio_dir / f"{uttid}.wav").write_bytes(b"speech of story %d" % (uttid // 2))
  new = old[:2] + [dict(old[2], first="Changed."), dict(old[3], first="Changed.")]
  report = write_task(str(tmp_path), "sstorycloze", new, speech=False, workers=1)
  assert report["wavs"] == 2  # story 1's text changed: its audio no longer stands for any line
  assert [(audio_dir / f"{u}.wav").read_bytes() for u in (0, 1)] == [b"speech of story 0"] * 2
  assert not (audio_dir / "2.wav").exists() and not (audio_dir / "3.wav").exists()


def test_a_missing_or_headerless_story_file_is_named(tmp_path):
  from s2sjax.runtime.errors import MissingFileError
  from tasks.importer import SourceFileError

  with pytest.raises(MissingFileError, match=r"nothing\.csv does not exist"):
    read_stories(str(tmp_path / "nothing.csv"), ",")
  (tmp_path / "short.csv").write_text("InputStoryid,InputSentence1\n1,a\n")
  with pytest.raises(SourceFileError, match=r"short\.csv: its header has no InputSentence2, .*AnswerRightEnding"):
    read_stories(str(tmp_path / "short.csv"), ",")


@pytest.mark.parametrize("text", ["-26.8", "--path=/tmp", "-v en"])
def test_a_text_that_reads_like_an_option_is_spoken_not_parsed(tmp_path, text):
  """CMMLU options such as "-26.8" once reached espeak-ng as its arguments: it wrote no audio and exited 0."""
  import soundfile

  from tasks.speech import speak

  path = str(tmp_path / "clip.wav")
  speak(text, "zh", path)
  info = soundfile.info(path)
  assert info.samplerate == 16000 and info.duration > 0.3
