"""launch/gpu_check.sh --smoke: the device check's one table on a CPU, tiny shapes: a measured line per tokenizer
and for the scoring step, an extrapolated line per task x modality and for the whole benchmark, the figures
consistent with the replica's manifest."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tasks.audio import replica_lengths

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # four tokenizer processes and a scoring step: about a minute and a half on two cores
def test_the_smoke_check_prints_one_table_of_measured_and_extrapolated_lines(tmp_path):
  done = subprocess.run(["bash", "launch/gpu_check.sh", "--smoke", "--recordings=3", f"--output={tmp_path / 'c.json'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, WHEELS_DIR=str(tmp_path / "no-wheels")))
  assert done.returncode == 0, done.stderr[-3000:]
  lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
  assert lines[0] == "| what | how | figures | replica minutes |"
  tokenizers = [line for line in lines if line.startswith("| tokenizer ")]
  assert len(tokenizers) == 4 and all("| measured: 3 recordings" in line for line in tokenizers)
  assert sum(line.startswith("| scoring step tiny") and "| measured |" in line for line in lines) == 1
  assert sum("| extrapolated at the measured tokens/s |" in line for line in lines) == 16  # 4 tasks x 4 modalities
  figures = json.loads((tmp_path / "c.json").read_text())
  assert all(t["programs"] <= 4 for t in figures["tokenizers"])
  assert figures["whole_minutes"] == pytest.approx(max(figures["tokenizer_minutes"].values())
                                                   + sum(figures["scoring_minutes"].values()))
  # by hand: sStoryCloze T->T is its texts' characters (seconds / 0.057 s a character) at 0.25 tokens each
  manifest = replica_lengths.load()
  seconds = sum(s * n for role in ("prefixes", "candidates") for s, n in manifest["bins"][f"sstorycloze/{role}"])
  rate = figures["step"]["tokens_per_s"]
  assert figures["scoring_minutes"]["sstorycloze/t2t"] == pytest.approx(seconds / 0.057 * 0.25 / rate / 60)
