"""SIGINT (Ctrl-C) or SIGTERM to a running `tasks.prepare`, `checkpoints_conversion.convert` or `tasks.importer`:
it stops with 128 + the signal's number (the test waits on the process, not on a clock, and prints how long after
the signal it ended), keeps what is complete, leaves nothing half written that a
later run could take for complete, releases its lock, says in one line what it kept and how to go on, and a rerun
of the same command finishes the work (reusing what was kept)."""

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from s2sjax.data import task_registry
from s2sjax.runtime.output_dir import LOCK_NAME
from s2sjax.data.task_data import load_task_data
from tasks.importer import SPEECH_CACHE, clip_path, import_all
from tasks.release import read_questions
from tasks.tfds_builder import VERSION

pytestmark = pytest.mark.slow  # each runs a command as a subprocess, interrupts it, and runs it again


@contextlib.contextmanager
def _started(command):
  """The command running in its own process group (as a terminal's job); whatever of it still runs when the block
  ends (a failed test) is killed."""
  process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
  try:
    yield process
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.communicate()


HANG_GUARD_S = 600  # a bound on a hung command, not a measurement


def _stop(process, send) -> tuple[str, str]:
  """Sends the signal (`send()`) and waits for `process` to end; prints how long after the signal it did."""
  sent = time.monotonic()
  send()
  stdout, stderr = process.communicate(timeout=HANG_GUARD_S)
  print(f"{process.args[2]}: ended {time.monotonic() - sent:.2f} s after the signal")
  return stdout, stderr


def _wait_for(done, process, what: str, limit_s: float = 300):
  """Polls `done()` while `process` runs (a generous bound, not a measurement)."""
  deadline = time.monotonic() + limit_s
  while not done():
    assert process.poll() is None, process.communicate()
    assert time.monotonic() < deadline, f"{what} never happened"
    time.sleep(0.01)


def _interruption_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("interrupted by")]


def _files(directory: Path) -> dict[str, bytes]:
  return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_prepare_keeps_the_finished_build_and_a_rerun_builds_the_rest(tmp_path, qwen_tokenizer_dir):
  data_dir = tmp_path / "data"
  command = [sys.executable, "-m", "tasks.prepare", "--task=scmmlu", "--modality=t2t,s2t", "--row_length=1024",
             f"--data_dir={data_dir}", f"--tokenizer_dir={qwen_tokenizer_dir}"]
  task_dir = data_dir / "scmmlu"
  with _started(command) as process:
    # T->T is built, S->T under way (its audio is tokenized inside TFDS's incomplete folder)
    _wait_for(lambda: list(task_dir.glob("demo-s2t-1024/incomplete.*")), process, "the S->T build")
    stdout, stderr = _stop(process, lambda: process.send_signal(signal.SIGTERM))
  assert process.returncode == 128 + signal.SIGTERM, stdout + stderr
  assert _interruption_lines(stderr) == [
    f"interrupted by SIGTERM: kept 1 complete build in {data_dir} (scmmlu/demo-t2t-1024); scmmlu/demo-s2t-1024 "
    "was not finished and nothing of it is kept; rerun the same command to build only the rest (complete builds "
    "are reused)"], stderr
  assert not list(task_dir.glob(f".*{LOCK_NAME}"))
  assert not list(task_dir.glob("*/incomplete.*")) and not (task_dir / "demo-s2t-1024" / str(VERSION)).exists()
  kept = task_dir / "demo-t2t-1024" / str(VERSION)
  kept_files = _files(kept)
  first_report = [line for line in stdout.splitlines() if line.startswith("scmmlu demo-t2t-1024:")]
  assert len(first_report) == 1

  finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  assert _files(kept) == kept_files  # reused as it was, not built again
  assert first_report[0] in finished.stdout.splitlines() and "scmmlu demo-s2t-1024:" in finished.stdout
  for modality in ("t2t", "s2t"):  # both load, their checksums verified
    assert len(load_task_data(str(data_dir), "scmmlu", modality, "demo", 1024).rows["tokens"]) > 0
  assert not list(task_dir.glob(f".*{LOCK_NAME}"))


def test_convert_keeps_the_checkpoint_it_was_replacing_and_a_rerun_converts(tmp_path):
  from checkpoints_conversion.convert import convert
  from tests.hf_models import save_hf, tiny_model

  # many small tensors: the signal lands while leaves are converted, one after another
  hf = save_hf(tiny_model("qwen2", hidden_size=16, intermediate_size=32, num_hidden_layers=128,
                          num_attention_heads=2, num_key_value_heads=1), str(tmp_path / "hf"))
  out = tmp_path / "ckpt"
  convert(hf, str(out))  # what the interrupted run was to replace, and what the rerun must write again
  before = _files(out)
  command = [sys.executable, "-m", "checkpoints_conversion.convert", f"--source={hf}", f"--output={out}",
             "--overwrite"]
  with _started(command) as process:
    _wait_for(lambda: list(tmp_path.glob(".ckpt.partial-*/model_config.json")), process, "the conversion's staging")
    stdout, stderr = _stop(process, lambda: process.send_signal(signal.SIGINT))
  assert process.returncode == 128 + signal.SIGINT, stdout + stderr
  assert _interruption_lines(stderr) == [
    f"interrupted by SIGINT: the conversion was not finished and its partial files are removed; the checkpoint "
    f"already at {out} is kept as it was; rerun the same command to convert from the start"], stderr
  assert "Traceback" not in stderr
  assert _files(out) == before and not list(tmp_path.glob(".ckpt*"))

  finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["checksums"] == json.loads(before["manifest.json"])["checksums"]
  assert not list(tmp_path.glob(".ckpt*"))


