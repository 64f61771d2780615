"""The batched runner of the JAX audio tokenizers: length buckets, segments, device padding and order, held to a
hand-written numpy rule on a toy tokenizer."""

import numpy as np
import pytest

from tasks.audio.jax_tokenizer import JaxAudioTokenizer, bucket_length


class RunningMeanTokenizer(JaxAudioTokenizer):
  """Frames of 4 samples; a frame's code is which of 3 levels the running mean of frame energies up to it is
  nearest to: causal, so it reads every earlier frame of its own row and none of the padding."""

  sample_rate = 16
  frame_rate = 4.0
  num_codebooks = 1
  codebook_sizes = (3,)
  time_multiple = 2
  segment_samples = 40

  def __init__(self):
    self.params = {"levels": np.array([0.0, 0.5, 1.0], np.float32)}

  def prepare(self, segment):
    frames = len(segment) // 4
    return (segment[: frames * 4].reshape(frames, 4) ** 2).mean(-1, keepdims=True).astype(np.float32), frames

  def apply(self, params, features, lengths):
    import jax.numpy as jnp

    energy = features[..., 0]
    mean = jnp.cumsum(energy, axis=1) / jnp.arange(1, energy.shape[1] + 1)
    return jnp.argmin(jnp.abs(mean[..., None] - params["levels"]), axis=-1)[..., None].astype(jnp.int32)

  def identity(self):
    return {"type": "toy"}


def by_hand(wave):
  codes = []
  for start in range(0, len(wave), 40):
    segment = wave[start:start + 40]
    energy = (segment[: len(segment) // 4 * 4].reshape(-1, 4) ** 2).mean(-1)
    mean = np.cumsum(energy) / np.arange(1, len(energy) + 1)
    codes += np.abs(mean[:, None] - np.array([0.0, 0.5, 1.0])).argmin(-1).tolist()
  return np.array(codes, np.int32)[:, None]


def test_codes_follow_the_rule_alone_and_in_batches_of_any_lengths():
  rng = np.random.default_rng(0)
  waves = [rng.uniform(-1.2, 1.2, n).astype(np.float32) for n in (13, 40, 41, 97, 5, 160, 8)]
  tokenizer = RunningMeanTokenizer()
  tokenizer.batch_frames = 24  # several batches per bucket, each padded to the device count
  together = tokenizer.encode_batch(waves)
  for wave, codes in zip(waves, together):
    np.testing.assert_array_equal(codes, by_hand(wave))
    np.testing.assert_array_equal(tokenizer.encode(wave, "alone"), codes)


def test_a_wave_shorter_than_a_frame_gives_no_codes():
  assert RunningMeanTokenizer().encode_batch([np.ones(3, np.float32)])[0].shape == (0, 1)


def test_buckets_grow_geometrically_and_respect_the_multiple():
  # 100 frames: 2^(ceil(8 log2 100) / 8) = 2^6.75 = 107.6, up to 108, then to the multiple 112
  assert [bucket_length(n, 8) for n in (1, 8, 9, 100, 1000)] == [8, 8, 16, 112, 1024]
  assert all(bucket_length(n, 1) >= n for n in range(1, 3000))
  assert max(bucket_length(n, 1) / n for n in range(128, 30000)) < 1.1  # 2^(1/8) = 1.0905, then whole frames


def test_long_buckets_take_fewer_rows_so_attention_stays_bounded():
  from tasks.audio.jax_tokenizer import ATTENTION_BYTES, BATCH_FRAMES

  tokenizer = RunningMeanTokenizer()
  assert tokenizer.batch_rows(100) == BATCH_FRAMES // 100  # no attention layer: frames alone decide
  tokenizer.attention_heads, tokenizer.attention_stride = 20, 2
  # 3000 frames: 1500 steps; one row's [20, 1500, 1500] fp32 weights are 180 MB, so one row fits 256 MiB
  assert (tokenizer.batch_rows(3000), ATTENTION_BYTES) == (1, 1 << 28)
  assert tokenizer.batch_rows(600) == (1 << 28) // (20 * 4 * 300 * 300) == 37  # not BATCH_FRAMES // 600 = 54
  assert tokenizer.batch_rows(100) == BATCH_FRAMES // 100


def test_bf16_and_a_bad_dtype():
  tokenizer = RunningMeanTokenizer().configure(dtype="bfloat16")
  assert tokenizer.encode(np.full(16, 0.9, np.float32), "x").tolist() == [[2]] * 4
  with pytest.raises(ValueError, match="float16"):
    RunningMeanTokenizer().configure(dtype="float16")


def test_placed_weights_are_the_host_weights_not_a_second_copy():
  """On a CPU the runner's weights are the tokenizer's own arrays, 64-byte aligned so XLA reads them in place."""
  from tasks.audio.jax_tokenizer import aligned

  tokenizer = RunningMeanTokenizer()
  odd = np.zeros(67, np.uint8)[3:].view(np.float32)  # 64 bytes at an address that is 3 past an allocation's
  copy = aligned(odd)
  assert copy is not odd and copy.ctypes.data % 64 == 0 and aligned(copy) is copy
  np.testing.assert_array_equal(copy, odd)
  placed = tokenizer.runner.params["levels"]
  assert np.shares_memory(np.asarray(placed), tokenizer.params["levels"])
  np.testing.assert_array_equal(np.asarray(placed), [0.0, 0.5, 1.0])


def test_first_argmin_is_argmin_ties_included():
  from tasks.audio.ops import first_argmin

  rng = np.random.default_rng(1)
  distances = rng.integers(0, 6, (64, 300)).astype(np.float32)  # many equal minima per row
  distances[3] = 7.0  # a row of nothing but ties
  found = np.asarray(first_argmin(distances))
  np.testing.assert_array_equal(found, distances.argmin(-1))
  assert found.dtype == np.int32 and found[3] == 0
