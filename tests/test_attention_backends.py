"""Every attention implementation gives the XLA path's numbers where it runs here (flash: Pallas interpret mode)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s2sjax.runtime import sharding
from s2sjax.model.attention import (LOCAL_BLOCK, LocalWindow, gathered_windows, local_window, local_window_mask,
  masked_attention, packed_attention_mask)
from s2sjax.model.attention import xla as xla_kernels
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import init_params
from s2sjax.data.packing import RowShape, fit, pack
from s2sjax.scoring.scorer import Scorer, _has_shared_prefixes, collect
from tests.scoring_cases import random_items

CONFIG = ModelConfig(
  family="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
  head_dim=16, rope_theta=10000.0, rotary_dim=16, rope_interleaved=False, rms_norm_eps=1e-6, qkv_bias=True,
  o_bias=False, mlp_bias=False, tie_embeddings=False,
)


@pytest.mark.slow
def test_dot_product_attention_equals_xla_on_a_prefix_shared_mask():
  rows, _ = pack(random_items(4, 512, seed=1), RowShape(256, 128, 16))
  mask = packed_attention_mask(jnp.asarray(rows["segment_ids"]), jnp.asarray(rows["branch_ids"]))
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  batch = len(rows["tokens"])
  q = jax.random.normal(keys[0], (batch, 256, 4, 16))
  k, v = (jax.random.normal(key, (batch, 256, 2, 16)) for key in keys[1:])
  real = rows["segment_ids"] > 0
  xla = np.asarray(masked_attention(q, k, v, mask, jax.lax.Precision.HIGHEST))[real]
  fused = np.asarray(masked_attention(q, k, v, mask, implementation="dot_product"))[real]
  np.testing.assert_allclose(fused, xla, atol=1e-5)


def _random_qkv(batch, length, heads=4, kv_heads=2, head_dim=16, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(keys[0], (batch, length, heads, head_dim))
  k, v = (jax.random.normal(key, (batch, length, kv_heads, head_dim)) for key in keys[1:])
  return q, k, v


@pytest.mark.slow
def test_flash_shared_equals_xla_on_prefix_shared_rows():
  # three blocks of 128: the kernel's online softmax across key blocks, and query blocks whose causal diagonal
  # skips key blocks (the one-block path is the hand-laid rows' below)
  length = 384
  rows, _ = pack(random_items(8, 512, seed=5), RowShape(length, 128, 16))
  segments, branches = jnp.asarray(rows["segment_ids"]), jnp.asarray(rows["branch_ids"])
  # several items per row, each with 2 or 4 candidates branching from its prefix, and padding at the ends
  assert _has_shared_prefixes(rows) and (rows["segment_ids"] == 0).any() and rows["segment_ids"].max() >= 2
  q, k, v = _random_qkv(len(rows["tokens"]), length)  # GQA: 4 heads over 2 kv heads
  dense = masked_attention(q, k, v, packed_attention_mask(segments, branches), jax.lax.Precision.HIGHEST)
  cascade = np.asarray(masked_attention(q, k, v, None, implementation="flash_shared", segment_ids=segments,
                                        branch_ids=branches))
  real = rows["segment_ids"] > 0
  assert np.isfinite(cascade).all()  # padding queries see nothing in either pass: zeros, not NaNs
  np.testing.assert_allclose(cascade[real], np.asarray(dense)[real], atol=1e-5)
  assert (cascade[~real] == 0).all()


@pytest.mark.slow
def test_flash_shared_equals_xla_on_hand_laid_rows():
  # edge cases the packer does not make: an item without a prefix (its queries see nothing in the prefix pass), a
  # one-token branch, branch ids out of candidate order, padding between items, and a row with no sharing at all
  segments = np.zeros((2, 128), np.int32)
  branches = np.zeros((2, 128), np.int32)
  segments[0, :10], branches[0, 3:6], branches[0, 6:7], branches[0, 7:10] = 1, 2, 3, 1
  segments[0, 10:20], branches[0, 10:14], branches[0, 14:20] = 2, 1, 2
  segments[0, 25:60], branches[0, 25:40], branches[0, 40:60] = 3, 0, 1
  segments[1, :50], segments[1, 50:128] = 1, 2
  q, k, v = _random_qkv(2, 128, seed=3)
  segments, branches = jnp.asarray(segments), jnp.asarray(branches)
  dense = masked_attention(q, k, v, packed_attention_mask(segments, branches), jax.lax.Precision.HIGHEST)
  cascade = np.asarray(masked_attention(q, k, v, None, implementation="flash_shared", segment_ids=segments,
                                        branch_ids=branches))
  real = np.asarray(segments) > 0
  assert np.isfinite(cascade).all()
  np.testing.assert_allclose(cascade[real], np.asarray(dense)[real], atol=1e-5)
  # without sharing it is the one-pass kernel's attention
  flash = masked_attention(q, k, v, None, implementation="flash", segment_ids=segments)
  np.testing.assert_allclose(cascade[1], np.asarray(flash)[1], atol=1e-5)


@pytest.mark.slow
def test_flash_shared_scorer_equals_xla_on_shared_rows_and_a_mesh():
  params = init_params(CONFIG, jax.random.PRNGKey(0))
  items = random_items(6, 512, seed=2)
  shape = RowShape(256, 128, 16)
  rows, _ = pack(items, shape)  # prefix-shared: what `flash` refuses
  assert _has_shared_prefixes(rows)
  one = sharding.make_mesh("data:1", jax.devices()[:1])
  xla = collect(rows, *Scorer(CONFIG, shape, mesh=one, batch_size=2, attention="xla").score(
    params, rows, progress=False)).mean_nll
  for mesh, batch in [(one, 2), (sharding.make_mesh("data:2,model:2", jax.devices()[:4]), 2)]:
    scorer = Scorer(CONFIG, shape, mesh=mesh, batch_size=batch, attention="flash_shared")
    cascade = collect(rows, *scorer.score(params, rows, progress=False)).mean_nll
    np.testing.assert_allclose(cascade, xla, atol=1e-5, equal_nan=True, err_msg=str(mesh.shape))


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["dot_product", "flash"])
def test_scorer_backends_equal_xla(attention):
  params = init_params(CONFIG, jax.random.PRNGKey(0))
  items = random_items(6, 512, seed=2)
  shape = RowShape(256, 128, 16)
  rows, _ = pack(items, shape, share_prefix=False)  # flash needs rows without shared branches
  mesh = sharding.make_mesh("data:1", jax.devices()[:1])
  scores = {}
  for name in ("xla", attention):
    nll_sum, n_tokens = Scorer(CONFIG, shape, mesh=mesh, batch_size=2, attention=name).score(params, rows, progress=False)
    scores[name] = collect(rows, nll_sum, n_tokens).mean_nll
  np.testing.assert_allclose(scores[attention], scores["xla"], atol=1e-4, equal_nan=True)


def test_flash_refuses_prefix_shared_rows():
  rows, _ = pack(random_items(3, 512), RowShape(256, 128, 16))
  with pytest.raises(ValueError, match="flash attention cannot express prefix-shared branches"):
    Scorer(CONFIG, RowShape(256, 128, 16), attention="flash").score(init_params(CONFIG, jax.random.PRNGKey(0)), rows)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("attention", ["xla", "dot_product"])
def test_every_matmul_of_an_fp32_step_asks_for_highest_precision(attention, tied):
  # TPU's DEFAULT precision is one bf16 pass: a matmul without HIGHEST would break "fp32 within 1e-4 of PyTorch"
  # there while CPU tests still pass (the tied head via Embed.attend, jax.nn.dot_product_attention: both had none)
  config = dataclasses.replace(CONFIG, tie_embeddings=tied)
  scorer = Scorer(config, RowShape(256, 128, 16), mesh=sharding.make_mesh("data:1", jax.devices()[:1]),
                  batch_size=1, attention=attention)
  matmuls = [line for line in scorer.lower_abstract().as_text().splitlines() if "dot_general" in line]
  assert len(matmuls) >= 10  # the scanned layer's q k v o gate up down and two in attention, then the head
  assert all("HIGHEST" in line for line in matmuls), [line for line in matmuls if "HIGHEST" not in line]


@pytest.mark.parametrize("attention", ["flash", "flash_shared"])
@pytest.mark.parametrize("mesh", ["data:8", "data:4,model:2", "model:8"])
def test_the_flash_step_lowers_for_tpu_on_a_mesh(mesh, attention, monkeypatch):
  # XLA cannot partition a Mosaic kernel ("wrap the call in a shard_map"): lowered for TPU from this CPU host, the
  # real kernel (not interpret mode) must run per device on every mesh
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  config = dataclasses.replace(CONFIG, head_dim=128)  # the TPU kernel's lane width
  scorer = Scorer(config, RowShape(256, 128, 16), mesh=sharding.make_mesh(mesh), batch_size=8, attention=attention,
                  dtype=jnp.bfloat16)
  text = scorer.lower_abstract(jnp.bfloat16, platforms=("tpu",)).as_text()
  # the scanned layer's body holds the kernel once, the cascade twice (prefix pass, branch pass)
  assert text.count("tpu_custom_call") == (2 if attention == "flash_shared" else 1), text.count("tpu_custom_call")


@pytest.mark.slow
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("implementation", ["xla", "dot_product"])
def test_item_local_attention_equals_the_dense_mask(implementation, share):
  rows, report = pack(random_items(12, 512, seed=1), RowShape(512, 256, 32), share_prefix=share)
  window = local_window(fit(rows, RowShape(512, 256, 32), report.longest_item)[1].max_item, 512)
  assert window is not None and window.reach >= report.longest_item - 1 and window.span < 512
  segments, branches = jnp.asarray(rows["segment_ids"]), jnp.asarray(rows["branch_ids"])
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  batch = len(rows["tokens"])
  q = jax.random.normal(keys[0], (batch, 512, 4, 16))
  k, v = (jax.random.normal(key, (batch, 512, 2, 16)) for key in keys[1:])
  real = rows["segment_ids"] > 0  # padding queries see nothing either way; no real token reads them
  dense = masked_attention(q, k, v, packed_attention_mask(segments, branches), jax.lax.Precision.HIGHEST)
  mask = local_window_mask(segments, branches, window)
  local = masked_attention(q, k, v, mask, jax.lax.Precision.HIGHEST, implementation, segments, branches, window)
  np.testing.assert_allclose(np.asarray(local)[real], np.asarray(dense)[real], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_item_local_blocks_looped_equal_all_at_once_on_a_mesh_too(dtype):
  """The CPU's schedule (one query block after another) and the accelerators' (every block in one matmul): in fp32
  the same bits, rows sharded over data and heads over model too; in bf16, where XLA:CPU rounds a batched matmul's
  bf16 products by the shape, within bf16's rounding of the values summed (magnitude ~1)."""
  rows, report = pack(random_items(16, 256, seed=2), RowShape(256, 128, 16))
  window = local_window(fit(rows, RowShape(256, 128, 16), report.longest_item)[1].max_item, 256)
  assert window is not None and window.span < 256
  eight_rows = lambda x: jnp.asarray(np.resize(x, (8, 256)))  # as many rows as the mesh's data shards
  mask = local_window_mask(eight_rows(rows["segment_ids"]), eight_rows(rows["branch_ids"]), window)
  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  q = jax.random.normal(keys[0], (8, 256, 8, 16), dtype)
  k, v = (jax.random.normal(key, (8, 256, 4, 16), dtype) for key in keys[1:])
  local = lambda looped: jax.jit(lambda q, k, v, mask: xla_kernels.local_attention(q, k, v, mask, window,
                                                                                   looped=looped))
  for mesh in ("data:1", "data:4,model:2"):
    by_head = jax.sharding.NamedSharding(sharding.make_mesh(mesh, jax.devices()[: 1 if mesh == "data:1" else 8]),
                                         jax.sharding.PartitionSpec("data", None, "model"))
    placed = [jax.device_put(x, by_head) for x in (q, k, v)]
    looped, at_once = (np.asarray(local(looped)(*placed, mask), np.float32) for looped in (True, False))
    if dtype == jnp.float32:
      np.testing.assert_array_equal(looped, at_once, err_msg=mesh)
    else:
      np.testing.assert_allclose(looped, at_once, atol=2**-5, err_msg=mesh)


