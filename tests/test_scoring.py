"""Per-candidate NLL from packed, prefix-shared rows equals the naive reference, on any mesh and batch size, with
item-local attention (the shape records the longest item, as a build does) and with the dense mask."""

import numpy as np
import pytest

import torch

import jax  # noqa: E402

from checkpoints_conversion.convert import convert  # noqa: E402
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import sharding  # noqa: E402
from s2sjax.data.packing import RowShape, fit, pack  # noqa: E402
from s2sjax.scoring.scorer import Scorer, collect  # noqa: E402
from tests.hf_models import audio_inputs_embeds, baichuan_audio_checkpoint, fold_norm_head, save_hf, tiny_model  # noqa: E402
from tests.scoring_cases import random_items, reference_mean_nll  # noqa: E402

SHAPE = RowShape(length=512, max_targets=256, max_slots=32)  # rows long enough for item-local windows


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
  model = tiny_model("qwen2")
  out = tmp_path_factory.mktemp("qwen2")
  convert(save_hf(model, str(out / "hf")), str(out / "ckpt"))
  return model, checkpoint.load_config(out / "ckpt"), checkpoint.load_params(out / "ckpt")


def _score(config, params, items, shape=SHAPE, share=True, mesh=None, batch_size=4, local=True):
  rows, report = pack(items, shape, share_prefix=share)
  rows, fitted = fit(rows, shape, report.longest_item)
  scorer = Scorer(config, fitted, mesh=mesh, batch_size=batch_size, local_attention=local)
  assert (scorer.window is not None) == local
  nll_sum, n_tokens = scorer.score(params, rows, progress=False)
  return collect(rows, nll_sum, n_tokens, [len(it.candidates) for it in items]), report


def test_text_prefix_matches_naive_reference(qwen2):
  model, config, params = qwen2
  items = random_items(14, config.vocab_size)
  scores, report = _score(config, params, items)
  reference = reference_mean_nll(model, items)
  np.testing.assert_allclose(scores.mean_nll, reference, atol=1e-4, equal_nan=True)
  expected_tokens = [[len(c) for c in it.candidates] + [0] * (4 - len(it.candidates)) for it in items]
  np.testing.assert_array_equal(scores.n_tokens, expected_tokens)
  assert report.tokens_saved_by_sharing == sum((len(it.candidates) - 1) * len(it.prefix) for it in items)


def test_sharing_on_and_off_agree(qwen2):
  _, config, params = qwen2
  items = random_items(14, config.vocab_size, seed=1)
  shared, shared_report = _score(config, params, items, share=True)
  separate, separate_report = _score(config, params, items, share=False)
  np.testing.assert_allclose(shared.mean_nll, separate.mean_nll, atol=1e-5, equal_nan=True)
  assert shared_report.real_tokens < separate_report.real_tokens


@pytest.mark.slow
def test_a_candidates_score_is_the_same_bits_whatever_shares_its_row(qwen2):
  """Items packed at multiples of 32 and scored neighbour-free: an item among other neighbours, at another place
  in its row, under a window that reaches further back (a longer item in the run), scores exactly the same."""
  import dataclasses

  from s2sjax.data.packing import NEIGHBOUR_FREE_ALIGN, Item, neighbour_free_bound

  _, config, params = qwen2
  items = random_items(16, config.vocab_size, seed=9)
  long = Item(np.arange(1, 300) % 500, (np.arange(7, 12),), name="long")  # reach 320, not 128

  def scores(chosen):
    rows, report = pack(chosen, SHAPE, align=NEIGHBOUR_FREE_ALIGN)
    rows, shape = fit(rows, SHAPE, report.longest_item)
    scorer = Scorer(config, dataclasses.replace(shape, max_item=neighbour_free_bound(report.longest_item)),
                    batch_size=4, neighbour_free=True)
    nll_sum, n_tokens = scorer.score(params, rows, progress=False)
    collected = collect(rows, nll_sum, n_tokens, [len(it.candidates) for it in chosen])
    return {it.name: (collected.nll_sum[i], placement(rows, i, chosen)) for i, it in enumerate(chosen)}, scorer.window

  def placement(rows, index, chosen):
    """Where item `index` starts in its row, and the names of the items sharing that row."""
    r, c = np.argwhere(rows["slot_item"] == index)[0]
    segments = rows["segment_ids"][r]
    start = int(np.argmax(segments == segments[rows["target_pos"][r][rows["target_slot"][r] == c][0]]))
    return start, {chosen[i].name for i in set(rows["slot_item"][r].tolist()) - {-1, index}}

  alone, short_window = scores(items[:8])
  mixed, long_window = scores([long] + items[3:6] + items[8:12])
  assert short_window.reach == 128 and long_window.reach == 320
  for name in ("item-3", "item-4", "item-5"):
    (score, (start, neighbours)), (other, (other_start, other_neighbours)) = alone[name], mixed[name]
    assert start % 32 == other_start % 32 == 0 and neighbours != other_neighbours
    np.testing.assert_array_equal(other, score)
  assert [alone[name][1][0] - mixed[name][1][0] for name in ("item-3", "item-4", "item-5")] == [128, 128, 128]


