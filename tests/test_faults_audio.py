"""Recordings and codes that are not what they claim (non-finite or far out-of-range samples, a header's
rate no recording has, codes that are not integers of the codebook), entries of an audio folder that are not
files, and a codes folder made by another tokenizer: each refused naming the file, or (--skip_bad) its question
left out and listed; every resampling reported from -> to. A stopped `tasks.audio.tokenize` resumed by
the same command."""

import collections
import json
import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from s2sjax.data import task_registry
from tasks.audio import base
from tasks.audio.base import AudioError, folder_digest, load_audio
from tasks.audio.precomputed import PrecomputedTokenizer
from tasks.audio.tokenize import TokenizeError, output_plan

ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT / "tasks" / "sample" / "release" / task_registry.get("sstorycloze").release_audio_dir / "0.wav"


def _speech() -> np.ndarray:
  wave, rate = soundfile.read(SPEECH, dtype="float32")
  assert rate == 16000
  return wave


def _with_rate(source: Path, target: Path, rate: int) -> Path:
  """`source`'s bytes with the fmt chunk's sample rate (and byte rate) set to `rate`: a damaged header."""
  data = bytearray(source.read_bytes())
  assert data[12:16] == b"fmt "
  channels, width = struct.unpack_from("<H", data, 22)[0], struct.unpack_from("<H", data, 34)[0] // 8
  struct.pack_into("<II", data, 24, rate, rate * channels * width)
  target.write_bytes(bytes(data))
  return target


def _bad_recordings(folder: Path) -> dict[str, str]:
  """name -> what the refusal says, for a recording of each kind a careless or hostile release holds."""
  wave = _speech()
  nan, inf = wave.copy(), wave.copy()
  nan[1600:1700] = np.nan
  inf[3200] = -np.inf
  soundfile.write(folder / "nan.wav", nan, 16000, subtype="FLOAT")
  soundfile.write(folder / "inf.wav", inf, 16000, subtype="FLOAT")
  soundfile.write(folder / "loud.wav", wave / np.abs(wave).max() * 1e6, 16000, subtype="FLOAT")
  for name, rate in (("rate1", 1), ("rate2g", 2_000_000_000), ("rate0", 0)):
    _with_rate(SPEECH, folder / f"{name}.wav", rate)
  return {"nan.wav": r"holds non-finite samples \(NaN or ±Inf\): 100, the first at 0\.100 s",
          "inf.wav": r"holds non-finite samples \(NaN or ±Inf\): 1, the first at 0\.200 s",
          "loud.wav": r"peaks at 1e\+06, far outside full scale ±1",
          "rate1.wav": r"claims a sample rate of 1 Hz: no recording has one outside 4,000-384,000 Hz",
          "rate2g.wav": r"claims a sample rate of 2,000,000,000 Hz",
          "rate0.wav": r"claims a sample rate of 0 Hz"}


def test_recordings_that_are_not_what_they_claim_are_refused_naming_the_file(tmp_path):
  for name, message in _bad_recordings(tmp_path).items():
    with pytest.raises(AudioError, match=rf"audio file .*/{name} {message}"):
      load_audio(str(tmp_path / name), 16000)
  (tmp_path / "folder.wav").mkdir()
  os.mkfifo(tmp_path / "fifo.wav")  # reading it would wait for a writer forever
  (tmp_path / "zero.wav").symlink_to("/dev/zero")  # reading it would never end
  for name in ("folder.wav", "fifo.wav", "zero.wav"):
    with pytest.raises(AudioError, match=rf"audio file .*/{name} is not a regular file"):
      load_audio(str(tmp_path / name), 16000)
  # at the edges of what a recording may hold: full scale and a little over, the lowest and highest rates
  wave = _speech()
  soundfile.write(tmp_path / "over.wav", wave / np.abs(wave).max() * base.PEAK_LIMIT, 16000, subtype="FLOAT")
  assert np.abs(load_audio(str(tmp_path / "over.wav"), 16000)).max() == pytest.approx(base.PEAK_LIMIT)
  for rate in base.SAMPLE_RATES_HZ:
    counts = collections.Counter()
    heard = load_audio(str(_with_rate(SPEECH, tmp_path / f"at{rate}.wav", rate)), 16000, counts)
    assert abs(len(heard) - len(wave) * 16000 / rate) <= 1 and base.resamplings(counts) == {f"{rate}->16000": 1}