@pytest.mark.slow
@pytest.mark.parametrize("item", [168, 600])
def test_an_items_attention_is_the_same_bits_whatever_the_runs_longest_item(item):
  """Neighbour-free windows (`packing.neighbour_free_bound`): an item alone in a row, at the start and 96 tokens in,
  attended over the window its own length needs and over the window of any longer item a run may hold, gives the
  same bits (SmolLM2-135M's heads; one and two leaves of 512 keys, packing.REDUCTION_LEAF). A window reaching back
  512 keys, a multiple of 64 whose keys cross a leaf, moves the shorter item: half of its outputs here."""
  from s2sjax.data.packing import neighbour_free_bound

  length, heads, kv_heads, head_dim = 1024, 9, 3, 64
  keys = jax.random.split(jax.random.PRNGKey(item), 3)
  q = jax.random.normal(keys[0], (item, heads, head_dim))
  k, v = (jax.random.normal(key, (item, kv_heads, head_dim)) for key in keys[1:])

  def attention(longest: int, start: int) -> np.ndarray:
    window = LocalWindow(LOCAL_BLOCK, neighbour_free_bound(longest) - 1)
    segment_ids = jnp.zeros((1, length), jnp.int32).at[0, start:start + item].set(1)
    mask = local_window_mask(segment_ids, jnp.zeros_like(segment_ids), window)
    lay = lambda x: jnp.zeros((1, length, *x.shape[1:])).at[0, start:start + item].set(x)
    out = jax.jit(lambda q, k, v, mask: xla_kernels.local_attention(q, k, v, mask, window, looped=True))(
      lay(q), lay(k), lay(v), mask)
    return np.asarray(out)[0, start:start + item]

  own = attention(item, 0)
  for longest in sorted({item, 500, 700, 1000, 1500} - set(range(item))):
    for start in (0, 96):
      np.testing.assert_array_equal(attention(longest, start), own, err_msg=f"longest {longest}, at {start}")