@pytest.mark.slow
def test_items_sharing_a_root_score_the_same_bits_as_laid_alone_and_match_the_reference(qwen2):
  """Four-option questions with one-token answers after the same 96-token prompt (packing.SharedRoot), laid with
  the prompt once a row beside ordinary items and scored neighbour-free: every answer the same bits as its question
  packed alone, and within 1e-5 of the PyTorch reference's forward of prompt, question and answer."""
  import dataclasses

  from s2sjax.data.packing import NEIGHBOUR_FREE_ALIGN, Item, SharedRoot, neighbour_free_bound

  model, config, params = qwen2
  rng = np.random.default_rng(5)
  vocab = config.vocab_size - 20
  prompt = rng.integers(0, vocab, 96)
  questions = [Item(np.r_[prompt, rng.integers(0, vocab, rng.integers(0, 40))],
                    tuple(np.array([answer]) for answer in rng.integers(0, vocab, 4)), name=f"question-{i}")
               for i in range(10)]
  items = questions + random_items(3, config.vocab_size, seed=6)

  def scores(chosen, roots=(), max_item=0):
    rows, report = pack(chosen, SHAPE, align=NEIGHBOUR_FREE_ALIGN, roots=roots)
    rows, shape = fit(rows, SHAPE, report.longest_item)
    shape = dataclasses.replace(shape, max_item=max_item or neighbour_free_bound(report.longest_item))
    scorer = Scorer(config, shape, batch_size=4, neighbour_free=True)
    collected = collect(rows, *scorer.score(params, rows, progress=False), [len(it.candidates) for it in chosen])
    return collected, report, rows, shape

  shared, report, rows, shape = scores(items, [SharedRoot(96, tuple(range(10)))])
  assert report.shared_roots == 2 and rows["key_shift"].any()  # ten questions over two rows, the prompt in each
  for i, item in enumerate(items):
    alone = scores([item], max_item=shape.max_item)[0]
    np.testing.assert_array_equal(shared.nll_sum[i, : len(item.candidates)], alone.nll_sum[0], err_msg=item.name)
  np.testing.assert_allclose(shared.mean_nll, reference_mean_nll(model, items), atol=1e-5, equal_nan=True)
  with pytest.raises(ValueError, match="rows with shared roots .key_shift. are scored neighbour-free"):
    Scorer(config, shape, batch_size=4).score(params, rows, progress=False)


@pytest.mark.slow
def test_codebook_table_audio_prefix_matches_reference(tmp_path):
  model = tiny_model("qwen2", seed=3)
  sizes, placeholder = (16, 8, 8), 500
  source, tables, _ = baichuan_audio_checkpoint(model, str(tmp_path / "baichuan"), sizes, placeholder)
  convert(source, str(tmp_path / "ckpt"), family="baichuan_audio")
  config, params = checkpoint.load_config(tmp_path / "ckpt"), checkpoint.load_params(tmp_path / "ckpt")
  items = random_items(8, config.vocab_size, seed=2, audio_placeholder=placeholder,
                       codebook_sizes=tuple(n + 1 for n in sizes))
  shape = RowShape(512, 256, 32, num_codebooks=3)
  scores, _ = _score(config, params, items, shape=shape)
  dense, _ = _score(config, params, items, shape=shape, local=False)
  np.testing.assert_allclose(scores.mean_nll, dense.mean_nll, atol=1e-5, equal_nan=True)
  fold_norm_head(model)
  reference = reference_mean_nll(model, items, lambda t, c: audio_inputs_embeds(model, t, c, tables))
  np.testing.assert_allclose(scores.mean_nll, reference, atol=1e-4, equal_nan=True)


@pytest.mark.slow
def test_every_mesh_and_batch_size_gives_the_same_numbers(qwen2):
  _, config, params = qwen2
  assert jax.device_count() == 8, "conftest sets 8 host devices"
  items = random_items(20, config.vocab_size, seed=4)
  baseline, _ = _score(config, params, items, mesh=sharding.make_mesh("data:1", jax.devices()[:1]), batch_size=1,
                       local=False)  # the dense mask: item-local attention on every mesh must equal it
  for mesh_spec in ["data:8", "data:4,model:2", "data:2,model:4"]:
    for batch_size in (1, 3, 8):
      scores, _ = _score(config, params, items, mesh=sharding.make_mesh(mesh_spec), batch_size=batch_size)
      np.testing.assert_allclose(scores.mean_nll, baseline.mean_nll, atol=1e-5, equal_nan=True,
                                 err_msg=f"mesh {mesh_spec}, batch {batch_size}")