def _release(root: Path, recordings: dict[str, Path]) -> Path:
  """An sStoryCloze release of one story per recording (uttids 2k, 2k+1 share the story's recording)."""
  record = task_registry.get("sstorycloze")
  audio_dir = root / record.release_audio_dir
  audio_dir.mkdir(parents=True)
  lines = []
  for k, source in enumerate(recordings.values()):
    for uttid, last in ((f"{2 * k}_s", "He came back."), (f"{2 * k + 1}_s", "Fish sang.")):
      lines.append({"uttid": uttid, "first": "Tom went out.", "last": last})
      (audio_dir / f"{uttid}.wav").write_bytes(source.read_bytes())
  (root / record.release_jsonl).write_text("".join(json.dumps(line) + "\n" for line in lines))
  return audio_dir


@pytest.mark.slow
def test_prepare_skips_a_non_finite_recordings_question_reports_resampling_and_digests_no_fifo(
    tmp_path, qwen_tokenizer_dir):
  """`tasks.prepare` over a release whose audio folder also holds a FIFO, a link to /dev/zero and a folder named
  *.wav (none referenced): it ends (it hung reading the FIFO), names them, refuses the NaN recording by name, and
  with --skip_bad leaves out its story only and reports the 22,050 Hz recording's resampling."""
  sources = tmp_path / "sources"
  sources.mkdir()
  _bad_recordings(sources)
  soundfile.write(sources / "r22k.wav", _speech()[:40000], 22050)
  release = tmp_path / "release"
  audio_dir = _release(release, {"ok": SPEECH, "nan": sources / "nan.wav", "r22k": sources / "r22k.wav"})
  os.mkfifo(audio_dir / "fifo.wav")
  (audio_dir / "zero.wav").symlink_to("/dev/zero")
  (audio_dir / "99.wav").mkdir()
  prepare = lambda *flags: subprocess.run(
      [sys.executable, "-m", "tasks.prepare", "--task=sstorycloze", "--modality=s2t", f"--manual_dir={release}",
       f"--data_dir={tmp_path / 'data'}", f"--tokenizer_dir={qwen_tokenizer_dir}", *flags],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  refused = prepare()
  assert refused.returncode == 1, refused.stderr[-2000:]
  assert re.search(r"error: .*audio file .*/2_s\.wav holds non-finite samples", refused.stderr)
  assert "99.wav (a folder), fifo.wav (not a regular file), zero.wav (not a regular file)" in refused.stderr
  built = prepare("--skip_bad")
  assert built.returncode == 0, built.stderr[-2000:]
  report = json.loads(built.stdout.split("demo-s2t-auto: ", 1)[1].splitlines()[0])
  assert report["questions"] == 2 and report["skipped"] == 1
  assert report["audio_files_resampled"] == 1 and report["audio_resampled_from_to"] == {"22050->16000": 1}
  assert re.search(r"left out question 2_s: .*2_s\.wav holds non-finite samples", built.stdout)


def test_folder_digest_reads_regular_files_only_and_refuses_a_huge_one(tmp_path, caplog):
  (tmp_path / "a.wav").write_bytes(b"abc")
  plain = folder_digest(str(tmp_path), ".wav")
  os.mkfifo(tmp_path / "fifo.wav")
  (tmp_path / "zero.wav").symlink_to("/dev/zero")
  (tmp_path / "gone.wav").symlink_to(tmp_path / "nowhere")
  (tmp_path / "99.wav").mkdir()
  with_others = folder_digest(str(tmp_path), ".wav")
  assert with_others != plain  # the entries count by name and kind, not by what they would yield
  assert "99.wav (a folder), fifo.wav (not a regular file), gone.wav (no such file or directory), zero.wav (not a " \
         "regular file)" in caplog.text
  with open(tmp_path / "huge.wav", "wb") as f:  # sparse: no disk is used
    f.truncate(base.MAX_FILE_BYTES + 1)
  with pytest.raises(AudioError, match=r"huge\.wav is over 4 GiB"):
    folder_digest(str(tmp_path), ".wav")


@pytest.mark.parametrize("codes, message", [
    (np.array([[1.5], [2.0]]), r"holds float64 values that are no codes \(frame 0, codebook 0: 1\.5\)"),
    (np.array([[1.0], [np.nan]], np.float32), r"holds float32 values that are no codes \(frame 1, codebook 0: nan\)"),
    (np.array([[True], [False]]), r"holds bool values: codes are integers"),
    (np.array([[3], [256]], np.uint16), r"holds codes outside the codebook sizes \(256,\) \(frame 1, codebook 0: 256\)"),
    (np.array([["a"], ["b"]]), r"holds <U1 values"),
])
def test_precomputed_codes_are_integers_of_the_codebook_or_the_file_is_refused(tmp_path, codes, message):
  np.save(tmp_path / "u1.npy", codes)
  with pytest.raises(AudioError, match=rf"uttid u1: .*u1\.npy {message}"):
    PrecomputedTokenizer(str(tmp_path), (256,)).encode(None, "u1")


def test_precomputed_codes_files_that_are_no_array_are_refused_and_integral_floats_read(tmp_path):
  tokenizer = PrecomputedTokenizer(str(tmp_path), (256,))
  np.save(tmp_path / "objects.npy", np.array([[{"a": 1}]], dtype=object))  # a pickle: loading it would run code
  np.savez(tmp_path / "archive.npy", codes=np.array([1]))
  os.replace(tmp_path / "archive.npy.npz", tmp_path / "archive.npy")
  (tmp_path / "text.npy").write_text("1 2 3")
  for name, message in (("objects", "is not a .npy array"), ("archive", "is not one .npy array"),
                        ("text", "is not a .npy array")):
    with pytest.raises(AudioError, match=rf"uttid {name}: .*{name}\.npy {message}"):
      tokenizer.encode(None, name)
  np.save(tmp_path / "floats.npy", np.array([3.0, 255.0, 0.0], np.float32))
  codes = tokenizer.encode(None, "floats")
  assert codes.dtype == np.int32 and codes.tolist() == [[3], [255], [0]]


def tokenize(*args):
  return subprocess.run([sys.executable, "-m", "tasks.audio.tokenize", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)


@pytest.mark.slow
def test_tokenize_lists_each_bad_recording_and_reports_resampling(tmp_path):
  recordings = tmp_path / "in"
  recordings.mkdir()
  refusals = _bad_recordings(recordings)
  (recordings / "ok.wav").write_bytes(SPEECH.read_bytes())
  soundfile.write(recordings / "r22k.wav", _speech()[:40000], 22050)
  done = tokenize("--spec=demo", f"--input={recordings}", f"--output={tmp_path / 'codes'}", "--skip_bad")
  assert done.returncode == 0, done.stderr[-2000:]
  summary = json.loads((tmp_path / "codes" / "tokenize.json").read_text())
  assert summary["files"] == 2 and sorted(summary["skipped"]) == sorted(refusals)
  for name, message in refusals.items():
    assert re.search(message, summary["skipped"][name]), (name, summary["skipped"][name])
  assert summary["resampled_from_to"] == {"22050->16000": 1}
  assert "resampled 1 (1 from 22050->16000 Hz)" in done.stdout
  assert sorted(os.listdir(tmp_path / "codes")) == ["ok.npy", "r22k.npy", "tokenize.json"]


@pytest.mark.slow
def test_tokenize_refuses_a_folder_of_other_codes_and_overwrite_replaces_it_whole(tmp_path):
  recordings = tmp_path / "in"
  recordings.mkdir()
  (recordings / "a.wav").write_bytes(SPEECH.read_bytes())
  fresh = tokenize("--spec=demo", f"--input={recordings}", f"--output={tmp_path / 'fresh'}")
  assert fresh.returncode == 0, fresh.stderr[-2000:]
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  np.save(mixed / "a.npy", np.array([[5], [8]]))  # another tokenizer's codes, and one of a recording not here
  np.save(mixed / "stale_other.npy", np.array([[1]]))
  before = {n: (mixed / n).read_bytes() for n in os.listdir(mixed)}
  refused = tokenize("--spec=demo", f"--input={recordings}", f"--output={mixed}")
  assert refused.returncode == 1 and f"error: --output {mixed} holds files but no readable tokenize.json" \
      in refused.stderr
  assert {n: (mixed / n).read_bytes() for n in os.listdir(mixed)} == before
  replaced = tokenize("--spec=demo", f"--input={recordings}", f"--output={mixed}", "--overwrite")
  assert replaced.returncode == 0, replaced.stderr[-2000:]
  assert sorted(os.listdir(mixed)) == ["a.npy", "tokenize.json"] and sorted(os.listdir(tmp_path)) == [
      "fresh", "in", "mixed"]  # nothing left beside it
  np.testing.assert_array_equal(np.load(mixed / "a.npy"), np.load(tmp_path / "fresh" / "a.npy"))
  # the same tokenizer again is a rerun; other settings are another tokenizer's codes
  assert tokenize("--spec=demo", f"--input={recordings}", f"--output={mixed}").returncode == 0
  other = tokenize("--audio_tokenizer=mel_kmeans", "--setting=codebook=bundled", "--setting=dedup=false",
                   f"--input={recordings}", f"--output={mixed}")
  made = json.loads((mixed / "tokenize.json").read_text())["tokenizer"]
  assert other.returncode == 1 and f"holds codes of mel_kmeans (fingerprint {made['fingerprint']}, dtype float32), " \
      "not of this tokenizer (mel_kmeans, fingerprint " in other.stderr


def test_overwrite_replaces_only_a_folder_of_codes(tmp_path):
  made_by = {"type": "mel_kmeans", "fingerprint": "f1", "dtype": "float32"}
  (tmp_path / "tokenize.json").write_text(json.dumps({"tokenizer": dict(made_by, fingerprint="f0")}))
  np.save(tmp_path / "a.npy", np.array([1]))
  assert output_plan(str(tmp_path), made_by, overwrite=True) is True
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(TokenizeError, match=r"holds more than codes \(notes\.txt\): --overwrite replaces only"):
    output_plan(str(tmp_path), made_by, overwrite=True)
  assert output_plan(str(tmp_path / "new"), made_by, overwrite=False) is False


@pytest.mark.slow
def test_an_interrupted_tokenize_is_resumed_by_the_same_command(tmp_path):
  """Ctrl-C while the third recording is tokenized: the two finished codes files are complete and stay; the same
  command keeps them (saying so), tokenizes the other three, and the folder equals one uninterrupted run's. A
  recording changed since its codes were made is tokenized again."""
  from tests.interrupting import interrupt_mid_step

  recordings = tmp_path / "in"
  recordings.mkdir()
  for n in range(5):
    (recordings / f"u{n}.wav").write_bytes((SPEECH.parent / f"{n}.wav").read_bytes())
  command = [sys.executable, "-m", "tasks.audio.tokenize", "--spec=demo", f"--input={recordings}",
             f"--output={tmp_path / 'codes'}", "--chunk_seconds=1"]  # a chunk a recording: written one by one
  code, stderr, _ = interrupt_mid_step(command, 3, signal.SIGINT, cwd=ROOT)
  assert code == 130 and f"stopped by SIGINT: 2 of 5 recordings' codes are in {tmp_path / 'codes'}; rerun the " \
      "same command to tokenize the rest" in stderr
  assert sorted(os.listdir(tmp_path / "codes")) == ["tokenize.json", "u0.npy", "u1.npy"]
  resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "5 files (2 kept from an earlier run)" in resumed.stdout
  whole = tokenize("--spec=demo", f"--input={recordings}", f"--output={tmp_path / 'whole'}")
  assert whole.returncode == 0, whole.stderr[-2000:]
  assert sorted(os.listdir(tmp_path / "codes")) == sorted(os.listdir(tmp_path / "whole"))
  for n in range(5):
    assert (tmp_path / "codes" / f"u{n}.npy").read_bytes() == (tmp_path / "whole" / f"u{n}.npy").read_bytes()
  summary = json.loads((tmp_path / "codes" / "tokenize.json").read_text())
  assert summary["complete"] and summary["files"] == 5 and summary["kept"] == 2
  (recordings / "u4.wav").write_bytes((SPEECH.parent / "6.wav").read_bytes())  # another recording under its name
  again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0 and "5 files (4 kept from an earlier run)" in again.stdout
  assert (tmp_path / "codes" / "u4.npy").read_bytes() != (tmp_path / "whole" / "u4.npy").read_bytes()