@pytest.mark.slow
def test_gathered_windows_over_shared_roots_equal_the_dense_mask_looped_or_all_at_once():
  """Rows with shared roots (packing.SharedRoot) through `gathered_windows`: the CPU's schedule and the
  accelerators' give the same bits, and both equal attention under the rows' dense mask (each rest sees its root
  and itself) at every real position."""
  from s2sjax.data.packing import Item, SharedRoot, neighbour_free_bound

  rng = np.random.default_rng(7)
  root = rng.integers(1, 200, 64)
  items = [Item(np.r_[root, rng.integers(1, 200, n)], (np.array([3]), np.array([4])), name=f"q{n}")
           for n in (5, 40, 17, 0, 29)] + random_items(3, 256, seed=8)
  rows, report = pack(items, RowShape(256, 128, 32), align=32, roots=[SharedRoot(64, (0, 1, 2, 3, 4))])
  assert report.shared_roots >= 1 and rows["key_shift"].any()
  window = LocalWindow(LOCAL_BLOCK, neighbour_free_bound(report.longest_item) - 1)
  segment_ids, branch_ids = jnp.asarray(rows["segment_ids"]), jnp.asarray(rows["branch_ids"])
  gathered = gathered_windows(segment_ids, branch_ids, jnp.asarray(rows["key_shift"]), window)
  keys = jax.random.split(jax.random.PRNGKey(2), 3)
  batch, length = rows["segment_ids"].shape
  q = jax.random.normal(keys[0], (batch, length, 8, 16))
  k, v = (jax.random.normal(key, (batch, length, 4, 16)) for key in keys[1:])
  local = lambda looped: np.asarray(jax.jit(lambda q, k, v, g: xla_kernels.local_attention(
    q, k, v, g.mask, window, looped=looped, keys=g.keys))(q, k, v, gathered))
  looped, at_once = local(True), local(False)
  np.testing.assert_array_equal(looped, at_once)
  dense = np.asarray(xla_kernels.dense_attention(q, k, v, packed_attention_mask(segment_ids, branch_ids)))
  real = rows["segment_ids"] > 0
  np.testing.assert_allclose(looped[real], dense[real], atol=1e-5)


