"""`python -m tasks.audio.tokenize`: a folder of recordings to `<stem>.npy` codes with a registered tokenizer,
here GLM-4-Voice's on the upstream oracle's folder and waves, its codes held to upstream's; bad files named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT.parent / "shared" / "upstream-oracles" / "glm4voice_tokenizer"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ORACLE.is_dir(), reason="../shared/upstream-oracles is absent")]


def tokenize(*args):
  return subprocess.run([sys.executable, "-m", "tasks.audio.tokenize", "--audio_tokenizer=glm4_voice",
                         f"--audio_tokenizer_dir={ORACLE}", *args], cwd=str(ROOT), capture_output=True, text=True,
                        timeout=600)


@pytest.fixture(scope="module")
def wavs(tmp_path_factory):
  """The oracle's three waves as a user's recordings: 16 kHz mono, one of them stereo, and upstream's codes."""
  folder, expected = tmp_path_factory.mktemp("wavs"), tmp_path_factory.mktemp("upstream")
  for n in range(3):
    wave = np.load(ORACLE / "inputs" / f"wave{n}.npy")
    soundfile.write(folder / f"utt{n}.wav", np.stack([wave, wave], 1) if n == 2 else wave, 16000, subtype="FLOAT")
    np.save(expected / f"utt{n}.npy", np.load(ORACLE / "outputs" / f"codes_solo_wave{n}.npy"))
  return folder, expected


def test_a_folder_becomes_upstreams_codes_and_a_summary(wavs, tmp_path):
  folder, expected = wavs
  done = tokenize(f"--input={folder}", f"--output={tmp_path}", f"--compare={expected}")
  assert done.returncode == 0, done.stderr[-2000:]
  for n in range(3):
    codes = np.load(tmp_path / f"utt{n}.npy")
    assert codes.dtype == np.int32 and codes.ndim == 2 and codes.shape[1] == 1
    np.testing.assert_array_equal(codes[:, 0], np.load(expected / f"utt{n}.npy"))
  summary = json.loads((tmp_path / "tokenize.json").read_text())
  assert summary["files"] == 3 and summary["mixed_down"] == 1 and summary["resampled"] == 0
  assert summary["compare"]["files_equal"] == 3 and summary["tokenizer"]["type"] == "glm4_voice"
  assert "compare: 190/190 frames equal, 3/3 files identical" in done.stdout


def test_a_cut_file_stops_the_run_naming_it_or_is_skipped_and_listed(wavs, tmp_path):
  folder, _ = wavs
  bad = tmp_path / "in"
  bad.mkdir()
  for name in os.listdir(folder):
    (bad / name).write_bytes((folder / name).read_bytes())
  data = (bad / "utt1.wav").read_bytes()
  (bad / "utt1.wav").write_bytes(data[: len(data) // 2])
  done = tokenize(f"--input={bad}", f"--output={tmp_path / 'out'}")
  assert done.returncode == 1 and "utt1.wav is cut: its header promises" in done.stderr
  assert not (tmp_path / "out" / "utt0.npy").exists()  # nothing is written from a run that stopped
  done = tokenize(f"--input={bad}", f"--output={tmp_path / 'out'}", "--skip_bad")
  assert done.returncode == 0, done.stderr[-2000:]
  summary = json.loads((tmp_path / "out" / "tokenize.json").read_text())
  assert summary["files"] == 2 and list(summary["skipped"]) == ["utt1.wav"] and "skipped 1" in done.stdout


def test_an_unknown_type_and_a_missing_folder_are_one_line_each(tmp_path):
  done = subprocess.run([sys.executable, "-m", "tasks.audio.tokenize", "--audio_tokenizer=whisper",
                         f"--input={tmp_path}", f"--output={tmp_path}"], cwd=str(ROOT), capture_output=True, text=True)
  assert done.returncode == 1 and "unknown audio tokenizer 'whisper'; audio tokenizers: precomputed" in done.stderr
  done = tokenize(f"--input={tmp_path / 'nope'}", f"--output={tmp_path}")
  assert done.returncode == 1 and "nope is not a folder" in done.stderr
