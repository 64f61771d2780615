"""MiMo-Audio's tokenizer in JAX against what XiaomiMiMo/MiMo-Audio's PyTorch code computed (oracle `mimo_audio`:
a tiny MiMo-Audio-Tokenizer in the release's key names and bf16, three waves): log-mel and every encoder stage
within fp32 error, all 20 code layers equal to upstream's single-wave codes wherever upstream's argmin margin is
above 1e-4; the command line; release-folder errors. Every expected number is read from the oracle folder."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tasks import audio
from tasks.audio.base import AudioError
from tasks.audio.jax_tokenizer import WINDOWS, window_seconds
from tasks.audio.mimo_audio import SEGMENT_FRAMES, MimoAudioTokenizer, MimoTokenizerConfigError, forward, log_mel
from tasks.audio.weights import WeightsError

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT.parent / "shared" / "upstream-oracles" / "mimo_audio"
RELEASE = ORACLE / "model" / "MiMo-Audio-Tokenizer"
pytestmark = pytest.mark.skipif(not ORACLE.is_dir(), reason=f"upstream oracle folder {ORACLE} is absent")
WAVES = range(3)
STAGES = {"conv1_pre_gelu": "conv1_out_pre_gelu", "conv2_pre_gelu": "conv2_out_pre_gelu",
          "final_norm": "enc_final_layer_norm_out", "prequant": "prequant"}


def oracle(name):
  return np.load(ORACLE / "outputs" / f"{name}.npy")


def wave(i):
  return np.load(ORACLE / "inputs" / f"wave{i}.npy")


def assert_close(found, expected, what, tolerance=1e-4):
  error = np.abs(found - expected).max() / np.abs(expected).max()
  assert found.shape == expected.shape and error < tolerance, f"{what}: {found.shape} vs {expected.shape}, {error=}"


def assert_codes_equal_where_decided(codes, i):
  """codes [frames, layers] against upstream's [20, frames], where upstream's argmin margin is above 1e-4."""
  expected, margins = oracle(f"tok_wave{i}_codes_all"), oracle(f"tok_wave{i}_code_margins")
  layers = codes.shape[1]
  assert codes.shape == (expected.shape[1], layers), f"wave{i}: {codes.shape} vs {expected.shape}"
  decided = margins[:layers] > 1e-4
  np.testing.assert_array_equal(codes.T[decided], expected[:layers][decided], err_msg=f"codes of wave{i}")


@pytest.fixture(scope="module")
def tokenizer():
  return MimoAudioTokenizer(str(RELEASE), codebooks=20)


@pytest.fixture(scope="module")
def batch(tokenizer):
  """The three waves' mels in ONE zero-padded batch, through the forward once (every stage)."""
  import jax

  mels = [log_mel(wave(i), tokenizer.config) for i in WAVES]
  features = np.zeros((len(mels), -(-max(map(len, mels)) // 4) * 4, mels[0].shape[1]), np.float32)
  for row, mel in enumerate(mels):
    features[row, : len(mel)] = mel
  lengths = np.array([len(m) for m in mels], np.int32)
  out = jax.jit(lambda p, x, n: forward(p, x, n, tokenizer.config))(tokenizer.params, features, lengths)
  return mels, {k: np.asarray(v) for k, v in out.items()}


def test_mimo_mel_matches_upstream(batch):
  mels, _ = batch
  for i, mel in zip(WAVES, mels):
    assert_close(mel, oracle(f"tok_wave{i}_logmel"), f"log-mel of wave{i}")  # 1 + samples // 240 frames


def test_mimo_encoder_stages_match_upstream_alone_in_a_padded_batch(batch, tokenizer):
  """Rows of one padded batch of three lengths (two odd) each match that wave's alone upstream run at every stage;
  upstream's own packed batch differs there (its batch quirk, held below)."""
  _, out = batch
  for row, i in enumerate(WAVES):
    stages = dict(STAGES, **{f"layer{n}": f"enc_layer{n}_out" for n in range(tokenizer.config.encoder_layers)})
    for ours, theirs in stages.items():
      expected = oracle(f"tok_wave{i}_{theirs}")
      assert_close(out[ours][row, : len(expected)], expected, f"{ours} of wave{i}")
    assert out["code_length"][row] == oracle(f"tok_wave{i}_codes_all").shape[1]
    assert_codes_equal_where_decided(out["codes"][row, : out["code_length"][row]], i)


@pytest.mark.slow
def test_mimo_codes_equal_upstream_single_wave_codes_alone_and_together(tokenizer):
  """encode (one wave) and encode_batch (all three, bucketed together) give upstream's single-wave codes for all
  20 layers. Upstream's packed batch of the same mels gives other codes for the shorter odd-length waves: the
  single-wave codes are the reference."""
  together = tokenizer.encode_batch([wave(i) for i in WAVES])
  batched = oracle("tok_batched_codes_all")
  start = 0
  for i in WAVES:
    assert together[i].dtype == np.int32
    assert_codes_equal_where_decided(together[i], i)
    np.testing.assert_array_equal(together[i], tokenizer.encode(wave(i), f"wave{i}"))
    frames = len(together[i])
    upstream_packed = batched[:, start:start + frames]
    start += frames
    alone = oracle(f"tok_wave{i}_codes_all")
    assert (upstream_packed != alone).sum() == json.loads((ORACLE / "meta.json").read_text())["tokenizer"][
        "batched_vs_alone"][f"wave{i}"]["codes_differing_from_alone"]


def test_mimo_windows_are_mel_frames_up_to_one_encoder_sequence():
  """The windows policy's lengths are the mel frames of its window seconds (up to one SEGMENT_FRAMES piece, the
  longest `segments` gives), at most WINDOWS of them, and the batch sizing knows a frame's bytes."""
  windows = MimoAudioTokenizer(str(RELEASE)).configure(shapes="windows")
  multiple, rate = windows.time_multiple, windows.sample_rate
  top = SEGMENT_FRAMES * windows.config.hop_length / rate
  expected = sorted({-(-min(SEGMENT_FRAMES, len(log_mel(np.zeros(round(s * rate)), windows.config))) // multiple)
                     * multiple for s in window_seconds(top)})
  assert windows.window_lengths(0) == expected and len(expected) <= WINDOWS and expected[-1] == SEGMENT_FRAMES
  assert windows.frame_bytes > 0


@pytest.mark.slow
def test_mimo_codes_under_windows_equal_codes_under_buckets(tokenizer):
  windows = MimoAudioTokenizer(str(RELEASE), codebooks=20).configure(shapes="windows")
  waves = [wave(i) for i in WAVES]
  for found, expected in zip(windows.encode_batch(waves), tokenizer.configure(shapes="buckets").encode_batch(waves)):
    np.testing.assert_array_equal(found, expected)
  assert windows.run_report()["programs"] <= WINDOWS


def test_mimo_llm_codebooks_by_default_from_the_registry_and_a_spec():
  """The registered type gives the LLM's 8 layers unless asked; a spec's codebook count asks for that many."""
  llm = audio.from_spec({"type": "mimo_audio"}, None, str(RELEASE))
  assert isinstance(llm, MimoAudioTokenizer) and llm.num_codebooks == 8 and llm.frame_rate == 25.0
  for i in WAVES:
    assert_codes_equal_where_decided(llm.encode(wave(i), f"wave{i}"), i)
  sizes = tuple(json.loads((RELEASE / "config.json").read_text())["codebook_size"][:3])
  assert audio.from_spec({"type": "mimo_audio"}, sizes, str(RELEASE)).codebook_sizes == sizes


def test_mimo_tokenizer_refuses_bad_folders_and_waves(tmp_path, tokenizer):
  with pytest.raises(AudioError, match="too short for MiMo-Audio"):
    tokenizer.encode_batch([np.zeros(100, np.float32)], ["tiny.wav"])
  for key, value, message in (("ln_type", "RMSNorm", "ln_type='RMSNorm' is not implemented"),
                              ("encoder_causal", True, "encoder_causal=True is not implemented"),
                              ("num_quantizers", 3, "codebook_size names 20 codebooks, num_quantizers 3")):
    folder = tmp_path / key
    shutil.copytree(RELEASE, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, **{key: value})))
    with pytest.raises(MimoTokenizerConfigError, match=message):
      MimoAudioTokenizer(str(folder))
  from checkpoints_conversion import safetensors_io

  release = safetensors_io.SafetensorsFile(str(RELEASE / "model.safetensors"))
  tensors = {key: release.read(key) for key in release.keys()}
  for name, broken, message in (("missing", {"encoder.conv2.weight": None}, "'encoder.conv2.weight' is missing"),
                                ("misshaped", {"encoder.conv1.bias": np.zeros(3, np.float32)},
                                 "'encoder.conv1.bias' has shape \\(3,\\)")):
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(RELEASE / "config.json", folder)
    changed = {key: value for key, value in dict(tensors, **broken).items() if value is not None}
    safetensors_io.write(str(folder / "model.safetensors"), changed)
    with pytest.raises(WeightsError, match=message):
      MimoAudioTokenizer(str(folder))
  with pytest.raises(MimoTokenizerConfigError, match="codebooks 21"):
    MimoAudioTokenizer(str(RELEASE), codebooks=21)


@pytest.mark.slow
def test_mimo_tokenize_command_writes_upstreams_codes(tmp_path):
  import soundfile

  waves, out = tmp_path / "wavs", tmp_path / "codes"
  waves.mkdir()
  for i in WAVES:
    soundfile.write(waves / f"utt{i}.wav", wave(i), 24000, subtype="FLOAT")
  done = subprocess.run([sys.executable, "-m", "tasks.audio.tokenize", "--audio_tokenizer=mimo_audio",
                         f"--audio_tokenizer_dir={RELEASE}", "--setting=codebooks=20", f"--input={waves}",
                         f"--output={out}"], cwd=str(ROOT), capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  for i in WAVES:
    assert_codes_equal_where_decided(np.load(out / f"utt{i}.npy"), i)
