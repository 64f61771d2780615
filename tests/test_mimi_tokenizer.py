"""Mimi in JAX against its two references on one tiny random Mimi (the real structure: 24 kHz, SEANet ratios
8-6-5-4, a 2-layer transformer with an 8-step context, downsampling to 12.5 Hz, 1 + 9 codebooks of 64): Kyutai's
`moshi` MimiModel loading Kyutai's safetensors with its own `get_mimi`, and transformers' MimiModel loading the same
weights converted to its `kyutai/mimi` layout."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

from tasks.audio.mimi import KYUTAI_MIMI_CONFIG, MimiConfigError, MimiTokenizer, forward  # noqa: E402
from tasks.audio.weights import WeightsError  # noqa: E402

FRAME = 1920  # samples per code frame at 24 kHz, 12.5 Hz
LENGTHS = (33001, 35555, 38017)  # 1.4-1.6 s, none a whole number of frames, one length bucket of the runner
CODEBOOKS = 8
TINY = {
    "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
    "seanet": dict(KYUTAI_MIMI_CONFIG["seanet"], dimension=32, n_filters=4),
    "quantizer": {"dimension": 16, "n_q": 10, "bins": 64, "input_dimension": 32, "output_dimension": 32},
    "transformer": dict(KYUTAI_MIMI_CONFIG["transformer"], d_model=32, num_heads=4, num_layers=2, context=8,
                        dim_feedforward=64, input_dimension=32, output_dimensions=[32]),
}
TINY_TRANSFORMERS = {
    "hidden_size": 32, "num_filters": 4, "upsampling_ratios": [8, 6, 5, 4], "num_hidden_layers": 2,
    "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
    "codebook_size": 64, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16, "num_quantizers": 10,
    "sliding_window": 8, "upsample_groups": 32,
}


def waves() -> list[np.ndarray]:
  rng = np.random.default_rng(0)
  t = np.arange(max(LENGTHS)) / 24000
  return [(0.3 * np.sin(2 * np.pi * (150 + 100 * i) * t[:n]) + 0.2 * rng.standard_normal(n)).astype(np.float32)
          for i, n in enumerate(LENGTHS)]


def randomize(model, generator) -> None:
  """Norms, layer scales and codebooks away from their initial values; each codebook's centroids drawn around
  the statistics of the residual it quantizes (so codes spread over the table), its usage random, three codes
  dead (usage 0: their centroid is their sum / 1e-5, the clamp the port must reproduce)."""
  with torch.no_grad():
    for key, value in model.state_dict().items():
      if ".norm" in key:
        value.copy_((key.endswith("weight") + 0.2 * torch.randn(value.shape, generator=generator)))
      elif "layer_scale" in key:
        value.copy_(0.2 + 0.6 * torch.rand(value.shape, generator=generator))
    latents = torch.cat([model._encode_to_unquantized_latent(torch.from_numpy(w)[None, None]) for w in waves()],
                        dim=-1)
    for rvq in (model.quantizer.rvq_first, model.quantizer.rvq_rest):
      residual = rvq.input_proj(latents)[0].T
      for layer in rvq.vq.layers:
        codebook = layer._codebook
        centroids = residual.mean(0) + residual.std(0) * torch.randn(codebook.embedding_sum.shape,
                                                                     generator=generator)
        usage = 0.5 + 1.5 * torch.rand(codebook.cluster_usage.shape, generator=generator)
        usage[:3] = 0
        codebook.cluster_usage.copy_(usage)
        codebook.embedding_sum.copy_(centroids * usage.clamp(min=1e-5)[:, None])
        residual = residual - centroids[torch.cdist(residual, centroids).argmin(-1)]
      assert all(layer._codebook._embedding is None for layer in rvq.vq.layers)  # nothing cached yet


def permute_for_rotate_half(rows: torch.Tensor, heads: int) -> torch.Tensor:
  """Kyutai's interleaved RoPE rows to transformers' halves (convert_mimi_checkpoint_to_pytorch.py `permute`)."""
  out, d_in = rows.shape
  return rows.view(heads, out // heads // 2, 2, d_in).transpose(1, 2).reshape(out, d_in)


def kyutai_to_transformers(state: dict, heads: int) -> dict:
  """The encoder and quantizer tensors of a moshi Mimi state_dict under transformers' names, as transformers'
  convert_mimi_checkpoint_to_pytorch.py renames them (the decoder side is left out: codes never read it)."""
  renames = [("conv.conv.conv.", "conv."), ("conv.conv.", "conv."), ("encoder.model.", "encoder.layers."),
             ("encoder_transformer.transformer.", "encoder_transformer."), ("linear1", "mlp.fc1"),
             ("linear2", "mlp.fc2"), ("out_projs.0", "o_proj"), ("norm1", "input_layernorm"),
             ("norm2", "post_attention_layernorm"), ("layer_scale_1", "self_attn_layer_scale"),
             ("layer_scale_2", "mlp_layer_scale"), ("rvq_first.vq.", "semantic_residual_vector_quantizer."),
             ("rvq_first.", "semantic_residual_vector_quantizer."),
             ("rvq_rest.vq.", "acoustic_residual_vector_quantizer."),
             ("rvq_rest.", "acoustic_residual_vector_quantizer."), ("_codebook", "codebook"),
             ("_initialized", "initialized"), ("embedding_sum", "embed_sum")]
  out = {}
  for key, value in state.items():
    if not key.startswith(("encoder.", "encoder_transformer.", "downsample.", "quantizer.")):
      continue
    for old, new in renames:
      key = key.replace(old, new)
    if key.endswith("self_attn.in_projs.0.weight"):
      q, k, v = value.chunk(3)
      base = key[: -len("in_projs.0.weight")]
      out[base + "q_proj.weight"] = permute_for_rotate_half(q, heads)
      out[base + "k_proj.weight"] = permute_for_rotate_half(k, heads)
      out[base + "v_proj.weight"] = v
    else:
      out[key] = value
  return {k: v.contiguous() for k, v in out.items()}


@pytest.fixture(scope="module")
def kyutai_release(tmp_path_factory):
  """One random tiny Mimi in Kyutai's layout (its state_dict, as get_mimi loads it) and its mimi_config."""
  from moshi.models.loaders import get_mimi
  from safetensors.torch import save_file

  root = tmp_path_factory.mktemp("mimi")
  torch.manual_seed(0)
  model = get_mimi(None, TINY)
  randomize(model, torch.Generator().manual_seed(1))
  kyutai_file, kyutai_config = str(root / "tokenizer-tiny.safetensors"), str(root / "mimi_config.json")
  save_file({k: v.contiguous() for k, v in model.state_dict().items()}, kyutai_file)
  with open(kyutai_config, "w") as f:
    json.dump(TINY, f)
  return {"root": root, "kyutai_file": kyutai_file, "kyutai_config": kyutai_config}


