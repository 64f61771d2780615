"""What a newcomer meets first: `--help` exiting 0 for every command line, with `--verbosity` (named by every error's
hint) in its usage; eval's usage listing the registry's tasks; the `text` / `speech` aliases in `s2sjax.check` as
in eval; and a missing checkpoint said before missing data."""

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each runs commands as subprocesses (seconds of imports each)

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAIN_BLOCK = 'if __name__ == "__main__":'


def _run(*args, timeout=300):
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)


def command_lines() -> list[str]:
  """Every module run with `python -m` (one that ends in a `__main__` block), by the name users run it under: an
  entry point of s2sjax/commands/ kept at its name by an alias (s2sjax.eval, tasks.prepare) under the alias's."""
  names = sorted(".".join(path.relative_to(ROOT).with_suffix("").parts)
                 for package in ("s2sjax", "tasks", "checkpoints_conversion", "launch")
                 for path in (ROOT / package).rglob("*.py") if MAIN_BLOCK in path.read_text(encoding="utf-8"))
  aliased = {name.rpartition(".")[2] for name in names if not name.startswith("s2sjax.commands.")}
  return [name for name in names if not (name.startswith("s2sjax.commands.") and name.rpartition(".")[2] in aliased)]


def test_the_command_lines_are_found():
  assert {"s2sjax.eval", "tasks.prepare", "checkpoints_conversion.convert", "s2sjax.check", "s2sjax.plan",
          "s2sjax.logprobs", "s2sjax.bench", "s2sjax.lm_eval", "tasks.audio.tokenize", "tasks.importer",
          "launch.tpu", "s2sjax.commands.default_checkpoint", "s2sjax.examples.two_stage_training"} <= set(command_lines())
  assert "s2sjax.commands.eval" not in command_lines()  # run as s2sjax.eval


@pytest.mark.parametrize("command", command_lines())
def test_help_exits_0_and_lists_verbosity(command):
  shown = _run(command, "--help")  # a script checking an install runs --help: 0 is success
  assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-3000:]
  assert "Traceback" not in shown.stderr, shown.stderr
  if command == "s2sjax.lm_eval":  # lm-eval's own command line (argparse)
    assert "usage:" in shown.stdout and "run" in shown.stdout, shown.stdout
  else:  # absl's usage, with the flag every error's hint names
    assert "Try --helpfull" in shown.stdout and "--verbosity" in shown.stdout, shown.stdout + shown.stderr


def test_eval_help_lists_every_task_of_the_registry():
  from s2sjax.data import task_registry

  shown = _run("s2sjax.eval", "--help")
  assert f"--task={'|'.join(task_registry.names())}|all " in shown.stdout, shown.stdout + shown.stderr
  assert "SmolLM2-135M-Instruct" in shown.stdout and "S2SJAX_CACHE" in shown.stdout


def test_a_missing_checkpoint_is_said_before_missing_data(tmp_path):
  failed = _run("s2sjax.eval", "--task=scmmlu", "--modality=speech", f"--checkpoint={tmp_path / 'nonexistent'}",
                f"--data_dir={tmp_path / 'empty'}", f"--output_dir={tmp_path / 'out'}")
  assert failed.returncode == 1
  assert f"error: --checkpoint {tmp_path / 'nonexistent'} does not exist" in failed.stderr, failed.stderr
  assert "no built data" not in failed.stderr


def test_check_takes_the_modality_aliases_eval_takes(tiny_sample):
  common = ["s2sjax.check", f"--checkpoint={tiny_sample['ckpt']}", f"--data_dir={tiny_sample['data_dir']}",
            "--task=scmmlu", "--spec=demo", "--row_length=1024"]
  # "speech" is eval's alias of s2t: the pre-flight loads and checks the S->T build under it
  by_alias = _run(*common, "--modality=speech")
  assert by_alias.returncode == 0, by_alias.stdout + by_alias.stderr
  assert "scmmlu/s2t fits the model" in by_alias.stdout and by_alias.stdout.endswith("all checks passed\n")