def test_the_window_is_the_narrowest_exact_one_or_none():
  assert local_window(0, 1024) is None  # no recorded longest item: dense
  assert local_window(150, 1024) == LocalWindow(block=32, reach=160)  # keys back to 149 before
  assert local_window(65, 1024) == LocalWindow(block=32, reach=64)
  assert local_window(500, 512) is None and local_window(100, 1000) is None  # no narrower; no block


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["xla", "dot_product"])
def test_item_local_scorer_equals_dense_on_every_mesh(attention):
  params = init_params(CONFIG, jax.random.PRNGKey(0))
  items = random_items(20, 512, seed=4)
  rows, report = pack(items, RowShape(512, 256, 32))
  rows, shape = fit(rows, RowShape(512, 256, 32), report.longest_item)
  one = sharding.make_mesh("data:1", jax.devices()[:1])
  dense = collect(rows, *Scorer(CONFIG, shape, mesh=one, batch_size=2, attention="xla",
                                local_attention=False).score(params, rows, progress=False)).mean_nll
  for mesh in ["data:8", "data:4,model:2", "data:2,model:4"]:
    scorer = Scorer(CONFIG, shape, mesh=sharding.make_mesh(mesh), batch_size=8, attention=attention)
    assert scorer.window is not None
    local = collect(rows, *scorer.score(params, rows, progress=False)).mean_nll
    np.testing.assert_allclose(local, dense, atol=1e-5, equal_nan=True, err_msg=mesh)
  # no [L, L] mask in the item-local step: its widest attention buffer is a query block's window
  text = Scorer(CONFIG, shape, mesh=one, batch_size=1, attention=attention).lower_abstract().as_text()
  assert "512x512" not in text


