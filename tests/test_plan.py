"""The planner's memory figures agree with XLA's memory analysis of the compiled scoring step (within 20%); its
named architectures are the published configs'."""

import dataclasses

import jax
import numpy as np
import pytest

from s2sjax.data import task_registry
from s2sjax.scoring import planner
from s2sjax.runtime import sharding
from s2sjax.model.config import ModelConfig
from s2sjax.data.packing import RowShape
from s2sjax.scoring.scorer import Scorer


def _config(hidden, inter, layers, heads, kv, vocab):
  return ModelConfig(family="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads, rope_theta=1e4,
                     rotary_dim=hidden // heads, rope_interleaved=False, rms_norm_eps=1e-6, qkv_bias=True,
                     o_bias=False, mlp_bias=False, tie_embeddings=False)


@pytest.mark.parametrize("hidden,inter,layers,heads,kv,vocab,length,rows", [
  (256, 688, 4, 8, 2, 8000, 512, 2),
  (512, 1376, 4, 8, 4, 32000, 1024, 1),
  (384, 1024, 6, 6, 2, 16000, 2048, 1),
])
def test_planned_memory_matches_xla_memory_analysis(hidden, inter, layers, heads, kv, vocab, length, rows):
  config = _config(hidden, inter, layers, heads, kv, vocab)
  shape = RowShape.for_length(length)
  scorer = Scorer(config, shape, mesh=sharding.make_mesh("data:1", jax.devices()[:1]), batch_size=rows)
  analysis = scorer.lower_abstract().compile().memory_analysis()
  measured = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
  planned = planner.param_bytes(config, "float32") + planner.activation_bytes(config, rows, length, "float32")
  assert planned == pytest.approx(measured, rel=0.2), (planned / 1e6, measured / 1e6)
  assert planner.activation_bytes(config, rows, length, "float32") == pytest.approx(analysis.temp_size_in_bytes, rel=0.2)


def test_plan_picks_a_mesh_that_fits_and_times_the_benchmark():
  p = planner.plan(planner.named_models()["qwen2.5-7b"], "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["fits"] and p["mesh"] == "data:4,model:2" and p["total_gib"] < 0.9 * 16
  assert p["params_gib"] == pytest.approx(planner.named_models()["qwen2.5-7b"].num_params() * 2 / 2 / 2**30)
  one_chip = planner.plan(planner.named_models()["qwen2.5-7b"], "v5e-1", 2048, 8, "bfloat16", 12.5, 0.4)
  assert not one_chip["fits"]  # 15 GB of bf16 weights do not fit one 16 GB v5e chip with activations
  assert set(p["seconds"]) == {f"{t}/{m}" for t in task_registry.names() for m in ("t2t", "s2t")
                               if task_registry.get(t).has_text and task_registry.get(t).release.index == "file"}
  assert p["total_seconds"] == pytest.approx(one_chip["total_seconds"] / 8)
  assert np.isclose(planner.named_models()["qwen2.5-7b"].num_params() / 1e9, 7.6, atol=0.1)  # Qwen2.5-7B has 7.6B parameters


def test_glm_4_voice_9b_is_glm_4_9b_with_its_own_vocabulary_epsilon_and_rope():
  """THUDM/glm-4-voice-9b's config.json: padded_vocab_size 168,960, layernorm_epsilon 3.90625e-08, rope_ratio 1;
  every other size glm-4-9b's."""
  voice, base = planner.named_models()["glm-4-voice-9b"], planner.named_models()["glm-4-9b"]
  assert (voice.vocab_size, voice.rms_norm_eps, voice.rope_theta) == (168960, 3.90625e-08, 10000.0)
  assert dataclasses.replace(voice, vocab_size=base.vocab_size, rms_norm_eps=base.rms_norm_eps) == base
  assert voice.num_params() - base.num_params() == 2 * (168960 - 151552) * 4096  # the embedding's and head's rows


@pytest.mark.slow
def test_activation_sharding_constraints_take_effect_under_fsdp():
  # fsdp splits the weights' embed dim; without the decoder's constraints XLA keeps activations split the same
  # way and gathers whole batches on every chip (3x the memory of plain data parallelism before the fix)
  config = _config(256, 688, 2, 8, 2, 8000)
  per_device = {}
  for mesh in ("data:8", "fsdp:8"):
    scorer = Scorer(config, RowShape.for_length(512), mesh=sharding.make_mesh(mesh), batch_size=8)
    analysis = scorer.lower_abstract().compile().memory_analysis()
    per_device[mesh] = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes
  assert per_device["fsdp:8"] <= 1.1 * per_device["data:8"], per_device
