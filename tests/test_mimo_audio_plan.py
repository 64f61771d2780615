"""MiMo-Audio-7B-Base at its real size, from the registered config.json (no weights): the parameters the planner
holds and the stack it costs."""

import dataclasses

import pytest


def test_mimo_audio_7b_is_planned_at_its_real_size():
  """Hidden 4096 x 36 layers with GQA 32/8 and a 151,680-row table, the patch decoder 1024 x 16 and the input local
  transformer 1024 x 6 (64 heads each), 8 channels of 4-frame patches: every parameter held (the global stack's
  and the rest, each counted from its shapes), the step costed as the global stack."""
  from s2sjax.scoring import planner

  config = planner.named_models()["mimo-audio-7b"]
  d, local, inner = config.decoder, config.local, config.input_local
  assert (d.hidden_size, d.num_layers, d.num_heads, d.num_kv_heads, d.head_dim, d.vocab_size) == (
      4096, 36, 32, 8, 128, 151680)
  assert (local.hidden_size, local.num_layers, local.num_heads, local.intermediate_size) == (1024, 16, 64, 4096)
  assert (inner.hidden_size, inner.num_layers, inner.intermediate_size) == (1024, 6, 4096)
  assert (config.group_size, config.channels, config.delays) == (4, 8, tuple(range(8)))
  # the rest: the two local stacks' layers and norms, 8 tables and heads, the two downcasts
  layer = lambda c: (dataclasses.replace(c, num_layers=2).num_params()
                     - dataclasses.replace(c, num_layers=1).num_params())
  rest = (16 * layer(local) + 6 * layer(inner) + 2 * 1024 + 2 * sum(config.speech_vocab_sizes) * 1024
          + 4 * 1024 * 4096 + 4096 * 1024)
  assert config.num_params() == d.num_params() + rest
  p = planner.plan(config, "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["fits"] and p["params_gib"] == pytest.approx(config.num_params() * 2 / 2 / 2**30)
  decoder = planner.plan(d, "v5e-8", 2048, 8, "bfloat16", 12.5, 0.4)
  assert p["total_seconds"] == decoder["total_seconds"] and p["activations_gib"] == decoder["activations_gib"]
