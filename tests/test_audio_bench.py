"""The audio bench's Kimi-Audio reference, transformers' `WhisperEncoder` (a tiny shape here, seeded random weights),
saved as the release's `whisper-large-v3/` folder and read by the JAX feature path: the two give the same features
from the same waves, and the FLOPs the bench counts per 30 s window are the encoder's, by hand."""

import numpy as np
import torch

from tasks.audio import kimi_whisper
from s2sjax.benchmarks import audio_tokenizers as bench

TINY = kimi_whisper.EncoderShape(d_model=64, heads=4, ffn=256, layers=2, positions=1500)


def test_kimi_whisper_reference_and_jax_features_agree(tmp_path):
  reference = bench.KimiWhisperReference(TINY)
  reference.save(str(tmp_path))
  jax_side = bench.KimiWhisperReference.jax_tokenizer(str(tmp_path))
  assert jax_side.shape == TINY
  past_one_window = np.random.default_rng(0).normal(0, 0.1, kimi_whisper.WINDOW_SAMPLES + 20800).astype(np.float32)
  waves = bench.recordings(jax_side.sample_rate, 8) + [past_one_window]  # the sample's speech, then two windows
  ours = bench.KimiWhisperReference.encode(jax_side, waves)
  with torch.inference_mode():
    theirs = [reference(reference.host_features(jax_side, wave)) for wave in waves]
  frames = [(len(w) - 1) // 1280 + 1 for w in waves[:-1]] + [375 + 17]  # T per piece, the 30 s pieces joined
  assert [f.shape for f in theirs] == [(t, 4 * TINY.d_model) for t in frames]
  agreement = bench.KimiWhisperReference.compare(ours, theirs)
  assert agreement["features_relative_difference"] < 1e-4, agreement

  d, positions, mel_frames = TINY.d_model, TINY.positions, 2 * TINY.positions
  convolutions = 2 * mel_frames * kimi_whisper.N_MELS * 3 * d + 2 * positions * d * 3 * d
  layer = 2 * positions * (4 * d * d + 2 * d * TINY.ffn) + 2 * 2 * positions**2 * d  # projections, FFN, attention
  windows = len(waves) + 1
  assert reference.flops(jax_side, waves) == windows * (convolutions + TINY.layers * layer)
