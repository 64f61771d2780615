"""The upstream oracles (../shared/upstream-oracles: tiny checkpoints in their releases' own layouts, with what the
upstream PyTorch code computed from them) convert as a user converts them, and the converted models' log-probs at
every position are upstream's within 1e-4 (fp32): Baichuan-Audio's `OmniForCausalLM.forward(input_ids,
audios_tokens)` with its linear head and with NormHead, on real and on random codes (each table's extra row
included), and GLM-4's `modeling_chatglm.py` with multi-query, per-head and rope_ratio-500 attention."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from checkpoints_conversion import convert, safetensors_io
from s2sjax.scoring import log_probs
from s2sjax.scoring.checkpoints import checkpoint

ORACLES = Path(__file__).resolve().parents[1].parent / "shared" / "upstream-oracles"
pytestmark = pytest.mark.skipif(not ORACLES.is_dir(), reason="the upstream oracles (../shared/upstream-oracles) are "
                                                             "not beside this checkout")
TOLERANCE = 1e-4  # fp32 log-probs against upstream's
BAICHUAN = ORACLES / "baichuan_llm"
CHATGLM = ORACLES / "chatglm"


def worst(ours: np.ndarray, reference: np.ndarray) -> float:
  assert ours.shape == reference.shape and ours.dtype == np.float32
  return float(np.abs(ours - reference).max())


@pytest.fixture(scope="module")
def baichuan(tmp_path_factory):
  """{head: converted checkpoint} of the Baichuan-Audio oracle: the release as shipped (linear head), and the same
  weights under its config_normhead.json, as a release with use_norm_head=true is laid out."""
  root = tmp_path_factory.mktemp("baichuan")
  normhead = root / "normhead_release"
  normhead.mkdir()
  (normhead / "config.json").write_text((BAICHUAN / "config_normhead.json").read_text())
  os.symlink(BAICHUAN / "model.safetensors", normhead / "model.safetensors")
  out = {}
  for head, source in (("linear", BAICHUAN), ("normhead", normhead)):
    out[head] = str(root / head)
    convert.convert(str(source), out[head])
  return out


@pytest.mark.slow
def test_baichuan_release_converts_leaving_its_audio_tokenizer_out_by_name(baichuan):
  """The release's `audio_tokenizer.*` is left out without flags and reported as the audio tokenizer, which the JAX
  tokenizer reads from the release folder; the audio head is kept."""
  keys = safetensors_io.SafetensorsFile(str(BAICHUAN / "model.safetensors")).keys()
  manifest = checkpoint.load_manifest(baichuan["linear"])
  tokenizer_keys = [k for k in keys if k.startswith("audio_tokenizer.")]
  assert tokenizer_keys and manifest["skipped_modules"] == {"audio_tokenizer.": len(tokenizer_keys)}
  assert sorted(manifest["kept_as_extras"]) == sorted(k for k in keys if k.startswith("audio_head."))
  report = convert.report(manifest, baichuan["linear"])
  assert f"left out audio_tokenizer.* ({len(tokenizer_keys)} tensors): the release's audio tokenizer" in report
  assert "--audio_tokenizer_dir" in report


@pytest.mark.slow
@pytest.mark.parametrize("head,codes,oracle", [
  ("linear", "audios_tokens", "logprobs"),
  ("linear", "audios_tokens_random", "logprobs_randomcodes"),
  ("normhead", "audios_tokens", "logprobs_normhead"),
  ("normhead", "audios_tokens_random", "logprobs_normhead_randomcodes"),
])
def test_baichuan_log_probs_are_omni_for_causal_lm_forward(baichuan, head, codes, oracle):
  ids = np.load(BAICHUAN / "inputs" / "input_ids.npy")
  audio_codes = np.load(BAICHUAN / "inputs" / f"{codes}.npy")
  if codes.endswith("random"):  # the variant reaches each table's extra row (codebook_size + 1 rows)
    sizes = json.loads((BAICHUAN / "config.json").read_text())["audio_config"]["vq_config"]["codebook_sizes"]
    assert audio_codes[0].tolist() == sizes
  ours = log_probs.compute(baichuan[head], ids, audio_codes).text
  error = worst(ours, np.load(BAICHUAN / "outputs" / f"{oracle}.npy"))
  print(f"baichuan {head} head, {codes}: max |log-prob - upstream| {error:.2e}")
  assert error <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["mqa", "mha", "mqa_rope500"])
def test_chatglm_log_probs_are_modeling_chatglm(tmp_path, variant):
  """multi-query (2 groups), per-head qkv, rope_ratio 500: converted with no flags (config.json says chatglm)."""
  out = str(tmp_path / variant)
  convert.convert(str(CHATGLM / variant), out)
  ours = log_probs.compute(out, np.load(CHATGLM / "inputs" / "input_ids.npy")).text
  error = worst(ours, np.load(CHATGLM / variant / "outputs" / "logprobs.npy"))
  print(f"chatglm {variant}: max |log-prob - upstream| {error:.2e}")
  assert error <= TOLERANCE
