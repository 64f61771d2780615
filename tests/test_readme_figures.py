"""The README's figures held to what they describe, so that they cannot drift: its test counts (every test, and
those `-m "not slow"` runs) to what pytest collects, and the main job's console lines to what the job prints when
run as the README shows it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a collection of the whole suite; the main job

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _environment(**extra) -> dict[str, str]:
  """This process's environment for a child, without what pytest (or an xdist worker) set for itself, and with
  the project importable from any working directory."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  return {**env, **extra}


def _collected_counts(session) -> tuple[int, int] | None:
  """(not slow, all) of this session's collection when it is the whole suite unfiltered (every test file, no -k,
  -m or --deselect), as `pytest --collect-only -m "not slow"` would count them; None for a part of it."""
  option = session.config.option
  files = {item.path for item in session.items}
  if option.keyword or option.markexpr or option.deselect or files != set((ROOT / "tests").glob("test_*.py")):
    return None
  return sum(item.get_closest_marker("slow") is None for item in session.items), len(session.items)


def test_the_readmes_test_counts_are_what_the_suite_collects(request):
  said = re.search(r"\((\d+) of (\d+) tests\)", README)
  assert said, "the README gives no test counts"
  counts = _collected_counts(request.session)
  if counts is None:  # this session holds a part of the suite: collect the whole of it
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "-m", "not slow"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                               env=_environment())
    found = re.search(r"^(\d+)/(\d+) tests collected", collected.stdout, re.M)
    assert found, collected.stdout[-3000:] + collected.stderr[-3000:]
    counts = int(found.group(1)), int(found.group(2))
  assert (int(said.group(1)), int(said.group(2))) == counts, (
    f"the README says {said.group(0)}; the suite collects {counts[1]} tests, {counts[0]} not slow")


def _readme_block_after(command: str) -> list[str]:
  """The lines of the README's code block that follows the block holding `command`: what it prints."""
  blocks = re.findall(r"```\w*\n(.*?)```", README, re.S)
  index = next(i for i, block in enumerate(blocks) if command in block)
  return blocks[index + 1].splitlines()


def test_the_main_job_prints_the_readmes_lines(tmp_path):
  command = "python -m s2sjax.eval --task=sstorycloze --modality=speech"
  assert command in README
  printed = _readme_block_after(command)
  # the embedded default: the session's cache (tests/conftest.py), converted and built there on first use
  run = subprocess.run([sys.executable, *command.split()[1:]], cwd=tmp_path, capture_output=True, text=True,
                       timeout=1800, env=_environment())
  assert run.returncode == 0, run.stderr[-3000:]
  untimed = lambda line: re.sub(r" \(\d+(\.\d+)?s\)$", "", line)  # the result line's seconds are the machine's
  result = [untimed(line) for line in printed if ": accuracy " in line]
  assert result and result == [untimed(line) for line in run.stdout.splitlines() if ": accuracy " in line]
  assert printed[-1] == run.stdout.splitlines()[-1]  # where the results are