def _story_sources(root: Path) -> tuple[str, str]:
  """A two-story StoryCloze CSV and a sixteen-story XStoryCloze zh TSV, every sentence distinct."""
  header = ["InputStoryid", *(f"InputSentence{i}" for i in range(1, 5)), "RandomFifthSentenceQuiz1",
            "RandomFifthSentenceQuiz2", "AnswerRightEnding"]
  english = root / "stories.csv"
  with open(english, "w", encoding="utf-8", newline="") as f:
    csv.writer(f).writerows([header, ["a", "Tom woke up.", "He was hungry.", "He cooked eggs.", "He ate them.",
                                      "He smiled.", "He flew.", "1"],
                             ["b", "Ann sang.", "It rained.", "She ran.", "She hid.", "She got wet.", "She was dry.",
                              "1"]])
  chinese = root / "stories.tsv"
  rows = [[f"z{k}", f"第{k}个故事开始了", "他走进了公园", "天气很好", "他看见一只鸟", f"他笑了{k}次", f"他哭了{k}次", "1"]
          for k in range(16)]
  chinese.write_text("".join("\t".join(row) + "\n" for row in [header, *rows]), encoding="utf-8")
  return str(english), str(chinese)


@pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("sox")), reason="espeak-ng or sox is not installed")
def test_importer_keeps_the_tasks_written_and_the_clips_spoken_and_a_rerun_speaks_the_rest(tmp_path):
  english, chinese = _story_sources(tmp_path)
  out = tmp_path / "replica"
  command = [sys.executable, "-m", "tasks.importer", f"--output={out}", f"--storycloze_csv={english}",
             f"--xstorycloze_zh={chinese}", "--workers=1"]
  english_clips, total_clips = 2 + 4, 2 + 4 + 16 + 32  # prefixes and endings (tStoryCloze's are sStoryCloze's)
  cache = out / SPEECH_CACHE

  def spoken() -> int:
    return len(list(cache.glob("*.wav"))) - len(list(cache.glob("*.partial.wav")))

  tstorycloze = out / task_registry.get("tstorycloze").release_jsonl
  with _started(command) as process:
    _wait_for(lambda: tstorycloze.exists() and spoken() > english_clips, process, "zh-sStoryCloze's speech")
    # Ctrl-C: the importer, its workers and their espeak-ng / sox get it
    stdout, stderr = _stop(process, lambda: os.killpg(process.pid, signal.SIGINT))
  assert process.returncode == 128 + signal.SIGINT, stdout + stderr
  kept = spoken()
  assert english_clips < kept < total_clips
  assert _interruption_lines(stderr) == [
    f"interrupted by SIGINT: kept the tasks written in full (sstorycloze, tstorycloze) and the {kept} spoken clips "
    f"in {cache}; zh_sstorycloze was not finished; rerun the same command to go on (spoken clips are reused)"], stderr
  assert "Traceback" not in stderr
  with pytest.raises(ProcessLookupError):  # no worker, espeak-ng or sox of it goes on
    os.killpg(process.pid, 0)
  assert not list(out.rglob("*.partial*")) and not (out / "replica_report.json").exists()
  assert not (out / task_registry.get("zh_sstorycloze").release_jsonl).exists()  # not taken for a complete task
  for task in ("sstorycloze", "tstorycloze"):
    questions = read_questions(task, str(out))
    assert all(os.path.exists(p) for q in questions for p in q.audio_paths + q.candidate_audio_paths)

  finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
  assert finished.returncode == 0, finished.stdout + finished.stderr
  report = json.loads((out / "replica_report.json").read_text())
  assert [report[t]["synthesized"] for t in ("sstorycloze", "tstorycloze", "zh_sstorycloze")] == \
    [0, 0, total_clips - kept]
  reference = tmp_path / "reference"  # an uninterrupted import's lines (without speech: the texts are the same)
  import_all(str(reference), english, [chinese], None, speech=False)
  for task in ("sstorycloze", "tstorycloze", "zh_sstorycloze"):
    jsonl = task_registry.get(task).release_jsonl
    assert (out / jsonl).read_bytes() == (reference / jsonl).read_bytes()
    language = task_registry.get(task).language
    for question in read_questions(task, str(out)):  # every wav is its own text's clip
      for path, text in zip(question.audio_paths + question.candidate_audio_paths,
                            question.prefixes + question.candidates):
        assert Path(path).read_bytes() == Path(clip_path(str(out), language, text)).read_bytes(), (path, text)
