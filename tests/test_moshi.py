"""Moshi's parallel multi-stream family against Kyutai's own PyTorch `LMModel` (`moshi` package, tiny random
weights): a release-layout checkpoint converts, and so does today's `LMModel.state_dict()` (per-weight-set attention
names) with or without LoRA factors; every stream's log-probs match `LMModel.forward` (`--verify` and
`python -m s2sjax.logprobs`), packed prefix-shared rows score each candidate as a per-sequence `LMModel.forward`
does, and what does not fit is named."""

import copy
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moshi.models.lm as lm
import torch
from moshi.modules.lora import replace_all_linear_with_lora
from safetensors.torch import save_file

from checkpoints_conversion import convert, moshi_release, safetensors_io, verify  # noqa: E402
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.scorer import collect
from s2sjax.data import packing
from s2sjax.runtime import sharding  # noqa: E402
from s2sjax.data.formats import streams  # noqa: E402
from s2sjax.scoring.architectures import moshi as moshi_family  # noqa: E402
from s2sjax.data.formats import moshi_protocol  # noqa: E402
from s2sjax.data.spec import SpecError  # noqa: E402
from s2sjax.model import moshi  # noqa: E402
from s2sjax.model.config import ConfigError  # noqa: E402

# A tiny Moshi: rope, rms_norm_f32, silu gating, 4 codebooks read of which the first 3 are predicted (as Moshi reads
# the user's stream without predicting it), acoustic delays, a depformer with per-step weights and input linears.
TINY = dict(
  delays=[0, 0, 1, 1, 2], n_q=4, dep_q=3, card=32, text_card=48, dim=32, num_heads=4, num_layers=2,
  hidden_scale=4.125, causal=True, context=3000, max_period=10000, gating="silu", norm="rms_norm_f32",
  positional_embedding="rope", depformer_dim=16, depformer_dim_feedforward=40, depformer_num_heads=2,
  depformer_num_layers=2, depformer_multi_linear=True, depformer_context=8, depformer_max_period=10000,
  depformer_gating="silu", depformer_pos_emb="none", depformer_weights_per_step=True, existing_text_padding_id=3,
  layer_scale=None, depformer_layer_scale=None,
)
# What a release's config.json adds for the loader (moshi.models.loaders.CheckpointInfo).
LOADER = dict(moshi_name="model.safetensors", mimi_name="tokenizer-e351c8d8-checkpoint125.safetensors",
              tokenizer_name="tokenizer_spm_32k_3.model", model_type="moshi")


def release_state_dict(model) -> dict:
  """The model's weights as Kyutai's releases store them: attention fused as `in_proj_weight` / `out_proj.weight`
  with the depformer's per-step weight sets stacked (what `StreamingMultiheadAttention._load_hook` splits)."""
  state, fused = {}, {}
  for key, value in model.state_dict().items():
    match = re.fullmatch(r"(.*self_attn)\.(in|out)_projs\.(\d+)\.weight", key)
    if match:
      fused.setdefault((match[1], match[2]), {})[int(match[3])] = value
    else:
      state[key] = value
  for (prefix, which), sets in fused.items():
    name = f"{prefix}.in_proj_weight" if which == "in" else f"{prefix}.out_proj.weight"
    state[name] = torch.cat([sets[i] for i in sorted(sets)])
  return {k: v.detach().float().contiguous().numpy() for k, v in state.items()}


def write_release(directory, state: dict, config: dict) -> str:
  os.makedirs(directory, exist_ok=True)
  safetensors_io.write(os.path.join(directory, "model.safetensors"), state)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  return str(directory)


