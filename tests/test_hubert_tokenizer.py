"""The JAX HuBERT k-means tokenizer against transformers' HubertModel on tiny random weights: layer-k features of
each wave alone, the nearest-centroid codes, dedup, batch invariance, both weight-norm key spellings, and the errors
that name what is wrong."""

from __future__ import annotations

import functools
import json
import shutil

import jax
import numpy as np
import pytest

from tasks.audio.base import dedup
from tasks.audio.hubert import HubertError, HubertKmeansTokenizer, hidden_states
from tasks.audio.ops import nearest
from tasks.audio.weights import WeightsError

LENGTHS = (1203, 2000, 230)  # samples; 20 samples per frame below: 59, 99 and 11 frames (fewer than the pos kernel)
POS_CONV = "encoder.pos_conv_embed.conv"
UNITS = 12  # every k-means file below has this many centroids: one compiled forward per layer count and shape

# Base-style (group norm on the first conv, post-norm layers, even positional kernel, no conv bias) and large-style
# (layer norm after every conv, pre-norm layers, odd kernel, conv bias, no projection norm).
VARIANTS = {
    "group": dict(feat_extract_norm="group", do_stable_layer_norm=False, num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=4, conv_bias=False),
    "layer": dict(feat_extract_norm="layer", do_stable_layer_norm=True, num_conv_pos_embeddings=9,
                  num_conv_pos_embedding_groups=2, conv_bias=True, feat_proj_layer_norm=False),
}


def _save_model(directory, variant: str, seed: int = 0):
  """A tiny random HubertModel saved as transformers saves it; every weight moved off its init (norms of 1 and 0
  would hide a missing scale or bias), and config's layer_norm_eps unlike the conv norms' fixed 1e-5."""
  import torch
  from transformers import HubertConfig, HubertModel

  torch.manual_seed(seed)
  config = HubertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
                        conv_dim=(16, 24, 16), conv_kernel=(10, 3, 2), conv_stride=(5, 2, 2), layer_norm_eps=1e-3,
                        **VARIANTS[variant])
  model = HubertModel(config).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.add_(0.2 * torch.randn_like(parameter))
  model.save_pretrained(str(directory), safe_serialization=True)
  return model


def _waves(seed: int = 1):
  rng = np.random.default_rng(seed)
  return [(0.3 * rng.standard_normal(n)).astype(np.float32) for n in LENGTHS]


def _reference(model, waves):
  """Every hidden state of each wave run alone: [wave][k] -> [frames, hidden]."""
  import torch

  with torch.no_grad():
    return [[h[0].numpy() for h in model(torch.from_numpy(w)[None], output_hidden_states=True).hidden_states]
            for w in waves]


def _batch(waves, length: int):
  batch = np.zeros((len(waves), length, 1), np.float32)
  for row, wave in enumerate(waves):
    batch[row, : len(wave), 0] = wave
  return batch, np.array([len(w) for w in waves], np.int32)


