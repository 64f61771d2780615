"""GLM-4-Voice's WhisperVQ speech tokenizer in JAX, held to what the upstream PyTorch code (THUDM/GLM-4-Voice
`speech_tokenizer`, extract_speech_token) computed on a tiny random model in the release's layout:
../shared/upstream-oracles/glm4voice_tokenizer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tasks.audio.glm4_voice import Glm4VoiceError, Glm4VoiceTokenizer
from tasks.audio.weights import WeightsError

ORACLE = Path(__file__).resolve().parents[1].parent / "shared" / "upstream-oracles" / "glm4voice_tokenizer"
pytestmark = pytest.mark.skipif(not ORACLE.is_dir(), reason=f"the upstream oracle folder {ORACLE} is absent")
WAVES = (0, 1, 2)
RELEASE_FILES = ("config.json", "preprocessor_config.json")


def wave(i: int) -> np.ndarray:
  return np.load(ORACLE / "inputs" / f"wave{i}.npy")


def upstream(name: str) -> np.ndarray:
  return np.load(ORACLE / "outputs" / f"{name}.npy")


def assert_close(ours: np.ndarray, reference: np.ndarray, what: str):
  assert ours.shape == reference.shape, f"{what}: shape {ours.shape}, upstream {reference.shape}"
  error = float(np.abs(ours - reference).max() / np.abs(reference).max())
  assert error <= 1e-4, f"{what}: max error {error:.2e} of upstream's largest magnitude"


def copy_release(folder: Path, tensors: dict[str, np.ndarray]) -> str:
  from safetensors.numpy import save_file

  folder.mkdir()
  for name in RELEASE_FILES:
    shutil.copy(ORACLE / name, folder / name)
  save_file(tensors, str(folder / "model.safetensors"))
  return str(folder)


def release_tensors() -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file

  return load_file(str(ORACLE / "model.safetensors"))


@pytest.fixture(scope="module")
def tokenizer():
  return Glm4VoiceTokenizer(str(ORACLE))


@pytest.fixture(scope="module")
def batched(tokenizer):
  """The three waves (1.3, 4.7 and 9.1 s) through the forward in one padded batch, each cut to its own frames:
  every comparison with upstream's solo calls below is also one of batch invariance."""
  return tokenizer.intermediates([wave(i) for i in WAVES])


@pytest.mark.parametrize("i", WAVES)
def test_mel_and_its_mask_are_the_feature_extractors_of_the_wave_padded_to_1280_samples(batched, i):
  assert_close(batched[i]["mel"], upstream(f"mel_solo_wave{i}"), f"wave{i} mel")
  np.testing.assert_array_equal(batched[i]["mel_valid"], upstream(f"mel_mask_solo_wave{i}"))


@pytest.mark.parametrize("i", WAVES)
def test_layer_inputs_outputs_and_pooled_states_are_upstreams(batched, i):
  for name in ("layer0_input", "layer0_output", "layer1_output", "prequant"):
    assert_close(batched[i][name], upstream(f"{name}_solo_wave{i}"), f"wave{i} {name}")


@pytest.mark.parametrize("i", WAVES)
def test_codes_are_upstreams_of_each_wave_alone(batched, i):
  np.testing.assert_array_equal(batched[i]["codes"], upstream(f"codes_solo_wave{i}"))


def test_encode_pads_to_a_bucket_and_the_device_count_and_keeps_the_codes(tokenizer):
  # the runner lays wave0's 136 frames in a 144-frame bucket, beside 7 empty rows (one per host device)
  np.testing.assert_array_equal(tokenizer.encode(wave(0), "wave0"), upstream("codes_solo_wave0")[:, None])


def test_empty_audio_gives_no_codes(tokenizer):
  assert tokenizer.encode(np.zeros(0, np.float32), "empty").shape == (0, 1)


@pytest.mark.slow
def test_codes_of_the_three_waves_in_one_call_are_upstreams_batched_call(tokenizer):
  for i, codes in enumerate(tokenizer.encode_batch([wave(i) for i in WAVES])):
    np.testing.assert_array_equal(codes, upstream(f"codes_joint_wave{i}")[:, None])


def test_a_training_checkpoint_under_model_encoder_gives_the_same_weights_and_codes(tmp_path, tokenizer):
  tensors = {"model.encoder." + key: value for key, value in release_tensors().items()}
  # a training checkpoint holds the whole model: the encoder's final norm and the decoder are not read
  tensors["model.encoder.layer_norm.weight"] = np.ones(64, np.float32)
  tensors["model.decoder.embed_tokens.weight"] = np.zeros((8, 64), np.float32)
  prefixed = Glm4VoiceTokenizer(copy_release(tmp_path / "training", tensors))
  assert prefixed.identity() == tokenizer.identity()
  for i, states in zip(WAVES, prefixed.intermediates([wave(i) for i in WAVES])):
    np.testing.assert_array_equal(states["codes"], upstream(f"codes_solo_wave{i}"))


@pytest.mark.parametrize("key, change", [("layers.1.fc1.weight", "drop"), ("codebook.weight", "reshape")])
def test_a_missing_or_misshapen_tensor_is_refused_by_name(tmp_path, key, change):
  tensors = release_tensors()
  if change == "drop":
    del tensors[key]
  else:
    tensors[key] = tensors[key][1:]
  with pytest.raises(WeightsError, match=key.replace(".", r"\.")):
    Glm4VoiceTokenizer(copy_release(tmp_path / "broken", tensors))


@pytest.mark.parametrize("setting", [{"pooling_type": "conv"}, {"encoder_causal_attention": True},
                                     {"encoder_causal_convolution": False}, {"pooling_position": 1}])
def test_a_config_switch_this_port_does_not_implement_is_refused_by_name(tmp_path, setting):
  folder = tmp_path / "release"
  folder.mkdir()
  shutil.copy(ORACLE / "preprocessor_config.json", folder)
  config = json.loads((ORACLE / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, **setting}))
  with pytest.raises(Glm4VoiceError, match=next(iter(setting))):
    Glm4VoiceTokenizer(str(folder))


def test_from_settings_reads_the_tokenizer_folder_and_the_dtype():
  where = lambda path: os.path.join(str(ORACLE), path)
  tokenizer = Glm4VoiceTokenizer.from_settings({"dtype": "bfloat16"}, where)
  assert (tokenizer.dtype, tokenizer.frame_rate, tokenizer.codebook_sizes) == ("bfloat16", 12.5, (128,))
  assert tokenizer.identity()["type"] == "glm4_voice"
  assert Glm4VoiceTokenizer.from_settings({"model_dir": "."}, where).dtype == "float32"


@pytest.mark.slow
def test_audio_over_30_s_is_the_concatenation_of_its_30_s_segments(tokenizer):
  """34.6 s: a 30 s segment (1500 frames, the whole position table; its bucket reaches past it) and 4.6 s."""
  long = np.concatenate([wave(2), wave(2), wave(2), wave(1), wave(0), wave(0)])
  pieces = [long[:30 * 16000], long[30 * 16000:]]
  expected = np.concatenate([states["codes"] for states in tokenizer.intermediates(pieces)])
  assert len(expected) == 375 + 58
  np.testing.assert_array_equal(tokenizer.encode(long, "long")[:, 0], expected)
