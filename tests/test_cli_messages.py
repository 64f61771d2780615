"""What a newcomer meets first: `--verbosity` (named by every error's hint) in each command's `--help`, eval's usage
listing the registry's tasks, the `text` / `speech` aliases in `s2sjax.check` as in eval, and a missing checkpoint
said before missing data."""

import subprocess
import sys

import pytest

from tasks.preparation import prepare
from tests.eval_fixtures import tiny_checkpoint

pytestmark = pytest.mark.slow  # each runs commands as subprocesses (seconds of imports each)


def _run(*args, timeout=300):
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", ["s2sjax.eval", "s2sjax.check", "tasks.prepare"])
def test_help_lists_verbosity(command):
  shown = _run(command, "--help")  # absl exits 1 after the help text
  assert "Try --helpfull" in shown.stdout and "--verbosity" in shown.stdout, shown.stdout + shown.stderr


def test_eval_help_lists_every_task_of_the_registry():
  from s2sjax import benchmarks

  shown = _run("s2sjax.eval", "--help")
  assert f"--task={'|'.join(benchmarks.names())}|all " in shown.stdout, shown.stdout + shown.stderr
  assert "SmolLM2-135M-Instruct" in shown.stdout and "S2SJAX_CACHE" in shown.stdout


def test_a_missing_checkpoint_is_said_before_missing_data(tmp_path):
  failed = _run("s2sjax.eval", "--task=scmmlu", "--modality=speech", f"--checkpoint={tmp_path / 'nonexistent'}",
                f"--data_dir={tmp_path / 'empty'}", f"--output_dir={tmp_path / 'out'}")
  assert failed.returncode == 1
  assert f"error: --checkpoint {tmp_path / 'nonexistent'} does not exist" in failed.stderr, failed.stderr
  assert "no built data" not in failed.stderr


def test_check_takes_the_modality_aliases_eval_takes(tmp_path, qwen_tokenizer_dir):
  ckpt = tiny_checkpoint(str(tmp_path), qwen_tokenizer_dir)
  data_dir = str(tmp_path / "data")
  prepare("scmmlu", "demo", "s2t", 1024, data_dir, tokenizer_dir=qwen_tokenizer_dir)
  common = ["s2sjax.check", f"--checkpoint={ckpt}", f"--data_dir={data_dir}", "--task=scmmlu", "--spec=demo",
            "--row_length=1024"]
  by_name, by_alias = _run(*common, "--modality=s2t"), _run(*common, "--modality=speech")
  assert "scmmlu/s2t fits the model" in by_name.stdout, by_name.stdout + by_name.stderr
  assert (by_alias.returncode, by_alias.stdout) == (by_name.returncode, by_name.stdout), by_alias.stderr
