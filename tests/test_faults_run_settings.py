"""Untrusted text in reports, and configs, meshes, caches, plugins and checkpoint globs
refused by name (the audio faults: tests/test_faults_audio.py; the converter's: tests/test_faults_conversion.py;
launch.tpu's arguments: tests/test_launch.py)."""

import html
import re

import numpy as np
import pytest

from s2sjax.results import flips

HOSTILE_TEXTS = ["<script>alert(1)</script> **bold** | x", "[click](javascript:alert(1)) ![i](http://x/i.png)",
                 "<img src=x onerror=alert(1)>", "`code` ~~gone~~ $x^2$ \\*", "two\nlines\n\n# a heading",
                 "&lt;b&gt; &amp; <!-- hidden -->", "_emphasis_ __strong__ snake_case 中_文"]


def test_a_flips_markdown_shows_a_release_text_as_it_reads():
  """Rendered by a CommonMark reader with HTML and GFM tables on, each cell holds the release's text as plain
  text: no tag, link, image or emphasis comes out of it."""
  markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py renders the page as a reader would")
  texts = HOSTILE_TEXTS
  flip = flips.Flip("q<1>*", True, 1.0, -1.0, tuple(texts[1:]), 0, (1.0,) * 6, (2.0,) * 6)
  page = flips.markdown("T", ("t2t", "s2t"), [flip], {"q<1>*": texts[0]}, {"q<1>*": "a_b*.wav"})
  rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(page)
  cells = re.findall(r"<td>(.*?)</td>", rendered, re.S)
  assert len(cells) == 6
  assert html.unescape(cells[0]) == "q<1>*" and html.unescape(cells[5]) == "a_b*.wav"
  assert html.unescape(cells[1]) == texts[0]
  candidates = [html.unescape(c) for c in cells[2].split("<br>")]
  expected = [" ".join(t.splitlines()) for t in texts[1:]]
  assert [c.split(" ", 1)[1].rsplit(" (T→T", 1)[0] for c in candidates] == expected
  assert flips.markdown_text("16_zh") == "16_zh"  # ids stay as they read: an intraword _ is no emphasis
  tags = set(re.findall(r"<(/?\w+)", rendered))
  assert tags <= {"h1", "/h1", "h2", "/h2", "p", "/p", "table", "/table", "thead", "/thead", "tbody", "/tbody",
                  "tr", "/tr", "th", "/th", "td", "/td", "br"}


def _record(path, step, accuracy):
  """A checkpoint's record as s2sjax.eval writes it into metrics.json (name, path, step, its task metrics)."""
  return {"name": path, "path": path, "step": step,
          "tasks": {"sstorycloze": {"t2t": {"accuracy": accuracy, "positive_loss": 2.0, "negative_loss": 3.0}}}}


@pytest.mark.slow
def test_two_runs_under_one_glob_are_two_curves_not_one_that_jumps(tmp_path):
  """`--checkpoint=ckpts/*/step_*` over runA and runB, both with step_100 and step_200: each run keeps its own
  line, named by its folder; checkpoints of one folder sharing a step are still refused."""
  from s2sjax.scoring.checkpoints import paths as checkpoint_paths
  from s2sjax.results import reports

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


def test_a_mesh_naming_an_axis_twice_or_a_size_of_zero_is_refused_by_name():
  import jax

  from s2sjax.runtime import sharding

  devices = jax.devices()[:4]
  for spec, message in (("data:2,data:4", r"mesh 'data:2,data:4' names axis 'data' twice"),
                        ("data:-1,model:2,model:1", r"names axis 'model' twice"),
                        ("data:0", r"data:0 is no size"), ("model:-2,data:-1", r"model:-2 is no size")):
    with pytest.raises(sharding.MeshError, match=message):
      sharding.make_mesh(spec, devices)
  assert dict(sharding.make_mesh("data:2,model:2", devices).shape) == {"data": 2, "fsdp": 1, "model": 2}


