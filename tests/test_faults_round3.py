"""Issue 38, round three: untrusted text in reports, and configs, meshes, caches, plugins and checkpoint globs
refused by name (the audio faults: tests/test_faults_audio.py; the converter's: tests/test_faults_conversion.py;
launch.tpu's arguments: tests/test_launch.py)."""

import html
import re

import numpy as np
import pytest

from s2sjax import flips

HOSTILE_TEXTS = ["<script>alert(1)</script> **bold** | x", "[click](javascript:alert(1)) ![i](http://x/i.png)",
                 "<img src=x onerror=alert(1)>", "`code` ~~gone~~ $x^2$ \\*", "two\nlines\n\n# a heading",
                 "&lt;b&gt; &amp; <!-- hidden -->"]


def test_a_flips_markdown_shows_a_release_text_as_it_reads():
  """Rendered by a CommonMark reader with HTML and GFM tables on, each cell holds the release's text as plain
  text: no tag, link, image or emphasis comes out of it."""
  markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py renders the page as a reader would")
  texts = HOSTILE_TEXTS
  flip = flips.Flip("q<1>*", True, 1.0, -1.0, tuple(texts[1:]), 0, (1.0,) * 5, (2.0,) * 5)
  page = flips.markdown("T", ("t2t", "s2t"), [flip], {"q<1>*": texts[0]}, {"q<1>*": "a_b*.wav"})
  rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(page)
  cells = re.findall(r"<td>(.*?)</td>", rendered, re.S)
  assert len(cells) == 6
  assert html.unescape(cells[0]) == "q<1>*" and html.unescape(cells[5]) == "a_b*.wav"
  assert html.unescape(cells[1]) == texts[0]
  candidates = [html.unescape(c) for c in cells[2].split("<br>")]
  expected = [" ".join(t.splitlines()) for t in texts[1:]]
  assert [c.split(" ", 1)[1].rsplit(" (T→T", 1)[0] for c in candidates] == expected
  tags = set(re.findall(r"<(/?\w+)", rendered))
  assert tags <= {"h1", "/h1", "h2", "/h2", "p", "/p", "table", "/table", "thead", "/thead", "tbody", "/tbody",
                  "tr", "/tr", "th", "/th", "td", "/td", "br"}


def _record(path, step, accuracy):
  """A checkpoint's record as s2sjax.eval writes it into metrics.json (name, path, step, its task metrics)."""
  return {"name": path, "path": path, "step": step,
          "tasks": {"sstorycloze": {"t2t": {"accuracy": accuracy, "positive_loss": 2.0, "negative_loss": 3.0}}}}


def test_two_runs_under_one_glob_are_two_curves_not_one_that_jumps(tmp_path):
  """`--checkpoint=ckpts/*/step_*` over runA and runB, both with step_100 and step_200: each run keeps its own
  line, named by its folder; checkpoints of one folder sharing a step are still refused."""
  from s2sjax import checkpoint_paths, reports

  for run in ("runA", "runB"):
    for step in (100, 200):
      (tmp_path / "ckpts" / run / f"step_{step}").mkdir(parents=True)
  paths = checkpoint_paths.expand(str(tmp_path / "ckpts" / "*" / "step_*"))
  assert checkpoint_paths.run_names(paths) == ["runA/step_100", "runB/step_100", "runA/step_200", "runB/step_200"]
  accuracy = {"runA": {100: 0.5, 200: 0.6}, "runB": {100: 0.9, 200: 0.95}}
  history = [_record(p, step, accuracy[p.split("/")[-2]][step])
             for p, step in zip(paths, checkpoint_paths.steps(paths))]
  lines = reports.curve_lines(history)
  assert [(line.label, line.steps, line.values) for line in lines["accuracy"]] == [
      ("runA sStoryCloze T→T", [100, 200], [50.0, 60.0]), ("runB sStoryCloze T→T", [100, 200], [90.0, 95.0])]
  assert [line.label for line in lines["loss"]] == [
      "runA sStoryCloze T→T positive", "runA sStoryCloze T→T negative",
      "runB sStoryCloze T→T positive", "runB sStoryCloze T→T negative"]
  one_run = reports.curve_lines(history[::2])  # runA alone: its line, named as before
  assert [(line.label, line.steps) for line in one_run["accuracy"]] == [("sStoryCloze T→T", [100, 200])]
  assert len(reports.plot_curves(tmp_path, history)) == 2
  (tmp_path / "ckpts" / "runA" / "ckpt-100-fp16").mkdir()
  with pytest.raises(checkpoint_paths.CheckpointListError, match="are all step 100"):
    checkpoint_paths.steps([str(tmp_path / "ckpts" / "runA" / "step_100"),
                            str(tmp_path / "ckpts" / "runA" / "ckpt-100-fp16")], r"(\d+)")