def test_a_scorer_built_inside_a_training_loops_mesh_and_rules_gives_the_same_numbers(qwen2):
  import flax.linen as nn

  _, config, params = qwen2
  items = random_items(6, config.vocab_size, seed=8)
  outside, _ = _score(config, params, items)
  mesh = sharding.make_mesh("data:4,model:2")
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_RULES):  # what a training step runs under
    inside, _ = _score(config, params, items, mesh=mesh)
  np.testing.assert_allclose(inside.mean_nll, outside.mean_nll, atol=1e-5, equal_nan=True)


def test_one_compilation_serves_many_params_and_datasets(qwen2):
  _, config, params = qwen2
  scorer = Scorer(config, SHAPE, batch_size=4)
  other = jax.tree.map(lambda x: x * 1.01, params)
  for seed, p in [(5, params), (6, other), (7, params)]:
    rows, _ = pack(random_items(9, config.vocab_size, seed=seed), SHAPE)
    scorer.score(p, rows, progress=False)
  assert scorer.compiled_count() == 1


def test_ids_beyond_the_embedding_table_are_refused(qwen2):
  _, config, params = qwen2
  items = random_items(3, config.vocab_size)
  items[1].candidates[0][0] = config.vocab_size + 5
  rows, _ = pack(items, SHAPE)
  with pytest.raises(ValueError, match=r"tokens\[row \d+, position \d+\] = 517 is outside the embedding table \(512 rows\)"):
    Scorer(config, SHAPE).score(params, rows, progress=False)


def test_collect_names_the_candidates_the_rows_do_not_hold():
  items = random_items(12, 512, seed=3)
  rows, _ = pack(items, SHAPE)
  counts = [len(it.candidates) for it in items]
  nll_sum, n_tokens = np.ones((len(rows["tokens"]), SHAPE.max_slots)), np.ones((len(rows["tokens"]), SHAPE.max_slots))
  last = rows["slot_item"][-1][rows["slot_item"][-1] >= 0]  # the items the last row holds
  partial = {k: v[:-1] for k, v in rows.items()}
  with pytest.raises(ValueError, match=f"item {last.min()} candidate 0 laid 0x"):
    collect(partial, nll_sum[:-1], n_tokens[:-1], counts)
  with pytest.raises(ValueError, match="beyond the 11 items"):
    collect(rows, nll_sum, n_tokens, counts[:-1])


def test_not_greedy_is_argmax_differs_with_ties_read_as_torch_and_jax_read_them():
  """The step's is_greedy test without an argmax: on logits with ties the target is greedy only when it is the
  first of the largest, as torch's and jnp's argmax answer."""
  from s2sjax.scoring.scorer import not_greedy

  tied = np.array([[1.0, 3.0, 3.0, 0.0]] * 4, np.float32)
  ids = np.arange(4)
  picked = tied[ids, ids]
  assert np.asarray(not_greedy(tied, ids, picked)).tolist() == [True, False, True, True]
  rng = np.random.default_rng(0)
  logits = rng.integers(0, 4, size=(3, 50, 9)).astype(np.float32)  # small integers: ties everywhere
  ids = rng.integers(0, 9, size=(3, 50))
  picked = np.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]
  expected = torch.from_numpy(logits).argmax(-1).numpy() != ids
  assert (np.asarray(not_greedy(logits, ids, picked)) == expected).all() and 0 < expected.sum() < expected.size


@pytest.mark.slow
def test_greedy_misses_count_the_tokens_that_are_not_the_models_argmax(qwen2):
  """lm-eval's is_greedy from the same step: per candidate, the tokens torch's argmax would not have chosen."""
  from s2sjax.data.packing import Item

  model, config, params = qwen2
  items = []
  for item in random_items(6, config.vocab_size, seed=3):
    greedy = model.generate(torch.from_numpy(item.prefix)[None], max_new_tokens=6, do_sample=False,
                            attention_mask=torch.ones(1, len(item.prefix), dtype=torch.long))[0, len(item.prefix):]
    greedy = greedy.numpy()
    one_off = greedy.copy()
    one_off[-2] = (one_off[-2] + 1) % config.vocab_size  # a miss there, and the token after it sees another prefix
    items.append(Item(item.prefix, (greedy, one_off) + item.candidates, name=item.name))
  rows, report = pack(items, SHAPE)
  rows, shape = fit(rows, SHAPE, report.longest_item)
  scorer = Scorer(config, shape, batch_size=4)
  slots = scorer.score_slots(params, rows, progress=False)
  misses = collect(rows, slots["greedy_misses"], slots["n_tokens"], [len(it.candidates) for it in items]).nll_sum
  for i, item in enumerate(items):
    for c, candidate in enumerate(item.candidates):
      with torch.no_grad():
        logits = model(torch.from_numpy(np.concatenate([item.prefix, candidate]))[None]).logits[0]
      chosen = logits[len(item.prefix) - 1 : -1].argmax(-1).numpy()
      assert misses[i, c] == int((chosen != candidate).sum()), (item.name, c)
    assert misses[i, 0] == 0 and misses[i, 1] >= 1