def save_state_dict(directory, state: dict, config: dict, name: str = "model.safetensors") -> str:
  """A folder of torch tensors as the installed `safetensors` package saves them (moshi-finetune's way), and a
  config.json."""
  os.makedirs(directory, exist_ok=True)
  save_file({k: v.detach().contiguous() for k, v in state.items()}, os.path.join(directory, name))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  return str(directory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(release folder, torch model) of a tiny random Moshi; norms and layer weights perturbed so each matters."""
  torch.manual_seed(0)
  model = lm.LMModel(**TINY, dtype=torch.float32).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("alpha"):
        p.copy_(1 + 0.2 * torch.randn_like(p))
      elif name.startswith("depformer.") or ".self_attn." in name:
        p.add_(0.05 * torch.randn_like(p))
  folder = write_release(tmp_path_factory.mktemp("moshi") / "release", release_state_dict(model), {**TINY, **LOADER})
  reloaded = moshi_release.load_lm(folder)  # upstream's loader reads our release layout back
  for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values()):
    assert torch.equal(a, b), name
  return folder, model


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
  folder, _ = tiny
  out = str(tmp_path_factory.mktemp("moshi") / "ckpt")
  convert.convert(folder, out, family="moshi")
  return out


def load(ckpt):
  return checkpoint.load_config(ckpt), checkpoint.load_params(ckpt)


def random_codes(rng, config, batch, length, zero_rate=0.02):
  codes = np.concatenate([rng.integers(0, config.text_card, (batch, 1, length)),
                          rng.integers(0, config.card, (batch, config.n_q, length))], axis=1)
  codes[:, :, rng.random(length) < zero_rate] = -1
  return codes


def test_config_reads_every_switch_and_refuses_by_name():
  config = moshi_family.parse_config({**TINY, **LOADER})
  assert config.delays == (0, 0, 1, 1, 2) and config.initial_ids == (48, 32, 32, 32, 32)
  assert config.temporal.hidden == 2 * int(4.125 * 32) // 3  # ActivationGating: 2/3 of dim_feedforward
  assert config.depformer.weight_sets == 3 and config.depformer_schedule == (0, 1, 2)
  assert config.depformer.context is None  # LMModel overrides depformer_context
  # Moshiko's published config (kyutai-labs/moshi configs/moshi_7b_202409.json) parses.
  moshiko = dict(moshi_family.MOSHIKO_CONFIG)
  assert moshi_family.parse_config(moshiko).depformer.hidden == 2816
  for change, named in [({"norm": "layer_norm"}, "norm='layer_norm'"), ({"gating": "none"}, "gating='none'"),
                        ({"conditioners": {"description": {}}}, "conditioners"), ({"cross_attention": True},
                        "cross_attention"), ({"demux_second_stream": True}, "demux_second_stream"),
                        ({"norm_emb": True}, "norm_emb"), ({"mystery_switch": 1}, "mystery_switch"),
                        ({"model_type": "hibiki"}, "hibiki"), ({"delays": [0, 0]}, "delays")]:
    with pytest.raises(ConfigError, match=re.escape(named)):
      moshi_family.parse_config({**TINY, **change})


@pytest.mark.slow
def test_every_stream_matches_lmmodel_forward_fp32(tiny, converted):
  """Text and every codebook's full distribution at 512 steps, as `--verify` measures it."""
  folder, _ = tiny
  result = verify.compare_with_torch(folder, converted, length=512)
  assert result["max_abs_diff"] <= 1e-4, result


@pytest.mark.slow
def test_bf16_kl_is_bounded(tiny, converted):
  folder, model = tiny
  config, params = load(converted)
  codes = random_codes(np.random.default_rng(1), config, 1, 64)
  with torch.no_grad():
    out = model(torch.from_numpy(codes))
  ref_text = torch.log_softmax(out.text_logits.float(), -1).numpy()[:, 0]
  ref_audio = torch.log_softmax(out.logits.float(), -1).numpy()
  bf16 = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
  text, text_mask, audio, audio_mask = moshi.stream_log_probs(config, bf16, codes, dtype=jnp.bfloat16)
  kl = lambda p, q: (np.exp(p) * (p - q)).sum(-1)
  assert kl(ref_text, text)[text_mask].mean() < 1e-3  # measured 8e-5
  assert kl(ref_audio, audio)[audio_mask].mean() < 1e-3  # measured 6e-5


def test_conversion_names_what_does_not_fit(tiny, tmp_path):
  folder, model = tiny
  state = release_state_dict(model)
  missing = {k: v for k, v in state.items() if k != "depformer.layers.1.gating.2.linear_in.weight"}
  with pytest.raises(convert.ConversionError, match=r"missing key depformer\.layers\.1\.gating\.2\.linear_in\.weight"):
    convert.convert(write_release(tmp_path / "a", missing, {**TINY, **LOADER}), str(tmp_path / "out_a"), family="moshi")
  with pytest.raises(convert.ConversionError, match=r"missing key depformer_in\.2\.weight"):
    convert.convert(write_release(tmp_path / "b", {k: v for k, v in state.items() if k != "depformer_in.2.weight"},
                                  {**TINY, **LOADER}), str(tmp_path / "out_b"), family="moshi")
  # a config.json that says more codebooks than the weights hold: the shape (and the missing table) is named
  with pytest.raises(convert.ConversionError, match=r"missing key emb\.4\.weight"):
    convert.convert(write_release(tmp_path / "c", state, {**TINY, **LOADER, "n_q": 5, "delays": [0, 0, 1, 1, 2, 2]}),
                    str(tmp_path / "out_c"), family="moshi")


def same_leaves(a: str, b: str) -> None:
  jax.tree.map(np.testing.assert_array_equal, checkpoint.load_params(a), checkpoint.load_params(b))


@pytest.mark.slow
def test_lmmodel_state_dict_of_today_converts_and_verifies(tiny, converted, tmp_path):
  """moshi 0.2.13's `LMModel.state_dict()` names attention one module per weight set (`in_projs.{i}`,
  `out_projs.{i}`): it converts to the release layout's very leaves, and `--verify` holds it to upstream's loader."""
  folder, model = tiny
  source = save_state_dict(tmp_path / "current", model.state_dict(), {**TINY, **LOADER})
  assert "depformer.layers.0.self_attn.in_projs.2.weight" in model.state_dict()
  out = str(tmp_path / "ckpt")
  convert.convert(source, out, family="moshi")
  same_leaves(converted, out)
  result = verify.compare_with_torch(source, out, length=64)
  assert result["max_abs_diff"] <= 1e-4, result


@pytest.fixture(scope="module")
def wrapped(tiny):
  """The tiny model LoRA-wrapped as moshi wraps it (`replace_all_linear_with_lora`, rank 2, scaling 0.5), its
  factors random and non-zero, and that model's own state dict (`frozen_W`, `lora_A`, `lora_B` per linear)."""
  _, model = tiny
  torch.manual_seed(1)
  lora = copy.deepcopy(model)
  replace_all_linear_with_lora(lora, 2, 0.5)
  with torch.no_grad():
    for name, p in lora.named_parameters():
      if name.endswith("lora_B.weight"):
        p.copy_(0.1 * torch.randn_like(p))
  return lora, lora.state_dict()


@pytest.mark.slow
def test_lora_factors_are_merged_as_lora_linear_computes(tiny, wrapped, tmp_path):
  """A LoRA-wrapped LMModel's state dict converts with W + scaling * B @ A in every linear, and its log-probs are
  the wrapped model's; moshi-finetune's layout (base weights + `lora_name` factors, `lora: true`) converts to the
  same leaves and verifies against upstream's own loader, which reads the factors on top."""
  _, model = tiny
  lora, state = wrapped
  one = save_state_dict(tmp_path / "one_file", state, {**TINY, **LOADER, "lora_scaling": 0.5})
  manifest = convert.convert(one, str(tmp_path / "ckpt_one"), family="moshi")
  linears = sorted(k.removesuffix(".lora_A.weight") + ".weight" for k in state if k.endswith(".lora_A.weight"))
  assert manifest["lora_merged"] == {"scaling": 0.5, "weights": linears}
  assert moshi_release.compare_model(lora, str(tmp_path / "ckpt_one"), length=64)["max_abs_diff"] <= 1e-4
  assert verify.compare_with_torch(one, str(tmp_path / "ckpt_one"), length=64)["max_abs_diff"] <= 1e-4  # --verify
  two = save_state_dict(tmp_path / "two_files", model.state_dict(), {
    **TINY, **LOADER, "lora": True, "lora_name": "lora.safetensors", "lora_rank": 2, "lora_scaling": 0.5})
  save_file({k: v.contiguous() for k, v in state.items() if ".lora_" in k}, os.path.join(two, "lora.safetensors"))
  convert.convert(two, str(tmp_path / "ckpt_two"), family="moshi")
  same_leaves(str(tmp_path / "ckpt_one"), str(tmp_path / "ckpt_two"))
  assert verify.compare_with_torch(two, str(tmp_path / "ckpt_two"), length=64)["max_abs_diff"] <= 1e-4


def test_lora_and_spellings_that_do_not_fit_are_named(tiny, wrapped, tmp_path):
  folder, model = tiny
  _, state = wrapped
  lone = "transformer.layers.0.gating.linear_in"
  cases = [
    (save_state_dict(tmp_path / "lone", {k: v for k, v in state.items() if k != f"{lone}.lora_B.weight"},
                     {**TINY, **LOADER}),
     rf"LoRA factor {lone}\.lora_A\.weight has no {lone}\.lora_B\.weight"),
    (save_state_dict(tmp_path / "no_factors", model.state_dict(), {**TINY, **LOADER, "lora": True}),
     r"config\.json says lora=true, but .* hold no LoRA factors"),
    (write_release(tmp_path / "twice", {**release_state_dict(model), "transformer.layers.1.self_attn.in_projs.0.weight":
                                        model.state_dict()["transformer.layers.1.self_attn.in_projs.0.weight"].numpy()},
                   {**TINY, **LOADER}),
     r"transformer\.layers\.1\.self_attn\.in_projs\.0\.weight is stored twice, as "),
  ]
  for source, named in cases:
    with pytest.raises(convert.ConversionError, match=named):
      convert.convert(source, str(tmp_path / "out"), family="moshi")


@pytest.mark.slow
def test_logprobs_reads_moshi_streams_as_lmmodel_forward(tiny, converted):
  """`s2sjax.logprobs` on Moshi: the text stream as input_ids, the codebook streams as audio_codes [T, K] (every
  stream, or Moshi's own alone with the user's silent): the text head's and the depformer's log-softmax are
  `LMModel.forward`'s where its masks hold, NaN where they do not."""
  _, model = tiny
  config, params = load(converted)
  codes = random_codes(np.random.default_rng(5), config, 1, 40)
  for given in (config.n_q, config.dep_q):
    streams = codes.copy()
    streams[:, 1 + given :] = -1
    with torch.no_grad():
      out = model(torch.from_numpy(streams))
    text, codebooks = moshi_family.log_probs(config, params, streams[0, 0], streams[0, 1 : 1 + given].T)
    assert text.shape == (40, config.text_card_out) and codebooks.shape == (40, config.dep_q, config.card)
    pairs = [(text, torch.log_softmax(out.text_logits, -1)[0, 0].numpy(), out.text_mask[0, 0].numpy()),
             (codebooks.transpose(1, 0, 2), torch.log_softmax(out.logits, -1)[0].numpy(), out.mask[0].numpy())]
    for mine, reference, mask in pairs:
      assert np.isnan(mine[~mask]).all() and not np.isnan(mine[mask]).any()
      assert np.abs(mine[mask] - reference[mask]).max() <= 1e-4


def test_a_spec_of_another_stream_layout_is_refused():
  config = moshi_family.parse_config(TINY)
  fits = dict(codebook_sizes=(32,) * 3, delays=(0, 0, 1, 1), initial_ids=(48, 32, 32, 32))
  moshi_family.check_spec(config, **fits)
  for change, named in [({"codebook_sizes": (32,) * 8}, "8 codebooks per frame, but the model predicts dep_q=3"),
                        ({"codebook_sizes": (2048,) * 3}, r"\[2048, 2048, 2048\] codes, the model's card is 32"),
                        ({"delays": (0, 1, 1, 1)}, r"stream_delays \[0, 1, 1, 1\] are not the model's \[0, 0, 1, 1\]"),
                        ({"initial_ids": (32000, 32, 32, 32)}, r"initial tokens \[32000, 32, 32, 32\]")]:
    with pytest.raises(ConfigError, match=named):
      moshi_family.check_spec(config, **{**fits, **change})


# ---- scoring ---------------------------------------------------------------------------------------------------------


# The Moshi paper's S->S rule (arXiv 2410.00037, §5.4), written out for rows of every stream the tiny model reads
# (text, its 3 own codebooks, the user's one): "100 for the semantic tokens and 1 for the acoustic ones", the Inner
# Monologue's text not included, the user's stream never predicted.
PAPER_S2S = (0, 100, 1, 1, 0)
TEXT_ONLY = (1, 0, 0, 0, 0)  # s2t and t2t: the text stream alone


def stream_items(rng, config, weights, count=3):
  """Items of time-aligned streams: a prefix and 2-3 candidates each, some tokens -1 (silence in a stream); the
  streams of positive weight scored."""
  scored = tuple(k for k, w in enumerate(weights) if w)
  items = []
  for i in range(count):
    make = lambda n: random_codes(rng, config, 1, n, zero_rate=0.1)[0].T
    items.append(streams.StreamItem(make(int(rng.integers(5, 12))), tuple(make(int(rng.integers(3, 8)))
                                                                        for _ in range(2 + i % 2)), scored, f"q{i}"))
  return items


def layout_of(config):
  return streams.StreamLayout(config.delays, config.initial_ids, 1 + config.dep_q)


def naive_scores(model, config, item, weights, flush):
  """Per candidate (weighted NLL sum, steps): LMModel.forward on prefix + candidate (+ a -1 tail with `flush`);
  stream k's log-prob of each of the candidate's own times, where upstream's mask holds, times weights[k]; the
  steps are the candidate's times (and the tail's)."""
  out = []
  for candidate in item.candidates:
    tail = np.full((max(config.delays) if flush else 0, config.num_streams), -1)
    codes = np.concatenate([item.prefix, candidate, tail]).T[None]
    with torch.no_grad():
      result = model(torch.from_numpy(codes).long())
    logp = [torch.log_softmax(result.text_logits.double(), -1)[0, 0]]
    logp += [torch.log_softmax(result.logits.double(), -1)[0, k] for k in range(config.dep_q)]
    masks = [result.text_mask[0, 0]] + [result.mask[0, k] for k in range(config.dep_q)]
    p, n = len(item.prefix), len(candidate)
    total = 0.0
    for k, weight in enumerate(weights):
      for t in range(p, p + n):
        if weight and masks[k][t]:
          total -= weight * float(logp[k][t, codes[0, k, t]])
    out.append((total, n + len(tail)))
  return out


# A step's score is the weighted sum of its scored log-probs, so an error e in each log-prob moves it by up to e
# times the weights' sum (102-107 for S->S): each log-prob is held to 5e-6, twenty times finer than the fp32 rule.
# XLA's and torch's fp32 rounding differ by up to 1.4e-6 per log-prob on the hosts measured; on an AMD EPYC such an
# error on a semantic log-prob, times its weight of 100, once moved an S->S step by 1.1e-4.
LOG_PROB_TOLERANCE = 5e-6


def step_tolerance(weights) -> float:
  """The bound on a step's weighted score against LMModel.forward, given the per-stream weights."""
  return LOG_PROB_TOLERANCE * sum(weights)


def score(config, params, items, weights, share, flush=False, mesh=None, batch_size=2, length=64):
  rows, _ = streams.pack_streams(items, packing.RowShape(length, 32, 6), layout_of(config), share, flush)
  rows = streams.weigh_streams(rows, weights)
  scorer = moshi_family.scorer(config, packing.RowShape(length, 32, 6), mesh=mesh, batch_size=batch_size)
  nll_sum, n_tokens = scorer.score(params, rows)
  return collect(rows, nll_sum, n_tokens)


@pytest.mark.slow
@pytest.mark.parametrize("weights,flush", [(TEXT_ONLY, False), (PAPER_S2S, False), ((1, 100, 1, 1, 0), True)],
                         ids=["text", "paper_s2s", "every_stream_flushed"])
def test_packed_prefix_shared_rows_equal_per_sequence_lmmodel(tiny, converted, weights, flush):
  """Each candidate's weighted NLL per step, from packed prefix-shared rows, is LMModel.forward's on its own
  sequence: the text stream (s2t's protocol), the paper's S->S (100 x semantic + acoustic, per timestep), and every
  predicted stream with the delayed streams' last tokens flushed."""
  _, model = tiny
  config, params = load(converted)
  items = stream_items(np.random.default_rng(sum(weights)), config, weights)
  shared = score(config, params, items, weights, share=True, flush=flush)
  unshared = score(config, params, items, weights, share=False, flush=flush)
  np.testing.assert_array_equal(shared.n_tokens, unshared.n_tokens)
  np.testing.assert_allclose(shared.nll_sum, unshared.nll_sum, atol=1e-4, equal_nan=True)
  worst_sum = worst_mean = 0.0
  for i, item in enumerate(items):
    for c, (total, steps) in enumerate(naive_scores(model, config, item, weights, flush)):
      assert shared.n_tokens[i, c] == steps
      worst_sum = max(worst_sum, abs(shared.nll_sum[i, c] - total))
      worst_mean = max(worst_mean, abs(shared.mean_nll[i, c] - total / steps))
  print(f"weights {weights}: largest |weighted NLL - LMModel.forward| {worst_sum:.1e} (sum), "
        f"{worst_mean:.1e} (per step)")
  assert worst_mean <= step_tolerance(weights), worst_mean


@pytest.mark.slow
def test_meshes_agree(converted):
  config, params = load(converted)
  items = stream_items(np.random.default_rng(7), config, PAPER_S2S, count=5)
  one = score(config, params, items, PAPER_S2S, share=True, mesh=sharding.make_mesh("data:1", jax.devices()[:1]),
              batch_size=1)
  many = score(config, params, items, PAPER_S2S, share=True, mesh=sharding.make_mesh("data:4,model:2"), batch_size=4)
  np.testing.assert_array_equal(one.n_tokens, many.n_tokens)
  np.testing.assert_allclose(one.mean_nll, many.mean_nll, atol=1e-4, equal_nan=True)


def test_codes_beyond_the_card_are_named(converted):
  config, params = load(converted)
  items = stream_items(np.random.default_rng(3), config, PAPER_S2S, count=1)
  bad = items[0].candidates[0].copy()
  bad[1, 2] = config.card + 5
  items = [streams.StreamItem(items[0].prefix, (bad,) + items[0].candidates[1:], items[0].scored, "q0")]
  with pytest.raises(ValueError, match=r"stream 2\] = 37 is outside the codebook \(32 ids and the initial token\)"):
    score(config, params, items, PAPER_S2S, share=True)


def test_scored_streams_must_have_a_head():
  config = moshi_family.parse_config(TINY)
  items = stream_items(np.random.default_rng(0), config, (0, 0, 0, 0, 1), count=1)  # the 4th codebook, read only
  with pytest.raises(packing.PackingError, match=r"scored streams \[4\] must be among the 4 streams"):
    streams.pack_streams(items, packing.RowShape(64, 32, 6), layout_of(config))


def test_protocols_say_which_streams_count():
  """s2s: every own codebook, the semantic one (stream 1) weighing 100 and each acoustic one 1, the text stream
  silent and unscored (the Moshi paper, §5.4); s2t and t2t: the text stream; t2s refused by name. A side is laid
  from its audio (on Moshi's own codebooks) or its text, never both."""
  assert moshi_protocol.stream_weights("s2s", 3) == (0, 100, 1, 1)
  assert moshi_protocol.stream_weights("s2s", 8) == (0, 100, 1, 1, 1, 1, 1, 1, 1)  # moshiko's 8 own codebooks
  assert moshi_protocol.stream_weights("s2t", 3) == moshi_protocol.stream_weights("t2t", 3) == (1, 0, 0, 0)
  assert streams.scored_streams((0, 100, 1, 1)) == (1, 2, 3)
  with pytest.raises(SpecError, match="t2s is refused for Moshi"):
    moshi_protocol.stream_weights("t2s", 3)
  text, audio = np.arange(4), np.arange(12).reshape(4, 3)
  spoken = moshi_protocol.lay_streams(3, audio=audio)
  assert spoken.shape == (4, 4) and (spoken[:, 0] == -1).all() and (spoken[:, 1:] == audio).all()
  written = moshi_protocol.lay_streams(3, text=text)
  assert (written[:, 0] == text).all() and (written[:, 1:] == -1).all()
  with pytest.raises(SpecError, match=r"audio codes must be \[T, 3\]"):
    moshi_protocol.lay_streams(3, audio=np.zeros((4, 8)))


@pytest.mark.slow
def test_rows_of_the_predicted_streams_score_as_rows_of_every_stream(converted):
  """A spec lays only the text and the model's own codebooks: the user's streams the scorer adds as silence give
  the numbers of rows that carry them silent."""
  config, params = load(converted)
  rng = np.random.default_rng(11)
  items = []
  weights = (1, 100, 1, 0, 0)  # the text, the semantic and one acoustic codebook
  for item in stream_items(rng, config, weights):
    silence = lambda x: np.concatenate([x[:, :1 + config.dep_q], np.full((len(x), config.n_q - config.dep_q), -1)], 1)
    items.append(streams.StreamItem(silence(item.prefix), tuple(silence(c) for c in item.candidates), item.scored))
  full = score(config, params, items, weights, share=True)
  own = streams.StreamLayout(config.delays[:1 + config.dep_q], config.initial_ids[:1 + config.dep_q], 1 + config.dep_q)
  laid = [streams.StreamItem(i.prefix[:, :1 + config.dep_q], tuple(c[:, :1 + config.dep_q] for c in i.candidates),
                             i.scored) for i in items]
  rows, _ = streams.pack_streams(laid, packing.RowShape(64, 32, 6), own)
  rows = streams.weigh_streams(rows, weights[: 1 + config.dep_q])
  nll_sum, n_tokens = moshi_family.scorer(config, packing.RowShape(64, 32, 6), batch_size=2).score(params, rows)
  short = collect(rows, nll_sum, n_tokens)
  np.testing.assert_array_equal(short.n_tokens, full.n_tokens)
  np.testing.assert_allclose(short.nll_sum, full.nll_sum, rtol=1e-6, atol=1e-5, equal_nan=True)