def test_a_cache_that_cannot_be_written_is_named_as_the_cache(tmp_path, monkeypatch):
  """The default model is converted into $S2SJAX_CACHE on first use: a cache that cannot be written is that, not
  'the output directory' (which --output_dir would not mend)."""
  from s2sjax.runtime import cache
  from s2sjax.commands.default_checkpoint import default_checkpoint
  from s2sjax.runtime.output_dir import OutputError, waiting_lock

  (tmp_path / "a-file").write_text("")
  monkeypatch.setenv(cache.ENV, str(tmp_path / "a-file" / "cache"))
  with pytest.raises(OutputError) as refused:
    default_checkpoint()
  assert str(refused.value).startswith(f"cannot write to the cache {tmp_path}/a-file/cache ($S2SJAX_CACHE=")
  assert "the conversion of the default model" in str(refused.value)
  assert str(refused.value).endswith(f"set {cache.ENV} to a folder you can write")
  with pytest.raises(OutputError, match=rf"cannot write to {tmp_path}/a-file/data/t, where the build of t/c goes"):
    with waiting_lock(tmp_path / "a-file" / "data" / "t", ".c.lock", "t/c", "build"):
      pass


@pytest.mark.slow
def test_a_plugin_that_fails_to_import_is_one_line_naming_it(tmp_path, monkeypatch):
  import os
  import subprocess
  import sys

  from s2sjax.runtime import plugins
  from s2sjax.runtime.errors import UserError

  (tmp_path / "broken_plugin.py").write_text("import os\nvalue = 1 / 0\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd()]))
  for name, why in (("broken_plugin", "ZeroDivisionError: division by zero"),
                    ("no_such_plugin", "no such module on the Python path")):
    done = subprocess.run([sys.executable, "-m", "tasks.prepare", "--task=sstorycloze"], capture_output=True, text=True,
                          env=dict(env, S2SJAX_PLUGINS=f"{name}"), timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"error: S2SJAX_PLUGINS names {name!r}, which cannot be imported ({why})",
                                        "(--verbosity=1 shows where it was raised)"]
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv(plugins.ENV, "broken_plugin")
  with pytest.raises(plugins.PluginError) as raised:  # in a Python program: an ImportError, its cause chained
    plugins.load_plugins()
  assert isinstance(raised.value, ImportError) and isinstance(raised.value, UserError)
  assert isinstance(raised.value.__cause__, ZeroDivisionError)


def _config(layers=2, hidden=64, heads=4, vocab=512):
  from s2sjax.model.config import ModelConfig

  return ModelConfig("qwen2", vocab, hidden, 4 * hidden, layers, heads, heads, hidden // heads, 1e4, hidden // heads,
                     False, 1e-6, True, False, False, False)


def test_a_step_that_cannot_fit_is_refused_with_its_figures_before_compiling(monkeypatch):
  """The planner's arithmetic for devices of 1 GiB (the figure a device reports, or its share of the host's)."""
  import dataclasses

  import jax

  from s2sjax.scoring import planner
  from s2sjax.runtime import sharding
  from s2sjax.data.packing import RowShape

  monkeypatch.setattr(planner, "device_memory", lambda device: 2**30)
  config = _config()  # 4 heads, fp32: a row's scores are 4 x length x keys x 4 bytes, three times over
  mesh = sharding.make_mesh("data:2,model:1", jax.devices()[:2])
  params = planner.param_bytes(config, "float32")
  story = dataclasses.replace(RowShape.for_length(16384), max_item=13000)  # one long story's rows
  keys = planner.attention_keys(story, "dot_product")
  assert keys == 13024 + 32  # its item-local window: the longest item rounded up to blocks of 32, and a block
  assert planner.attention_keys(story, "cudnn") == planner.attention_keys(story, "flash") == 0  # fused: no scores held
  one_row = planner.activation_bytes(config, 1, 16384, "float32", 1, keys)
  assert one_row > 3 * 4 * 16384 * keys * 4 > 2 * 2**30
  with pytest.raises(planner.MemoryPlanError) as refused:
    planner.check_step_memory(config, [story], 2, "float32", "dot_product", mesh)
  assert str(refused.value) == (
      f"the scoring step would need about {(params + one_row) / 2**30:,.1f} GiB per device ({params / 2**30:,.1f} GiB "
      f"of parameters + {one_row / 2**30:,.1f} GiB of activations: 1 row(s) of 16,384 tokens, attention over 13,056 "
      "keys each with --attention=dot_product), more than twice a device's 1.0 GiB: not even one row fits: rebuild "
      "with a shorter --row_length (its rows hold the longest item, 13,000 tokens; --overlong=truncate_prefix cuts "
      "long prefixes) or split the model over more devices (--mesh=...,model:N)")
  planner.check_step_memory(config, [story], 2, "float32", "cudnn", mesh)  # a fused kernel holds no scores
  # our einsums on a CPU hold one block of 32 queries' scores at a time, not the row's: the same row fits
  assert (planner.attention_queries(story, "xla", "cpu"), planner.attention_queries(story, "xla", "tpu")) == (32, 16384)
  planner.check_step_memory(config, [story], 2, "float32", "xla", mesh)
  sample = dataclasses.replace(RowShape.for_length(1024), max_item=64)
  per_row = planner.activation_bytes(config, 1, 1024, "float32", 1, planner.attention_keys(sample, "dot_product"))
  fitting = int((2 * 2**30 - params) // per_row)  # rows per device within twice the device's memory
  with pytest.raises(planner.MemoryPlanError, match=rf"{fitting + 1} row\(s\) of 1,024 tokens.*: --batch_size="
                                                 rf"{2 * fitting} or less may fit$"):
    planner.check_step_memory(config, [sample], 2 * (fitting + 1), "float32", "dot_product", mesh)
  planner.check_step_memory(config, [sample], 2 * fitting, "float32", "dot_product", mesh)  # the figure it names


@pytest.mark.slow
def test_the_estimate_is_within_its_stated_bounds_of_xla_for_item_local_windows():
  """ESTIMATE_OVER rests on this: with item-local windows the planner counts at most 2x what XLA's analysis of
  the compiled step holds, and never 10% less."""
  import dataclasses

  import jax

  from s2sjax.scoring import planner
  from s2sjax.runtime import sharding
  from s2sjax.data.packing import RowShape
  from s2sjax.scoring.scorer import Scorer

  config = _config(layers=2, hidden=128, heads=4, vocab=4000)
  for length, rows, item, attention in ((1024, 2, 200, "xla"), (2048, 1, 700, "xla"), (1024, 2, 200, "dot_product")):
    shape = dataclasses.replace(RowShape.for_length(length), max_item=item)
    scorer = Scorer(config, shape, mesh=sharding.make_mesh("data:1", jax.devices()[:1]), batch_size=rows,
                    attention=attention)
    measured = scorer.lower_abstract().compile().memory_analysis().temp_size_in_bytes
    planned = planner.activation_bytes(config, rows, length, "float32", 1, planner.attention_keys(shape, attention),
                                       planner.attention_queries(shape, attention, "cpu"))
    assert 0.9 * measured <= planned <= planner.ESTIMATE_OVER * measured, (length, attention, planned / measured)


@pytest.mark.slow
def test_eval_refuses_a_batch_no_device_holds_before_compiling(tmp_path):
  """`s2sjax.eval --batch_size=1048576` on the embedded default: one line with the figures, no compile (it spent
  minutes compiling, then died out of memory)."""
  import os
  import subprocess
  import sys

  done = subprocess.run([sys.executable, "-m", "s2sjax.eval", "--task=sstorycloze", "--modality=t2t",
                         "--batch_size=1048576", f"--output_dir={tmp_path / 'out'}"], capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=900)
  assert done.returncode == 1, done.stderr[-3000:]
  assert re.search(r"^error: the scoring step would need about [\d,.]+ GiB per device \(.* \d+ row\(s\) of "
                   r"1,024 tokens.*more than twice a device's [\d,.]+ GiB: --batch_size=\d+ or less may fit$",
                   done.stderr, re.M), done.stderr[-3000:]
  assert not (tmp_path / "out" / "metrics.json").exists()
