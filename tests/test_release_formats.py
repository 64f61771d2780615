"""How a release is laid out is one registered release format (s2sjax.data.task_registry.RELEASE_FORMATS): every path a
release names resolves inside it or is refused naming the line (tasks.release.ReleasePaths.inside), a text of
nothing but invisible characters is empty, and a plugin's own layout (tests/plugins/toy_zerospeech.py: a ZeroSpeech
gold file pairing randomly named recordings) builds and scores through tasks.prepare and s2sjax.eval with no
project file naming it."""

import csv
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from s2sjax.data import task_registry
from s2sjax.runtime import plugins
from tasks.release import Problems, ReleaseError, read_questions
from tasks.sample import RELEASE_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]
STORIES = os.path.join(RELEASE_DIR, "StoryCloze")


def _run(module: str, *args: str, plugin: str = "") -> subprocess.CompletedProcess:
  env = {**os.environ, plugins.ENV: plugin}
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=900)


def _story_release(root: pathlib.Path, lines: list[dict]) -> pathlib.Path:
  """A release of sStoryCloze's layout holding these lines, each line's recordings the sample's first story's."""
  record = task_registry.get("sstorycloze")
  for folder in (record.release_audio_dir, record.release_candidate_audio_dir):
    (root / folder).mkdir(parents=True, exist_ok=True)
  with open(root / record.release_jsonl, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
  for line in lines:
    for folder, source in ((record.release_audio_dir, "s-story-firstspeech"),
                           (record.release_candidate_audio_dir, "s-story-lastspeech")):
      target = root / folder / f"{line['uttid']}.wav"
      if target.parent.is_dir() and target.resolve().is_relative_to(root.resolve()):
        shutil.copy(os.path.join(STORIES, source, "0.wav"), target)
  return root


def _stories(*uttids) -> list[dict]:
  return [{"uttid": u, "first": "Tom went out.", "last": "He came back." if n % 2 == 0 else "Fish sang."}
          for n, u in enumerate(uttids)]


def test_a_line_whose_uttid_climbs_out_of_the_release_is_refused_naming_it(tmp_path, qwen_tokenizer_dir):
  """uttid `0_/../../../../outside/a` with an empty folder `0_` in the audio folder: its recording would be read
  from outside the release. tasks.prepare refuses it, naming the line, and builds nothing."""
  root = _story_release(tmp_path / "release", _stories("0_/../../../../outside/a", "1_x", "2_x", "3_x"))
  audio = root / task_registry.get("sstorycloze").release_audio_dir
  (audio / "0_").mkdir()
  (tmp_path / "outside").mkdir()
  shutil.copy(os.path.join(STORIES, "s-story-firstspeech", "0.wav"), tmp_path / "outside" / "a.wav")
  done = _run("tasks.prepare", "--task=sstorycloze", "--modality=s2t", f"--manual_dir={root}",
              f"--tokenizer_dir={qwen_tokenizer_dir}", f"--data_dir={tmp_path / 'data'}")
  assert done.returncode == 1, done.stdout + done.stderr
  assert "sStory_s2t.jsonl:1 uttid 0_/../../../../outside/a:" in done.stderr
  assert "outside the release" in done.stderr and not list((tmp_path / "data").glob("*/*/*/dataset_info.json"))
  problems = Problems()  # with --skip_bad the story is left out, and the rest read
  assert [q.id for q in read_questions("sstorycloze", str(root), problems=problems)] == ["2_x"]
  assert problems.questions == {"story 0"}


def test_a_symlink_out_of_the_release_is_refused_wherever_it_is(tmp_path):
  outside = tmp_path / "elsewhere"
  outside.mkdir()
  shutil.copy(os.path.join(STORIES, "s-story-lastspeech", "0.wav"), outside / "secret.wav")
  root = _story_release(tmp_path / "release", _stories("0_x", "1_x"))
  ending = root / task_registry.get("sstorycloze").release_candidate_audio_dir / "1_x.wav"
  ending.unlink()
  ending.symlink_to(outside / "secret.wav")
  with pytest.raises(ReleaseError, match=r"sStory_s2t.jsonl:1 uttid 0_x: .*1_x.wav resolves to .*secret.wav, "
                                         r"outside the release"):
    read_questions("sstorycloze", str(root))
  inside = root / "StoryCloze" / "kept.wav"  # a link that stays inside is a path like any other
  shutil.copy(os.path.join(STORIES, "s-story-lastspeech", "0.wav"), inside)
  ending.unlink()
  ending.symlink_to(inside)
  assert [q.id for q in read_questions("sstorycloze", str(root))] == ["0_x"]
  # a whole folder that is a link out of the release: the spoken StoryCloze's folder of recordings
  (tmp_path / "spoken").mkdir()
  shutil.copytree(outside, tmp_path / "stories")
  os.symlink(tmp_path / "stories", tmp_path / "spoken" / "tSC")
  with pytest.raises(ReleaseError, match=r"task spoken_tstorycloze's release_jsonl: tSC resolves to .*stories, "
                                         r"outside the release"):
    read_questions("spoken_tstorycloze", str(tmp_path / "spoken"))


@pytest.mark.parametrize("blank", ["", "   ", "\u200b", " \u200b\u200d\ufeff ", "\u3000"])
def test_a_text_of_nothing_but_invisible_characters_is_empty(tmp_path, blank):
  lines = _stories("0_x", "1_x", "2_x", "3_x")
  lines[2]["last"] = blank
  root = _story_release(tmp_path / "release", lines)
  with pytest.raises(ReleaseError, match=r"sStory_s2t.jsonl:3 uttid 2_x: empty text in \['last'\]"):
    read_questions("sstorycloze", str(root))
  assert [q.id for q in read_questions("sstorycloze", str(root), problems=Problems())] == ["0_x"]


def test_a_zero_width_joiner_inside_words_is_text():
  from tasks.release import is_blank

  assert not is_blank("a\u200db") and not is_blank("谢谢") and is_blank("\u2060\u200b \t")


# ---- a plugin's release layout: ZeroSpeech's gold file ------------------------------------------------------------

GOLD = [  # id, voice, word, correct: two pairs of one voice, one of another, in no order
  ("1", "Alice", "brick", "1"), ("2", "Alice", "klorb", "0"), ("1", "Alice", "bruck", "0"),
  ("2", "Alice", "table", "1"), ("1", "Bob", "brick", "1"), ("1", "Bob", "bruck", "0")]


def _zerospeech_release(root: pathlib.Path) -> dict[str, str]:
  """lexical/dev/gold.csv and a randomly named recording per line (the sample's spoken stories); returns each
  recording's name -> its gold line's `correct`."""
  folder = root / "lexical" / "dev"
  folder.mkdir(parents=True)
  rng = np.random.default_rng(5)
  names = {}
  with open(folder / "gold.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["id", "filename", "voice", "frequency", "word", "phones", "length", "correct"])
    for n, (pair, voice, word, correct) in enumerate(GOLD):
      name = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"), 11))
      shutil.copy(os.path.join(STORIES, "s-story-firstspeech", f"{2 * n}.wav"), folder / f"{name}.wav")
      writer.writerow([pair, name, voice, 12, word, "b r ih k", 4, correct])
      names[name] = correct
  return names


@pytest.mark.slow
def test_a_plugin_release_layout_of_a_gold_file_builds_and_scores(tmp_path):
  """Three (id, voice) pairs, each recording scored whole by a unit LM: every candidate is its gold line's
  recording, the word the right one, and its loss the naive forward's over bos, its units and eos."""
  import soundfile
  import torch

  from tasks.audio.mel_kmeans import MelKmeansTokenizer
  from tasks.sample import MEL_KMEANS_CODEBOOK
  from tests.test_spoken_storycloze import unit_lm

  names = _zerospeech_release(tmp_path / "release")
  spec, model, ckpt = unit_lm(tmp_path)
  common = ["--task=toy_swuggy", f"--spec={spec}", "--modality=s2s", "--protocol=utterance", "--row_length=1024",
            f"--data_dir={tmp_path / 'data'}"]
  plugin = "tests.plugins.toy_zerospeech"
  for module, args in (("tasks.prepare", [f"--manual_dir={tmp_path / 'release'}"]),
                       ("s2sjax.eval", [f"--checkpoint={ckpt}", f"--output_dir={tmp_path / 'out'}"])):
    done = _run(module, *common, *args, plugin=plugin)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

  lines = [json.loads(line) for line in open(tmp_path / "out" / "unit_lm" / "toy_swuggy-s2s_utterance.scores.jsonl")]
  assert sorted(line["uttid"] for line in lines) == sorted(names)
  assert all(line["is_answer"] == (names[line["uttid"]] == "1") for line in lines)
  assert sorted({line["question"] for line in lines}) == ["1_Alice", "1_Bob", "2_Alice"]
  tokenizer = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  for line in lines:
    wave, _ = soundfile.read(tmp_path / "release" / "lexical" / "dev" / f"{line['uttid']}.wav", dtype="float32")
    ids = [1] + (2 + tokenizer.encode(wave, "x")[:, 0]).tolist() + [1]
    with torch.no_grad():
      log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    naive = -float(sum(log_probs[j, ids[j + 1]] for j in range(len(ids) - 1)))
    assert line["n_tokens"] == len(ids) - 1 and abs(line["nll_sum"] - naive) <= 1e-4 * max(1.0, abs(naive))
  metrics = json.load(open(tmp_path / "out" / "metrics.json"))["runs"][0]["tasks"]["toy_swuggy"]["s2s_utterance"]
  loss = {line["uttid"]: line["nll_sum"] / line["n_tokens"] for line in lines}
  by_question = {}
  for line in lines:
    by_question.setdefault(line["question"], {})[line["is_answer"]] = loss[line["uttid"]]
  right = [(pair[True] < pair[False]) + 0.5 * (pair[True] == pair[False]) for pair in by_question.values()]
  assert metrics["questions"] == 3 and metrics["accuracy"] == pytest.approx(sum(right) / 3)


def test_a_tasks_tfds_builder_is_made_from_its_record(tmp_path):
  """No builder file per task: TFDS finds each task's builder by the task's name, its data folder named after it."""
  import tensorflow_datasets as tfds

  from tasks.tfds_builder import builder_class

  for task in ("sstorycloze", "scmmlu", "spoken_tstorycloze"):
    builder = tfds.builder(task, config="demo-t2t-1024", data_dir=str(tmp_path))
    assert type(builder) is builder_class(task) and builder.TASK == task
    assert str(builder.data_dir) == str(tmp_path / task / "demo-t2t-1024" / "1.1.0")


# ---- a plugin's reader is held to Question's types where its records enter ----------------------------------------

INT_CANDIDATES_PLUGIN = '''"""A release format whose reader gives its candidates as integers, not text."""
from s2sjax.data import task_registry
from tasks import release
from tasks.release import Question

task_registry.RELEASE_FORMATS.register(task_registry.ReleaseFormat(
  "numbered_answers", "stories whose endings are numbers", modalities=("t2t",)))
task_registry.register(task_registry.Task(
  "toy_numbers", "ToyNumbers", "en", "numbered_answers", "numbers/questions.txt", "numbers", "numbers",
  decision="pair", candidates=2, sizes=task_registry.PlannerSizes(1, 10, 1, 0.0)))


def read(record, paths, collect):
  return [Question(id="q0", language="en", uttids=("0", "1"), prefixes=("Two plus two is",) * 2,
                   audio_paths=("", ""), candidates=(4, 5), correct=0)]


release.register(release.ReleaseReader("numbered_answers", read))
'''


@pytest.mark.slow
def test_a_plugin_reader_giving_integer_candidates_is_refused_naming_it_and_the_record(tmp_path, qwen_tokenizer_dir):
  """tasks.prepare over a plugin whose reader gives candidates (4, 5): exit 1, one line naming the release format,
  its reader and the question (not a TypeError where the encoder adds a separator to an int), nothing built."""
  (tmp_path / "numbers_plugin.py").write_text(INT_CANDIDATES_PLUGIN)
  (tmp_path / "release" / "numbers").mkdir(parents=True)
  (tmp_path / "release" / "numbers" / "questions.txt").write_text("q0\n")
  env = {**os.environ, plugins.ENV: "numbers_plugin", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
  done = subprocess.run([sys.executable, "-m", "tasks.prepare", "--task=toy_numbers", "--modality=t2t",
                         f"--manual_dir={tmp_path / 'release'}", f"--tokenizer_dir={qwen_tokenizer_dir}",
                         f"--data_dir={tmp_path / 'data'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 1, done.stdout + done.stderr
  assert done.stderr.splitlines() == [
    "error: release format numbered_answers's reader numbers_plugin:read gave 1 malformed question(s) of task "
    "toy_numbers; first question 'q0' (record 1 of 1): candidates (4, 5) is not a tuple of 2 strings, one per "
    "candidate", "(--verbosity=1 shows where it was raised)"]
  assert not list((tmp_path / "data").rglob("dataset_info.json"))


def _good(**fields):
  from tasks.release import Question

  return Question(**{**dict(id="7", language="en", uttids=("7", "8"), prefixes=("Tom went out.",) * 2,
                            audio_paths=("a.wav", "b.wav"), candidates=("He came back.", "Fish sang."), correct=0),
                     **fields})


@pytest.mark.parametrize("given, says", [
  ({"id": 7}, "id 7 is not a non-empty string"),
  ({"language": None}, "language None is not a non-empty string"),
  ({"candidates": ["He came back.", "Fish sang."]}, "candidates ['He came back.', 'Fish sang.'] are not a tuple of "
                                                    "the task's 2"),
  ({"candidates": ("only one",)}, "candidates ('only one',) are not a tuple of the task's 2"),
  ({"prefixes": ("Tom went out.", b"bytes")}, "prefixes ('Tom went out.', b'bytes') is not a tuple of 2 strings"),
  ({"uttids": (7, 8)}, "uttids (7, 8) is not a tuple of 2 strings"),
  ({"audio_paths": ("a.wav",)}, "audio_paths ('a.wav',) is not a tuple of 2 strings"),
  ({"candidate_audio_paths": (None, None)}, "candidate_audio_paths (None, None) is not a tuple of 2 strings"),
  ({"correct": 2}, "correct 2 is not the index of a candidate (0 to 1)"),
  ({"correct": True}, "correct True is not the index of a candidate"),
  ({"labels": {"voice": 1}}, "labels {'voice': 1} are not a dict of strings to strings"),
])
def test_every_field_of_a_readers_record_is_held_to_its_type(given, says):
  from tasks.release import ReaderError, check_questions, read_story_pairs

  record = task_registry.get("sstorycloze")
  assert check_questions([_good(), _good(id="9")], record, read_story_pairs)  # as the built-in readers give them
  with pytest.raises(ReaderError, match=r"^release format story_pairs's reader tasks\.release:read_story_pairs gave 1 "
                                        r"malformed question\(s\) of task sstorycloze; first question .* \(record 2 "
                                        r"of 2\): " + re.escape(says)):
    check_questions([_good(id="9"), _good(**given)], record, read_story_pairs)
  with pytest.raises(ReaderError, match=r"gave a tuple, not a list of questions"):
    check_questions((_good(),), record, read_story_pairs)
  with pytest.raises(ReaderError, match=r"first the record \(record 1 of 1\): is a dict, not a "
                                        r"tasks\.release\.Question"):
    check_questions([{"id": "7"}], record, read_story_pairs)


def test_a_question_lacking_a_label_its_task_groups_or_breaks_down_by_is_refused_naming_it():
  from tasks.release import ReaderError, check_questions, read_story_pairs

  record = dataclasses.replace(task_registry.get("sstorycloze"), averaged_over="id", breakdowns=("band",))
  assert check_questions([_good(labels={"id": "7", "band": "oov"})], record, read_story_pairs)
  with pytest.raises(ReaderError, match=r"labels \{'id': '7'\} lack band, which task sstorycloze groups or breaks"):
    check_questions([_good(labels={"id": "7"})], record, read_story_pairs)