@pytest.fixture(scope="module")
def release(kyutai_release):
  """The same Mimi in transformers' layout too, and both references loaded from those files."""
  from moshi.models.loaders import get_mimi
  from safetensors.torch import load_file, save_file
  from transformers import MimiConfig, MimiModel

  kyutai_file = kyutai_release["kyutai_file"]
  folder = str(kyutai_release["root"] / "transformers")
  MimiModel(MimiConfig(**TINY_TRANSFORMERS)).save_pretrained(folder)  # config.json and a random decoder
  tensors = load_file(os.path.join(folder, "model.safetensors"))
  converted = kyutai_to_transformers(load_file(kyutai_file), heads=TINY["transformer"]["num_heads"])
  assert set(converted) <= set(tensors)
  save_file(dict(tensors, **converted), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
  hf, info = MimiModel.from_pretrained(folder, output_loading_info=True)
  assert not any(info.values()), info
  return dict(kyutai_release, folder=folder, moshi=get_mimi(kyutai_file, TINY, num_codebooks=CODEBOOKS),
              transformers=hf.eval())


def moshi_reference(model, wave):
  from moshi.modules.conv import pad_for_conv1d

  x = torch.from_numpy(wave)[None, None]
  with torch.no_grad():
    return {"codes": model.encode(x)[0].T.numpy(),
            "embeddings": model.encoder(pad_for_conv1d(x, FRAME, FRAME))[0].T.numpy(),
            "latents": model._encode_to_unquantized_latent(x)[0].T.numpy()}


def transformers_reference(model, wave):
  x = torch.from_numpy(wave)[None, None]
  with torch.no_grad():
    return {"codes": model.encode(x, num_quantizers=CODEBOOKS).audio_codes[0].T.numpy(),
            "embeddings": model.encoder.encoder_seanet(x)[0].T.numpy(),
            "latents": model.encoder(x).latents[0].T.numpy()}


@functools.cache
def jitted_forward():
  import jax

  return jax.jit(forward, static_argnums=(3, 4))


def ours_batched(tokenizer):
  """`forward` on one batch of every wave, zero-padded to the longest's whole frames."""
  batch = np.zeros((len(LENGTHS), -(-max(LENGTHS) // FRAME) * FRAME, 1), np.float32)
  for row, wave in enumerate(waves()):
    batch[row, : len(wave), 0] = wave
  out = jitted_forward()(tokenizer.params, batch, np.array(LENGTHS, np.int32), tokenizer.arch,
                         tokenizer.padding == "transformers")
  return {k: np.asarray(v) for k, v in out.items()}


def assert_close(ours, reference, what):
  bound = 1e-4 * np.abs(reference).max()
  assert ours.shape == reference.shape, (what, ours.shape, reference.shape)
  assert np.abs(ours - reference).max() <= bound, (what, np.abs(ours - reference).max(), bound)


# The tests that run the encoder are slow: torch references and XLA compiles of the encoder, ~5-20 s each.
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["kyutai", "transformers"])
def test_codes_and_embeddings_equal_the_layouts_own_reference(release, layout):
  if layout == "kyutai":
    tokenizer = MimiTokenizer(release["kyutai_file"], CODEBOOKS, mimi_config=release["kyutai_config"])
    reference = lambda wave: moshi_reference(release["moshi"], wave)
  else:
    tokenizer = MimiTokenizer(release["folder"], CODEBOOKS)
    reference = lambda wave: transformers_reference(release["transformers"], wave)
  assert (tokenizer.layout, tokenizer.padding) == (layout, layout)
  ours = ours_batched(tokenizer)
  for row, wave in enumerate(waves()):
    expected = reference(wave)
    frames, steps = len(expected["codes"]), len(expected["embeddings"])
    assert frames == -(-len(wave) // FRAME) == tokenizer.prepare(wave)[1]
    assert_close(ours["embeddings"][row, :steps], expected["embeddings"], "SEANet output")
    assert_close(ours["latents"][row, :frames], expected["latents"], "latents")
    np.testing.assert_array_equal(ours["codes"][row, :frames], expected["codes"])
    assert all(len(np.unique(expected["codes"][:, k])) > 3 for k in range(CODEBOOKS))  # codes vary


@pytest.mark.slow
def test_both_layouts_read_the_same_model_and_the_padding_rule_decides_the_last_frame(release):
  import jax

  kyutai = MimiTokenizer(release["kyutai_file"], CODEBOOKS, mimi_config=release["kyutai_config"])
  transformers = MimiTokenizer.from_settings({"model_dir": "transformers", "layout": "transformers"},
                                             lambda path: str(release["root"] / path))
  assert transformers.identity()["codebooks"] == CODEBOOKS
  assert kyutai.arch == transformers.arch
  jax.tree_util.tree_map(np.testing.assert_array_equal, kyutai.params, transformers.params)
  # Either file with the other's padding rule gives the other reference's codes.
  swapped = {"kyutai": ours_batched(MimiTokenizer(release["folder"], CODEBOOKS, padding="kyutai"))["codes"],
             "transformers": ours_batched(MimiTokenizer(release["kyutai_file"], CODEBOOKS,
                                                        mimi_config=release["kyutai_config"],
                                                        padding="transformers"))["codes"]}
  last_frame_differs = []
  for row, wave in enumerate(waves()):
    by_moshi = moshi_reference(release["moshi"], wave)["codes"]
    by_transformers = transformers_reference(release["transformers"], wave)["codes"]
    np.testing.assert_array_equal(swapped["kyutai"][row, : len(by_moshi)], by_moshi)
    np.testing.assert_array_equal(swapped["transformers"][row, : len(by_transformers)], by_transformers)
    np.testing.assert_array_equal(by_moshi[:-1], by_transformers[:-1])  # whole frames agree
    last_frame_differs.append(bool((by_moshi[-1] != by_transformers[-1]).any()))
  assert any(last_frame_differs)  # the partial last frame is where the two references part


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["kyutai", "transformers"])
def test_batch_invariant_whatever_the_batch_and_the_padding(release, padding):
  tokenizer = MimiTokenizer(release["kyutai_file"], CODEBOOKS, mimi_config=release["kyutai_config"],
                            padding=padding)
  together = tokenizer.encode_batch(waves())
  batched = ours_batched(tokenizer)["codes"]  # another batch shape, less padding
  for row, (wave, codes) in enumerate(zip(waves(), together)):
    assert codes.shape == (-(-len(wave) // FRAME), CODEBOOKS) and codes.dtype == np.int32
    np.testing.assert_array_equal(tokenizer.encode(wave, "alone"), codes)
    np.testing.assert_array_equal(batched[row, : len(codes)], codes)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["kyutai", "transformers"])
def test_fixed_windows_give_the_layouts_own_codes(release, layout):
  """The windows policy pads each wave to a fixed window (here 2 s for the short waves, 8 s for a 5 s one): the
  encoder is causal (SEANet's convolutions, the transformer's mask), so no padding after a wave reaches its codes,
  and under transformers' padding rule the runner feeds each strided convolution what transformers pads."""
  if layout == "kyutai":
    tokenizer = MimiTokenizer(release["kyutai_file"], CODEBOOKS, mimi_config=release["kyutai_config"])
    reference = lambda wave: moshi_reference(release["moshi"], wave)["codes"]
  else:
    tokenizer = MimiTokenizer(release["folder"], CODEBOOKS)
    reference = lambda wave: transformers_reference(release["transformers"], wave)["codes"]
  longer = (0.1 * np.random.default_rng(5).standard_normal(5 * 24000 + 777)).astype(np.float32)
  recordings = waves() + [longer]
  codes = tokenizer.configure(shapes="windows").encode_batch(recordings)
  assert tokenizer.run_report()["programs"] == 2
  for wave, got in zip(recordings, codes):
    np.testing.assert_array_equal(got, reference(wave))


def test_settings_identity_and_the_default_config(kyutai_release):
  from moshi.models.loaders import _mimi_config

  release = kyutai_release
  assert KYUTAI_MIMI_CONFIG == _mimi_config  # get_mimi's own constants, restated
  where = lambda path: str(release["root"] / path)
  tokenizer = MimiTokenizer.from_settings({"type": "mimi", "model_dir": "tokenizer-tiny.safetensors",
                                           "mimi_config": "mimi_config.json", "codebooks": 3}, where)
  assert (tokenizer.sample_rate, tokenizer.frame_rate, tokenizer.codebook_sizes) == (24000, 12.5, (64,) * 3)
  identity = tokenizer.identity()
  assert (identity["type"], identity["codebooks"], identity["layout"], identity["padding"]) == \
      ("mimi", 3, "kyutai", "kyutai")
  assert identity["weights_sha"] == MimiTokenizer(release["kyutai_file"], 3,
                                                 mimi_config=release["kyutai_config"]).identity()["weights_sha"]
  with pytest.raises(ValueError, match="codebooks 11: .* has 10 quantizers"):
    MimiTokenizer(release["kyutai_file"], 11, mimi_config=release["kyutai_config"])


def test_the_releases_older_attention_names_read_as_moshi_reads_them(kyutai_release, tmp_path):
  """Kyutai's files may name the fused attention `in_proj_weight` / `out_proj.weight`, which moshi's load hook
  maps onto `in_projs.0.weight` / `out_projs.0.weight` (transformer.py _load_hook): the same model either way."""
  import jax
  from moshi.models.loaders import get_mimi

  def rename(tensors):
    for key in [k for k in tensors if k.endswith(("in_projs.0.weight", "out_projs.0.weight"))]:
      tensors[key.replace("in_projs.0.weight", "in_proj_weight").replace("out_projs.0.weight",
                                                                         "out_proj.weight")] = tensors.pop(key)

  release = kyutai_release
  older = _rewrite(release["kyutai_file"], str(tmp_path / "older.safetensors"), rename)
  get_mimi(older, TINY)  # moshi accepts it (strict load_state_dict)
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         MimiTokenizer(older, mimi_config=release["kyutai_config"]).params,
                         MimiTokenizer(release["kyutai_file"], mimi_config=release["kyutai_config"]).params)


def _rewrite(source: str, target: str, change) -> str:
  from safetensors.numpy import load_file, save_file

  tensors = load_file(source)
  change(tensors)
  save_file(tensors, target)
  return target


def test_a_missing_or_misshapen_tensor_or_a_foreign_config_is_named(kyutai_release, tmp_path):
  release = kyutai_release
  config = release["kyutai_config"]
  key = "encoder_transformer.transformer.layers.1.linear1.weight"
  missing = _rewrite(release["kyutai_file"], str(tmp_path / "missing.safetensors"), lambda t: t.pop(key))
  with pytest.raises(WeightsError, match=f"{key}.* is missing"):
    MimiTokenizer(missing, mimi_config=config)
  key = "quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum"
  wrong = _rewrite(release["kyutai_file"], str(tmp_path / "wrong.safetensors"),
                   lambda t: t.update({key: t[key][:, :8]}))
  with pytest.raises(WeightsError, match=rf"{key}.* has shape \(64, 8\), the model needs \(64, 16\)"):
    MimiTokenizer(wrong, mimi_config=config)
  extra = _rewrite(release["kyutai_file"], str(tmp_path / "extra.safetensors"),
                   lambda t: t.update({"encoder_transformer.transformer.layers.2.norm1.weight": np.ones(32, "f4")}))
  with pytest.raises(WeightsError, match="layers.2.norm1.weight"):
    MimiTokenizer(extra, mimi_config=config)
  # Without its mimi_config the file is read as get_mimi's default Mimi, whose sizes it does not have.
  with pytest.raises(WeightsError, match=r"encoder.model.0.conv.conv.weight.* \(4, 1, 7\), the model needs \(64, 1"):
    MimiTokenizer(release["kyutai_file"])
  silu = str(tmp_path / "silu.json")
  with open(silu, "w") as f:
    json.dump(dict(TINY, transformer=dict(TINY["transformer"], gating="silu")), f)
  with pytest.raises(MimiConfigError, match="silu.json: transformer.gating='silu' is not implemented"):
    MimiTokenizer(release["kyutai_file"], mimi_config=silu)


@pytest.mark.slow
@pytest.mark.parametrize("pad_mode", ["constant", "replicate"])
@pytest.mark.parametrize("padding", ["kyutai", "transformers"])
def test_seanet_over_windows_equals_seanet_over_whole_rows(kyutai_release, pad_mode, padding):
  """The first stages run over one-frame windows with their history (`seanet`): every kept step equals the one the
  same stages compute over the whole padded row, rows of several lengths, either padding rule and pad mode."""
  import dataclasses

  import jax

  from tasks.audio.mimi import causal_conv, seanet, seanet_stages, window_stages

  tokenizer = MimiTokenizer(kyutai_release["kyutai_file"], CODEBOOKS, mimi_config=kyutai_release["kyutai_config"])
  arch = dataclasses.replace(tokenizer.arch, pad_mode=pad_mode)
  assert window_stages(arch) == (2, 40)  # 6 + (2 + 4) + (2 + 5) * 4 samples of history, in steps of 20
  per_layer = padding == "transformers"

  def whole_rows(params, audio, lengths):
    x, _ = seanet_stages(params, audio, lengths, arch, range(len(arch.ratios)), per_layer)
    return causal_conv(jax.nn.elu(x), params["final"], pad_mode=arch.pad_mode)

  batch = np.zeros((len(LENGTHS), -(-max(LENGTHS) // FRAME) * FRAME, 1), np.float32)
  for row, wave in enumerate(waves()):
    batch[row, : len(wave), 0] = wave
  lengths = np.array(LENGTHS, np.int32)
  windowed = np.asarray(jax.jit(lambda p, a, n: seanet(p, a, n, arch, per_layer)[0])(tokenizer.params, batch, lengths))
  expected = np.asarray(jax.jit(whole_rows)(tokenizer.params, batch, lengths))
  for row, length in enumerate(LENGTHS):
    steps = -(-length // (FRAME // 2))
    np.testing.assert_allclose(windowed[row, :steps], expected[row, :steps], rtol=0, atol=1e-6 * np.abs(expected).max())
