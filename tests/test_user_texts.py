"""What a user reads, held to what runs: `--task` choices in the usage from the task registry, the console's result
line, `is_answer` in scores files (and old files' `correct` still read), the flips page with its recordings
embedded, and the README's and docs' names and figures."""

import base64
import pathlib
import re
import wave

import numpy as np
import pytest

from s2sjax.data import task_registry, builds
from s2sjax.scoring import default_model, planner
from s2sjax.results import flips
from s2sjax.commands import eval as s2s_eval
from s2sjax.data.questions import QuestionScores
from s2sjax.commands import prepare as prepare_command

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # not docs/benchmarks: dated records


@pytest.mark.parametrize("command", [s2s_eval, prepare_command])
def test_the_usage_lists_every_task_of_the_registry(command):
  usage = builds.usage(command.__doc__)
  choices = re.search(r"--task=(\S+)", usage).group(1).split("|")
  assert choices == task_registry.names() + ["all"] and "tstorycloze" in choices


def _scores(right_loss, wrong_loss, n_tokens=2):
  """Two-candidate questions, candidate 0 right, with these mean NLLs."""
  loss = np.stack([right_loss, wrong_loss], axis=1).astype(np.float64)
  n = len(loss)
  return QuestionScores(tuple(f"q{i}" for i in range(n)), tuple((f"q{i}", f"q{i}w") for i in range(n)),
                        (("right", "wrong"),) * n, np.zeros(n, np.int64), loss * n_tokens,
                        np.full(loss.shape, n_tokens, np.int64))


def test_the_result_line_names_the_right_and_wrong_candidates_losses():
  from s2sjax.data import metrics

  m = metrics.task_metrics(task_registry.get("sstorycloze"), _scores([1.0, 2.0], [3.0, 0.5]))
  line = s2s_eval.result_line("model sstorycloze S→T", m, 43.44)
  assert line.startswith("model sstorycloze S→T: accuracy 50.0% [")
  assert line.endswith("over 2 comparisons, loss right 1.500 / wrong 1.750 (43.4s)")


def test_scores_lines_mark_the_answer_and_lines_without_the_mark_are_refused():
  scores = _scores([1.0, 2.0], [3.0, 0.5])
  lines = scores.to_lines()
  assert [line["is_answer"] for line in lines] == [True, False, True, False]
  assert not any("correct" in line for line in lines)
  back = QuestionScores.from_lines(lines)
  assert back.ids == scores.ids and (back.correct == 0).all() and (back.nll_sum == scores.nll_sum).all()
  renamed = [{("correct" if k == "is_answer" else k): v for k, v in line.items()} for line in lines]
  for unmarked in (renamed, [{k: v for k, v in line.items() if k != "is_answer"} for line in lines]):
    with pytest.raises(ValueError, match=r"lines without \['is_answer'\]"):
      QuestionScores.from_lines(unmarked)


def _wav(path, seconds):
  with wave.open(str(path), "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(16000)
    w.writeframes(np.zeros(int(16000 * seconds), np.int16).tobytes())
  return str(path)


def test_the_flips_page_embeds_the_flipped_recordings(tmp_path):
  text = _scores([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])  # T->T gets all three right
  speech = _scores([2.0, 3.0, 1.0], [1.0, 1.0, 2.0])  # S->T gets q0, q1 wrong: q1 moved most
  found = flips.find_flips(task_registry.get("sstorycloze"), text, speech)
  assert [f.question for f in found] == ["q1", "q0"]
  audio = {q: _wav(tmp_path / f"{q}.wav", 0.5) for q in ("q0", "q1", "q2")}
  flips.write_flips(tmp_path / "out", "sstorycloze", "sStoryCloze", ("t2t", "s2t"), found, {}, audio)
  page = (tmp_path / "out" / "sstorycloze.s2t_vs_t2t.flips.html").read_text()
  for q in ("q0", "q1"):
    assert base64.b64encode(pathlib.Path(audio[q]).read_bytes()).decode() in page
  assert "file://" not in page and page.count("<audio") == 2 and "linked as files" not in page
  # past the budget the smaller move links its file, and the page says so; so does a recording gone since
  size = pathlib.Path(audio["q1"]).stat().st_size
  sources = flips.audio_sources(found, audio, embed_bytes=size)
  assert sources["q1"].startswith("data:audio/") and sources["q0"] == "file://" + audio["q0"]
  gone = flips.audio_sources(found, {**audio, "q1": str(tmp_path / "moved.wav")})
  assert gone["q1"] == "file://" + str(tmp_path / "moved.wav") and gone["q0"].startswith("data:")
  assert "1 recordings" in flips.html_page("t", ("t2t", "s2t"), found, {}, gone)


def test_the_docs_name_the_default_model_as_it_is():
  assert default_model.GGUF_NAME.startswith("SmolLM2-135M-Instruct.") and "SmolLM2-135M-Instruct" in s2s_eval.DEMO_NAME
  for path in DOCS:
    for line in path.read_text().splitlines():
      assert not re.search(r"SmolLM2-135M(?!-Instruct)", line), f"{path.name}: {line}"
  readme = (ROOT / "README.md").read_text()
  assert "SmolLM2-135M-Instruct" in readme and "S2SJAX_CACHE" in readme


def test_the_readme_is_short():
  assert len((ROOT / "README.md").read_text().splitlines()) <= 200  # issue 25: details live in docs/


def test_the_plan_figures_in_the_docs_are_what_the_planner_prints():
  p = planner.plan(planner.named_models()["qwen2.5-7b"], "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  memory = f"{p['params_gib']:.2f} + {p['activations_gib']:.2f} GiB per chip"
  minutes = f"{p['total_seconds'] / 60:.1f} min at 40% MFU"
  for name in ("README.md", "docs/tpu.md"):
    text = " ".join((ROOT / name).read_text().split())
    assert f"`{p['mesh']}`, {memory}" in text and minutes in text, name
  tpu = " ".join((ROOT / "docs" / "tpu.md").read_text().split())
  assert f"{p['benchmark_tflops']:,.0f} TFLOP" in tpu
  glm = planner.plan(planner.named_models()["glm-4-9b"], "v4-32", 2048, 8, "bfloat16", 12.5, 0.4)
  assert f"GLM-4-9B on v4-32 → `{glm['mesh']}`, {glm['total_gib']:.2f} GiB per chip" in tpu
