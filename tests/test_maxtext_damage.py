"""A damaged MaxText checkpoint, as a user meets one: every array flipped, cut or removed in turn, NaN parameters,
a run config that contradicts the run's own, and a folder read once per evaluation. Each outcome is the user's:
the same scores as the intact folder, or one line naming the parameter and the file; never a non-finite score.

The checkpoints are written here (tests/stack_fixtures.py `tiny_maxtext_checkpoint`, orbax as MaxText calls it),
each array in its own zarr3 folder, so that one array's file can be damaged alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from s2sjax.commands import eval as eval_command
from s2sjax.scoring import log_probs, preflight
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.checkpoints.stacks import maxtext
from s2sjax.scoring.checkpoints.stacks.maxtext_config import RunConfig
from tests.stack_fixtures import TINY_RUN, tiny_maxtext_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = np.array([3, 17, 200, 5, 9, 64, 128, 1, 2, 250], np.int32)


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> str:
  return tiny_maxtext_checkpoint(str(tmp_path_factory.mktemp("maxtext") / "params_only"))


def array_files(folder: str) -> list[str]:
  """The data file of every parameter (zarr3's `c/...` shard), relative to the folder."""
  found = []
  for parent, _, names in os.walk(os.path.join(folder, "items")):
    if os.sep + "c" in parent[len(folder):]:
      found += [os.path.relpath(os.path.join(parent, name), folder) for name in names]
  return sorted(found)


def damage(path: str, how: str) -> None:
  data = bytearray(open(path, "rb").read())
  if how == "flip":  # 16 bytes in the middle of the data, sizes intact
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
  elif how == "ones":  # all-ones bytes: a float32 NaN where they land in stored values (what a user met)
    middle = len(data) // 2
    data[middle:middle + 16] = b"\xff" * 16
  elif how == "cut":
    data = data[: len(data) // 2]
  if how == "remove":
    os.remove(path)
  else:
    open(path, "wb").write(data)


@pytest.mark.slow
def test_every_array_flipped_cut_or_removed_scores_as_intact_or_is_refused_by_name(intact, tmp_path):
  """Changed bytes: refused where they decode to non-finite values (or fail to decode), else scored; MaxText's
  zstd chunks carry no checksum (`"checksum": false` in every zarr.json), so a flip that decodes to finite numbers
  cannot be told from the training's own. Cut or removed: always refused, naming the parameter and the file."""
  run = TINY_RUN
  reference = log_probs.compute(intact, IDS, maxtext_run_config=run).text
  files = array_files(intact)
  assert len(files) == 15  # every parameter of the tiny Qwen2.5: 3 + 12 per-layer arrays
  for relative in files:
    parameter = relative.split(os.sep)[1].removeprefix("params.params.").replace(".", "/")
    for how in ("flip", "ones", "cut", "remove"):
      copy = str(tmp_path / f"{how}-{len(os.listdir(tmp_path))}")
      shutil.copytree(intact, copy)
      damage(os.path.join(copy, relative), how)
      try:
        scored = log_probs.compute(copy, IDS, maxtext_run_config=run).text
      except maxtext.MaxTextError as e:
        message = str(e)
        assert "\n" not in message and parameter in message, (relative, how, message)
        if how in ("cut", "remove"):
          assert os.path.join(copy, relative) in message, message  # the file itself
      else:
        assert how in ("flip", "ones"), (relative, how)  # a cut or missing file is never scored
        assert np.isfinite(scored).all(), (relative, how)
      finally:
        shutil.rmtree(copy)
    assert np.isfinite(reference).all()


@pytest.mark.slow
def test_every_file_of_an_ocdbt_folder_flipped_cut_or_removed_scores_as_intact_or_is_refused_in_one_line(tmp_path,
                                                                                                           capfd):
  """MaxText's default layout (checkpoint_storage_use_ocdbt): the arrays share data files under OCDBT's B-tree, so
  each file is damaged in turn: the PyTree's _METADATA, the B-tree and its manifest, every data file. A file the
  merged tree does not read (a process's own manifest) scores as intact; the rest are refused in one line naming
  the file, with no task dump of orbax's on the console; a flip inside a data file can decode to finite numbers,
  as above."""
  intact = tiny_maxtext_checkpoint(str(tmp_path / "intact"), ocdbt=True)
  reference = log_probs.compute(intact, IDS, maxtext_run_config=TINY_RUN).text
  files = sorted(os.path.relpath(os.path.join(parent, name), intact)
                 for parent, _, names in os.walk(os.path.join(intact, "items")) for name in names)
  assert any("ocdbt.process_0" + os.sep + "d" in f for f in files) and "items/manifest.ocdbt" in files
  capfd.readouterr()
  for relative in files:
    for how in ("flip", "cut", "remove"):
      copy = str(tmp_path / how)
      shutil.copytree(intact, copy)
      damage(os.path.join(copy, relative), how)
      try:
        scored = log_probs.compute(copy, IDS, maxtext_run_config=TINY_RUN).text
      except maxtext.MaxTextError as e:
        assert "\n" not in str(e) and copy in str(e), (relative, how, str(e))
        if "holds non-finite values" in str(e):  # values read whole and wrong: the parameter they are
          assert how == "flip" and "parameter " in str(e), (relative, how, str(e))
        elif how != "remove":  # the damaged file is named (a removed one, not always: orbax reads no tree)
          assert os.path.join(copy, relative) in str(e), (relative, how, str(e))
      else:
        assert np.isfinite(scored).all(), (relative, how)
        assert how == "flip" or np.array_equal(scored, reference), (relative, how)
      finally:
        shutil.rmtree(copy)
      assert "Traceback" not in capfd.readouterr().err, (relative, how)


@pytest.mark.slow
def test_logprobs_refuses_nan_parameters_in_one_line_and_writes_nothing(intact, tmp_path):
  copy = shutil.copytree(intact, tmp_path / "params_only")
  wo = next(f for f in array_files(str(copy)) if "mlp.wo.kernel" in f)
  damage(os.path.join(copy, wo), "ones")  # lands in stored values: NaNs
  np.save(tmp_path / "ids.npy", IDS)
  done = subprocess.run([sys.executable, "-m", "s2sjax.logprobs", f"--checkpoint={copy}",
                         f"--maxtext_config={TINY_RUN}", f"--input_ids={tmp_path / 'ids.npy'}",
                         f"--output={tmp_path / 'out.npy'}"], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 1, done.stderr[-2000:]
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
  assert "decoder/layers/mlp/wo/kernel holds non-finite values" in errors[0] and str(copy) in errors[0]
  assert not (tmp_path / "out.npy").exists()


def test_the_pre_flight_reads_every_arrays_index_and_names_a_cut_one(intact, tmp_path):
  copy = shutil.copytree(intact, tmp_path / "params_only")
  reader = checkpoint.open(str(copy), RunConfig.parse(TINY_RUN))
  assert preflight.stored_verdict(reader).ok
  embedding = next(f for f in array_files(str(copy)) if "token_embedder" in f)
  damage(os.path.join(copy, embedding), "cut")
  verdict = preflight.stored_verdict(reader)
  assert not verdict.ok and "parameter token_embedder/embedding" in verdict.detail
  assert os.path.join(str(copy), embedding) in verdict.detail


LLAMA31 = TINY_RUN.replace("qwen2.5-7b", "llama3.1-8b")


def test_a_model_name_the_runs_own_config_contradicts_is_refused_and_an_unconfirmed_one_is_said(tmp_path):
  """llama3-8b given for a llama3.1-8b run (RoPE scaling differs: 3.57 nats off, silently): refused, naming the
  key and the run's config.yml. Without a config.yml beside the run, the pre-flight says what it took on trust."""
  step = tiny_maxtext_checkpoint(str(tmp_path / "run" / "checkpoints" / "1"), LLAMA31)
  saved = dict(token.split("=", 1) for token in LLAMA31.split())
  (tmp_path / "run" / "config.yml").write_text(yaml.safe_dump(saved))
  with pytest.raises(maxtext.MaxTextError) as refused:
    checkpoint.open(step, RunConfig.parse(LLAMA31.replace("llama3.1-8b", "llama3-8b")))
  assert "model_name='llama3-8b'" in str(refused.value) and "llama3.1-8b" in str(refused.value)
  assert str(tmp_path / "run" / "config.yml") in str(refused.value) and "\n" not in str(refused.value)
  assert checkpoint.open(step, RunConfig.parse(LLAMA31)).unverified == []  # the run's own config agrees
  added = checkpoint.open(step, RunConfig.parse("tokenizer_path=/models/llama"))  # a key the run's config lacks
  assert added.model.model_name == "llama3.1-8b" and added.run.get("tokenizer_path") == "/models/llama"
  alone = tiny_maxtext_checkpoint(str(tmp_path / "params_only"), LLAMA31)
  lines = preflight.not_checked(checkpoint.open(alone, RunConfig.parse(LLAMA31)), "demo", None)
  assert any(line.startswith("not verified: model_name='llama3.1-8b'") for line in lines), lines


@pytest.mark.slow
def test_a_maxtext_checkpoint_is_opened_once_per_evaluation(bytes_sample, tmp_path, monkeypatch):
  step = tiny_maxtext_checkpoint(str(tmp_path / "params_only"))
  opened = []
  original = maxtext.StepFolder.__init__

  def counted(self, *args, **kwargs):
    opened.append(args[0])
    original(self, *args, **kwargs)

  monkeypatch.setattr(maxtext.StepFolder, "__init__", counted)
  cfg = eval_command.EvalConfig(checkpoints=step, tasks=("sstorycloze",), modalities=("t2t",),
                                spec=bytes_sample["spec"], data_dir=bytes_sample["data_dir"],
                                output_dir=str(tmp_path / "out"), tokenizer_dir=bytes_sample["tokenizer"],
                                maxtext_config=RunConfig.parse(TINY_RUN))
  runs = eval_command.run(cfg)
  assert opened == [step]
  assert np.isfinite(runs[0]["tasks"]["sstorycloze"]["t2t"]["positive_loss"])
