"""The JAX audio tokenizers' shape policies (tasks/audio/jax_tokenizer.py): fixed windows give every code that
length buckets give, and upstream's (the oracles in ../shared/upstream-oracles), in at most WINDOWS programs; the
replica's length manifest they are tried on; and what `tasks.audio.tokenize` says it compiled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tasks.audio import replica_lengths
from tasks.audio.jax_tokenizer import WINDOWS, window_seconds
from tests.test_audio_runner import RunningMeanTokenizer

ROOT = Path(__file__).resolve().parents[1]
ORACLES = ROOT.parent / "shared" / "upstream-oracles"
GLM = ORACLES / "glm4voice_tokenizer"
BAICHUAN = ORACLES / "baichuan_audio_tokenizer"
needs_oracles = pytest.mark.skipif(not ORACLES.is_dir(), reason=f"the upstream oracle folder {ORACLES} is absent")


class CausalMeanTokenizer(RunningMeanTokenizer):
  """The runner test's toy taking a whole recording at once (no model window, as Mimi and HuBERT)."""

  segment_samples = None


def by_hand(wave):
  energy = (wave[: len(wave) // 4 * 4].reshape(-1, 4) ** 2).mean(-1)
  mean = np.cumsum(energy) / np.arange(1, len(energy) + 1)
  return np.abs(mean[:, None] - np.array([0.0, 0.5, 1.0])).argmin(-1).astype(np.int32)[:, None]


def test_windows_are_geometric_from_the_floor_to_the_models_window():
  # 2 s to 30 s in 3 steps of 15^(1/3) = 2.466
  np.testing.assert_allclose(window_seconds(30.0), [2.0, 4.932, 12.164, 30.0], rtol=1e-3)
  assert window_seconds(1.5) == [1.5]


@pytest.mark.slow  # a dozen bucket shapes compiled
def test_windows_give_the_buckets_codes_in_at_most_four_programs():
  rng = np.random.default_rng(0)
  lengths = (replica_lengths.sample(16, seed=1) * CausalMeanTokenizer.sample_rate).astype(int) + 1
  waves = [rng.uniform(-1.2, 1.2, n).astype(np.float32) for n in lengths]
  windows = CausalMeanTokenizer().configure(shapes="windows")
  windows.batch_frames = 256  # several batches per window, each padded with empty rows to its full count
  buckets = CausalMeanTokenizer().configure(shapes="buckets")
  for wave, a, b in zip(waves, windows.encode_batch(waves), buckets.encode_batch(waves)):
    np.testing.assert_array_equal(a, by_hand(wave))
    np.testing.assert_array_equal(b, a)
  # the longest drawn is under 64 s: windows 2, 5.04, 12.7 and 32 or 64 s
  assert windows.run_report()["programs"] <= WINDOWS < buckets.run_report()["programs"]
  assert windows.policy == "windows" and CausalMeanTokenizer().policy == "buckets"  # auto on a CPU


def test_a_caller_that_gives_waves_in_chunks_gets_the_same_windows():
  tokenizer = CausalMeanTokenizer().configure(shapes="windows")
  tokenizer.expected_longest_samples = 16 * 100  # 100 s: windows up to 128 s, whatever each call's longest
  for seconds in (3, 40):
    tokenizer.encode_batch([np.full(16 * seconds, 0.6, np.float32)])
  assert sorted(shape[1] for shape in tokenizer.runner.programs) == [
      n // 4 // 2 * 2 for n in (round(16 * 2 * 64 ** (1 / 3)), 16 * 128)]  # 5.04 s and 128 s of 4-sample frames


@needs_oracles
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["glm4_voice", "baichuan_audio"])
def test_whisper_windows_give_upstreams_codes(kind):
  """Upstream's own codes of the oracle's three waves (1.3, 4.7, 9.1 s) with each padded to a fixed window, and a
  70 s recording (three 30 s segments) the same under windows as under buckets."""
  from tasks import audio

  folder = GLM if kind == "glm4_voice" else BAICHUAN
  tokenizer = audio.from_spec({"type": kind}, None, str(folder), shapes="windows")
  waves = [np.load(folder / "inputs" / f"wave{i}.npy") for i in range(3)]
  for i, codes in enumerate(tokenizer.encode_batch(waves)):
    expected = np.load(folder / "outputs" / f"codes_solo_wave{i}.npy")
    np.testing.assert_array_equal(codes, expected.reshape(codes.shape))
  long = np.concatenate([np.tile(np.concatenate(waves), 4)[: 70 * 16000]])
  buckets = audio.from_spec({"type": kind}, None, str(folder), shapes="buckets")
  np.testing.assert_array_equal(tokenizer.encode(long, "long"), buckets.encode(long, "long"))
  assert tokenizer.run_report()["programs"] <= WINDOWS


def test_the_manifest_is_the_replicas_recordings():
  manifest = replica_lengths.load()
  every = replica_lengths.durations(manifest)
  # the importer speaks each distinct prefix and candidate once: 1,870 + 3,733 (en), 1,871 + 3,737 (zh stories),
  # 8,539 + 28,956 (CMMLU statements' first halves and options)
  assert len(every) == manifest["recordings"] == 48_706
  assert {key: sum(n for _, n in rows) for key, rows in manifest["bins"].items()}["sstorycloze/prefixes"] == 1870
  rounded_up = every.sum() / 3600 - manifest["audio_hours"]  # each recording to its bin's upper edge
  assert -0.05 <= rounded_up <= len(every) * manifest["bin_seconds"] / 3600
  drawn = replica_lengths.sample(200, seed=0)
  assert len(drawn) == 200 and set(drawn) <= set(every)


@pytest.mark.skipif(not (ROOT.parent / "shared" / "realdata").is_dir(), reason="../shared/realdata is absent")
def test_the_manifest_is_made_from_the_public_sources(tmp_path):
  """The shipped manifest is what the command makes from the public texts (the zh stories alone here: quick)."""
  zh = ROOT.parent / "shared" / "realdata" / "xstorycloze"
  done = subprocess.run([sys.executable, "-m", "tasks.audio.replica_lengths", f"--output={tmp_path / 'm.json'}",
                         "--xstorycloze_zh=" + ",".join(str(zh / f"spring2016.val.zh.tsv.split_20_80_{s}.tsv")
                                                         for s in ("train", "eval"))],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  made = replica_lengths.load(str(tmp_path / "m.json"))
  shipped = replica_lengths.load()
  for role in ("prefixes", "candidates"):
    assert made["bins"][f"zh_sstorycloze/{role}"] == shipped["bins"][f"zh_sstorycloze/{role}"]


def tokenize(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "tasks.audio.tokenize", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=900, env=dict(os.environ, **(env or {})))


def replica_recordings(folder: Path, sample_rate: int, count: int = 200) -> Path:
  """`count` noise recordings whose lengths are drawn from the replica's manifest."""
  folder.mkdir()
  seconds = replica_lengths.sample(count, seed=0)
  for n, wave in enumerate(replica_lengths.synthetic_waves(seconds, sample_rate)):
    soundfile.write(folder / f"r{n:03d}.wav", wave, sample_rate, subtype="FLOAT")
  return folder


COMPILED = re.compile(r"compiled (\d+) tokenizer programs in [\d.,]+s, (\d+) loaded from the compilation cache "
                      r"\((\d+) shapes, (\w+)\)")


def oracle_recordings(folder: Path, oracle: Path, count: int = 200) -> Path:
  """`count` recordings: the oracle's three waves and noise of the replica's lengths."""
  replica_recordings(folder, 16000, count - 3)
  for i in range(3):
    soundfile.write(folder / f"oracle{i}.wav", np.load(oracle / "inputs" / f"wave{i}.npy"), 16000, subtype="FLOAT")
  return folder


def assert_oracle_codes(codes_folder: Path, oracle: Path) -> None:
  for i in range(3):
    expected = np.load(oracle / "outputs" / f"codes_solo_wave{i}.npy")
    np.testing.assert_array_equal(np.load(codes_folder / f"oracle{i}.npy"), expected.reshape(len(expected), -1))


def windows_run(tokenizer: str, oracle: Path, recordings: Path, output: Path, env: dict | None = None
                ) -> tuple[int, int, int]:
  """`tasks.audio.tokenize --shapes=windows`: (programs compiled, loaded from the cache, shapes) from its summary
  line, which must say windows."""
  done = tokenize(f"--audio_tokenizer={tokenizer}", f"--audio_tokenizer_dir={oracle}", f"--input={recordings}",
                  f"--output={output}", "--shapes=windows", env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  compiled, loaded, shapes, policy = COMPILED.search(done.stdout).groups()
  assert policy == "windows" and int(compiled) + int(loaded) == int(shapes)
  return int(compiled), int(loaded), int(shapes)


@needs_oracles
@pytest.mark.slow
def test_replica_lengths_compile_at_most_four_programs_with_the_buckets_codes(tmp_path):
  """200 recordings of the replica's lengths, the accelerator policy forced on a CPU: GLM-4-Voice compiles at most
  4 programs (the summary line says so), the oracle's waves among them upstream's codes; every fifth recording and
  the oracle's, tokenized by buckets (one program a length bucket: ~25 here, 61 for all 200, each a second or two
  of compiling), give the same codes as the windows run."""
  recordings = oracle_recordings(tmp_path / "in", GLM)
  assert windows_run("glm4_voice", GLM, recordings, tmp_path / "windows")[2] <= 4
  assert_oracle_codes(tmp_path / "windows", GLM)
  drawn = tmp_path / "drawn"
  drawn.mkdir()
  names = sorted(recordings.glob("r*.wav"))[::5] + sorted(recordings.glob("oracle*.wav"))
  for wav in names:
    os.link(wav, drawn / wav.name)
  buckets = tokenize("--audio_tokenizer=glm4_voice", f"--audio_tokenizer_dir={GLM}", f"--input={drawn}",
                     f"--output={tmp_path / 'buckets'}", "--shapes=buckets", f"--compare={tmp_path / 'windows'}")
  assert buckets.returncode == 0, buckets.stderr[-3000:]
  assert int(COMPILED.search(buckets.stdout).group(3)) > 4
  assert re.search(rf"compare: ([\d,]+)/\1 frames equal, {len(names)}/{len(names)} files identical",
                   buckets.stdout), buckets.stdout


@needs_oracles
@pytest.mark.slow
def test_baichuan_on_replica_lengths_compiles_at_most_four_programs_and_a_rerun_none(tmp_path):
  """Baichuan-Audio's 200 recordings in at most 4 programs with upstream's codes on the oracle's waves; the same
  command again (codes kept, so one new recording is all it tokenizes) loads its program from the persistent
  compilation cache and compiles none."""
  recordings = oracle_recordings(tmp_path / "in", BAICHUAN)
  cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")}
  compiled, loaded, shapes = windows_run("baichuan_audio", BAICHUAN, recordings, tmp_path / "codes", env=cache)
  assert shapes <= 4 and (compiled, loaded) == (shapes, 0)
  assert_oracle_codes(tmp_path / "codes", BAICHUAN)
  (tmp_path / "codes" / "oracle1.npy").unlink()
  assert windows_run("baichuan_audio", BAICHUAN, recordings, tmp_path / "codes", env=cache)[:2] == (0, 1)
  assert_oracle_codes(tmp_path / "codes", BAICHUAN)