def _nearest(features: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(codes, margin between the two nearest) in float64."""
  distances = ((features[:, None].astype(np.float64) - centroids[None].astype(np.float64)) ** 2).sum(-1)
  ordered = np.sort(distances, axis=-1)
  return distances.argmin(-1), ordered[:, 1] - ordered[:, 0]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hubert(request, tmp_path_factory):
  directory = tmp_path_factory.mktemp(f"hubert-{request.param}")
  model = _save_model(directory / "hubert", request.param)
  np.save(directory / "random.npy", np.random.default_rng(2).normal(size=(UNITS, 32)).astype(np.float32))
  return directory, _reference(model, _waves())


def _tokenizer(directory, layer: int, centroids="random.npy", deduplicate=False):
  return HubertKmeansTokenizer(str(directory / "hubert"), str(directory / centroids), layer, deduplicate)


@functools.partial(jax.jit, static_argnames="config")
def _forward(params, waves, lengths, config):
  """`HubertKmeansTokenizer.features` and its codes, jitted once for every tokenizer of one config and shape."""
  features = hidden_states(params, waves, lengths, config)
  return features, nearest(features, params["centroids"])


def _features(tokenizer, waves, lengths) -> tuple[np.ndarray, np.ndarray]:
  return tuple(np.asarray(x) for x in _forward(tokenizer.params, waves, lengths, config=tokenizer.config))


@pytest.mark.parametrize("layer", [0, 1, 3])
def test_layer_features_match_transformers_for_each_wave_alone(hubert, layer):
  directory, reference = hubert
  tokenizer = _tokenizer(directory, layer)
  waves = _waves()
  features, _ = _features(tokenizer, *_batch(waves, 3200))  # rows of different lengths: each must read as alone
  for row, (wave, expected) in enumerate(zip(waves, reference)):
    expected = expected[layer]
    assert tokenizer.prepare(wave)[1] == len(expected)
    error = np.abs(features[row, : len(expected)] - expected).max()
    assert error <= 1e-4 * np.abs(expected).max(), (row, error)


def _drawn_centroids(directory, reference, layer: int) -> np.ndarray:
  """Centroids drawn from the reference features themselves (slightly moved), so the codes use many units."""
  frames = np.concatenate([per_wave[layer] for per_wave in reference])
  rng = np.random.default_rng(3)
  centroids = frames[rng.choice(len(frames), UNITS, replace=False)]
  centroids = (centroids + 0.01 * rng.standard_normal(centroids.shape)).astype(np.float32)
  np.save(directory / "drawn.npy", centroids)
  return centroids


def test_codes_are_the_nearest_centroid_of_transformers_features_and_dedup_collapses_runs(hubert):
  directory, reference = hubert
  centroids = _drawn_centroids(directory, reference, 3)
  waves = _waves()
  _, codes = _features(_tokenizer(directory, 3, "drawn.npy"), *_batch(waves, 3200))
  deduplicated = _tokenizer(directory, 3, "drawn.npy", deduplicate=True)
  for row, per_wave in enumerate(reference):
    expected, margin = _nearest(per_wave[3], centroids)
    assert margin.min() > 1e-4  # no near tie (the features are within ~1e-6 of the reference): codes are decided
    np.testing.assert_array_equal(codes[row, : len(expected)], expected)
    collapsed = deduplicated.finish(expected[:, None].astype(np.int32))
    assert collapsed[:, 0].tolist() == [c for i, c in enumerate(expected) if i == 0 or c != expected[i - 1]]
  assert len(np.unique(codes[1])) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("shapes", ["buckets", "windows"])
def test_the_runner_codes_each_wave_as_transformers_alone(hubert, shapes):
  """encode_batch: length buckets or fixed windows (the group norm over time and attention read a row's own frames
  only, so padding to a window changes nothing), rows rounded to the 8 host devices, segments joined, then dedup."""
  directory, reference = hubert
  centroids = _drawn_centroids(directory, reference, 2)
  waves = _waves()
  codes = _tokenizer(directory, 2, "drawn.npy").configure(shapes=shapes).encode_batch(waves)
  for got, per_wave in zip(codes, reference):
    np.testing.assert_array_equal(got[:, 0], _nearest(per_wave[2], centroids)[0])
  collapsed = _tokenizer(directory, 2, "drawn.npy", deduplicate=True).encode(waves[1], "utt")
  np.testing.assert_array_equal(collapsed, dedup(codes[1]))
  assert len(collapsed) < len(codes[1])


def test_a_row_reads_the_same_alone_and_in_a_batch_of_other_lengths(hubert):
  directory, _ = hubert
  tokenizer = _tokenizer(directory, 3)
  waves = _waves(seed=4)
  batch, lengths = _batch(waves, 3200)
  batch[0, lengths[0]:] = 5.0  # what lies past a row's length is never read
  together, together_codes = _features(tokenizer, batch, lengths)
  for row, wave in enumerate(waves):
    n = tokenizer.prepare(wave)[1]
    alone, alone_codes = (x[0, :n] for x in _features(tokenizer, *_batch([wave], 2000)))
    np.testing.assert_allclose(together[row, :n], alone, atol=1e-5 * np.abs(alone).max())
    np.testing.assert_array_equal(together_codes[row, :n], alone_codes)


def _rewrite(source, target, edit):
  """A copy of the folder `source` whose tensors went through `edit(dict) -> dict`."""
  from safetensors.numpy import load_file, save_file

  target.mkdir()
  shutil.copy(source / "config.json", target / "config.json")
  save_file(edit(load_file(str(source / "model.safetensors"))), str(target / "model.safetensors"))
  return target


def test_both_weight_norm_spellings_and_the_hubert_prefix_read_the_same(tmp_path):
  from safetensors import safe_open

  model = _save_model(tmp_path / "saved", "group")
  np.save(tmp_path / "km.npy", np.zeros((UNITS, 32), np.float32))
  with safe_open(str(tmp_path / "saved" / "model.safetensors"), "np") as f:
    keys = set(f.keys())
  # The installed transformers writes nn.utils.parametrizations.weight_norm's names.
  assert {f"{POS_CONV}.parametrizations.weight.original0", f"{POS_CONV}.parametrizations.weight.original1"} <= keys

  def older(tensors):  # nn.utils.weight_norm's names, under HubertForCTC's `hubert.` prefix
    renamed = {key.replace("parametrizations.weight.original0", "weight_g")
               .replace("parametrizations.weight.original1", "weight_v"): value for key, value in tensors.items()}
    return {"hubert." + key: value for key, value in renamed.items()}

  _rewrite(tmp_path / "saved", tmp_path / "older", older)
  wave = _waves()[0]
  expected = _reference(model, [wave])[0][3]
  batch, lengths = _batch([wave], 2000)
  for folder in ("saved", "older"):
    tokenizer = HubertKmeansTokenizer(str(tmp_path / folder), str(tmp_path / "km.npy"), 3, False)
    features = _features(tokenizer, batch, lengths)[0][0, : len(expected)]
    assert np.abs(features - expected).max() <= 1e-4 * np.abs(expected).max(), folder


def test_errors_name_the_key_the_file_or_the_switch(tmp_path):
  _save_model(tmp_path / "saved", "group")
  np.save(tmp_path / "km.npy", np.zeros((3, 32), np.float32))
  km = str(tmp_path / "km.npy")
  q_proj = "encoder.layers.0.attention.q_proj.weight"

  missing = _rewrite(tmp_path / "saved", tmp_path / "missing", lambda t: {k: v for k, v in t.items() if k != q_proj})
  with pytest.raises(WeightsError, match=f"tensor '{q_proj}' is missing"):
    HubertKmeansTokenizer(str(missing), km, 1)
  HubertKmeansTokenizer(str(missing), km, 0)  # layer 0 reads no encoder layer

  no_last = _rewrite(tmp_path / "saved", tmp_path / "no_last",
                     lambda t: {k: v for k, v in t.items() if not k.startswith("encoder.layers.2.")})
  HubertKmeansTokenizer(str(no_last), km, 2)  # the layers past `layer` are never read

  transposed = _rewrite(tmp_path / "saved", tmp_path / "transposed",
                        lambda t: {**t, "feature_projection.projection.weight":
                                   np.ascontiguousarray(t["feature_projection.projection.weight"].T)})
  with pytest.raises(WeightsError, match=r"'feature_projection.projection.weight' has shape \(16, 32\), "
                                         r"the model needs \(32, 16\)"):
    HubertKmeansTokenizer(str(transposed), km, 1)

  no_norm = _rewrite(tmp_path / "saved", tmp_path / "no_norm",
                     lambda t: {k: v for k, v in t.items() if "parametrizations" not in k})
  with pytest.raises(HubertError, match=f"neither '{POS_CONV}.weight_g' nor '{POS_CONV}.parametrizations"):
    HubertKmeansTokenizer(str(no_norm), km, 1)

  np.save(tmp_path / "wide.npy", np.zeros((3, 33), np.float32))
  with pytest.raises(HubertError, match=r"wide.npy: centroids must be \[units, 32\].*\(3, 33\)"):
    HubertKmeansTokenizer(str(tmp_path / "saved"), str(tmp_path / "wide.npy"), 1)

  with pytest.raises(HubertError, match="layer 4 is outside HuBERT's 0..3"):
    HubertKmeansTokenizer(str(tmp_path / "saved"), km, 4)

  (tmp_path / "bin").mkdir()
  shutil.copy(tmp_path / "saved" / "config.json", tmp_path / "bin" / "config.json")
  (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"torch pickle")
  with pytest.raises(HubertError, match="pytorch_model.bin only.*re-save it as safetensors"):
    HubertKmeansTokenizer(str(tmp_path / "bin"), km, 1)

  for switch, value in (("feat_extract_activation", "relu"), ("conv_pos_batch_norm", True)):
    folder = tmp_path / switch
    shutil.copytree(tmp_path / "saved", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, switch: value}))
    with pytest.raises(HubertError, match=f"{switch}={value!r} is not implemented"):
      HubertKmeansTokenizer(str(folder), km, 1)


def test_from_settings_reads_the_spec_entries_and_identity_records_them(tmp_path):
  _save_model(tmp_path / "hubert", "group")
  centroids = np.random.default_rng(0).normal(size=(5, 32)).astype(np.float32)
  np.save(tmp_path / "km.npy", centroids)
  where = lambda path: str(tmp_path / path)
  tokenizer = HubertKmeansTokenizer.from_settings({"model_dir": "hubert", "centroids": "km.npy", "layer": 2}, where)
  assert tokenizer.deduplicate and tokenizer.layer == 2  # dedup defaults to True, as TWIST and SIMS use it
  assert (tokenizer.sample_rate, tokenizer.frame_rate, tokenizer.codebook_sizes) == (16000, 800.0, (5,))
  identity = tokenizer.identity()
  assert {k: identity[k] for k in ("type", "layer", "dedup", "units")} == {
      "type": "hubert_kmeans", "layer": 2, "dedup": True, "units": 5}
  other_layer = HubertKmeansTokenizer.from_settings(
      {"model_dir": "hubert", "centroids": "km.npy", "layer": 1, "dedup": False}, where)
  assert other_layer.identity()["weights_sha"] != identity["weights_sha"]  # it reads fewer layers
  assert not other_layer.deduplicate
  # Fewer samples than the first conv's kernel make no frame (transformers fails on them): the wave has no codes.
  assert tokenizer.prepare(np.zeros(9, np.float32))[1] == 0
  assert tokenizer.encode(np.zeros(9, np.float32), "short").shape == (0, 1)


@pytest.mark.slow
def test_base_structure_on_real_speech_matches_transformers(tmp_path):
  """HuBERT base's conv stack (7 convs, 320 samples a frame) and positional conv (128 taps, 16 groups), narrow,
  on the bundled speech sample."""
  import torch
  from transformers import HubertConfig, HubertModel

  from s2sjax.data import task_registry
  from tasks.audio.base import load_audio
  from tasks.sample import RELEASE_DIR

  torch.manual_seed(0)
  model = HubertModel(HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                   conv_dim=(16,) * 7)).eval()
  model.save_pretrained(str(tmp_path / "hubert"), safe_serialization=True)
  wave = load_audio(f"{RELEASE_DIR}/{task_registry.get('sstorycloze').release_audio_dir}/0.wav", 16000)
  with torch.no_grad():
    expected = model(torch.from_numpy(wave)[None], output_hidden_states=True).hidden_states[2][0].numpy()
  centroids = expected[np.random.default_rng(0).choice(len(expected), UNITS, replace=False)]
  np.save(tmp_path / "km.npy", centroids)
  tokenizer = HubertKmeansTokenizer(str(tmp_path / "hubert"), str(tmp_path / "km.npy"), 2, False)
  assert (tokenizer.frame_rate, tokenizer.time_multiple) == (50.0, 320)
  features, codes = (x[0] for x in _features(tokenizer, *_batch([wave], len(wave) + 999)))
  assert np.abs(features[: len(expected)] - expected).max() <= 1e-4 * np.abs(expected).max()
  np.testing.assert_array_equal(codes[: len(expected)], _nearest(expected, centroids)[0])
  np.testing.assert_array_equal(tokenizer.encode(wave, "0")[:, 0], _nearest(expected, centroids)[0])


@pytest.mark.parametrize("width, stride, channels, steps", [(10, 5, 1, 400), (4, 2, 3, 64), (3, 2, 4, 64)])
def test_the_first_conv_as_a_framed_matmul_equals_the_convolution(width, stride, channels, steps):
  """HuBERT's first conv (10 samples, stride 5) runs as a matmul over frames; a kernel that is no whole number of
  strides (3, stride 2) takes the convolution itself."""
  from tasks.audio.hubert import _framed_conv
  from tasks.audio.ops import conv1d

  rng = np.random.default_rng(5)
  x = rng.standard_normal((2, steps, channels)).astype(np.float32)
  kernel = rng.standard_normal((width, channels, 8)).astype(np.float32)
  expected = np.asarray(conv1d(x, {"kernel": kernel}, stride))
  found = np.asarray(jax.jit(_framed_conv, static_argnums=2)(x, kernel, stride))
  assert found.shape == expected.shape == (2, (steps - width) // stride + 1, 8)
  np.testing.assert_allclose(found, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