def test_item_local_scoring_refuses_rows_with_longer_items_than_recorded():
  rows, report = pack(random_items(6, 512, seed=3), RowShape(512, 256, 32))
  shape = RowShape(512, 256, 32, max_item=64)
  assert report.longest_item > 64
  with pytest.raises(ValueError, match=f"an item of {report.longest_item} tokens, beyond the 64"):
    Scorer(CONFIG, shape, attention="xla").score(init_params(CONFIG, jax.random.PRNGKey(0)), rows, progress=False)


@pytest.mark.slow
def test_a_step_reads_rows_of_narrower_tables_and_refuses_wider_ones():
  """Rows fitted to their own tables (packing.fit) score the same through their own step, through a step with the
  packer's wider tables (what the Evaluator shares between tasks of one row length), and unfitted."""
  rows, report = pack(random_items(6, 512, seed=3), RowShape(512, 256, 32))
  fitted, shape = fit(rows, RowShape(512, 256, 32), report.longest_item)
  assert shape.max_targets < 256 and shape.max_slots == 32
  params = init_params(CONFIG, jax.random.PRNGKey(0))
  wide = RowShape(512, 256, 32, max_item=shape.max_item)
  own = Scorer(CONFIG, shape, attention="xla").score(params, fitted, progress=False)
  wide_step = Scorer(CONFIG, wide, attention="xla")
  for scored in (fitted, rows):
    nll_sum, n_tokens = wide_step.score(params, scored, progress=False)
    np.testing.assert_array_equal(n_tokens, own[1])
    np.testing.assert_allclose(nll_sum, own[0], rtol=1e-6)
  with pytest.raises(ValueError, match=f"rows' target_pos is \\[{len(rows['target_pos'])}, 256\\], the step's .* reads "
                                       f"\\[rows, {shape.max_targets}\\] or narrower"):
    Scorer(CONFIG, shape, attention="xla").score(params, rows, progress=False)
  few_slots = RowShape(512, 256, 2, max_item=shape.max_item)  # the rows' targets name slots up to 3 or more
  with pytest.raises(ValueError, match="rows score candidate slot [0-9]+, beyond the 2 slots"):
    Scorer(CONFIG, few_slots, attention="xla").score(params, rows, progress=False)
