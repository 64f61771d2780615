"""The packer lays items out exactly as docs/architecture.md's row format says, and refuses or truncates long items."""

import numpy as np
import pytest

from s2sjax.model.attention import packed_attention_mask
from s2sjax.data.packing import Item, PackingError, RowShape, fit, pack, spanning


def _item(prefix, *candidates, name=""):
  return Item(np.array(prefix), tuple(np.array(c) for c in candidates), name=name)


def _segments(rows):
  """Every laid segment's tokens, as tuples."""
  return {
    tuple(rows["tokens"][r][rows["segment_ids"][r] == s])
    for r in range(len(rows["tokens"])) for s in np.unique(rows["segment_ids"][r]) if s > 0
  }


def test_shared_prefix_layout_by_hand():
  rows, report = pack([_item([11, 12, 13], [21, 22, 23], [31, 32])], RowShape(8, 6, 2))
  # each candidate's last token (23, 32) is a target only: nothing reads it, so it is not laid
  np.testing.assert_array_equal(rows["tokens"][0], [11, 12, 13, 21, 22, 31, 0, 0])
  np.testing.assert_array_equal(rows["segment_ids"][0], [1, 1, 1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(rows["branch_ids"][0], [0, 0, 0, 1, 1, 2, 0, 0])
  np.testing.assert_array_equal(rows["positions"][0], [0, 1, 2, 3, 4, 3, 0, 0])  # both candidates continue at 3
  # 21 and 31 are predicted from the last prefix token (row index 2); 22 from 21 (index 3), 23 from 22, 32 from 31
  np.testing.assert_array_equal(rows["target_pos"][0], [2, 3, 4, 2, 5, 0])
  np.testing.assert_array_equal(rows["target_ids"][0], [21, 22, 23, 31, 32, 0])
  np.testing.assert_array_equal(rows["target_slot"][0], [0, 0, 0, 1, 1, -1])
  np.testing.assert_array_equal(rows["slot_item"][0], [0, 0])
  np.testing.assert_array_equal(rows["slot_candidate"][0], [0, 1])
  assert report.tokens_saved_by_sharing == 3 and report.real_tokens == 6 and report.efficiency == 6 / 8

  mask = np.asarray(packed_attention_mask(rows["segment_ids"], rows["branch_ids"]))[0]
  assert mask[5, :3].all() and not mask[5, 3:5].any() and mask[5, 5]  # candidate 1 sees the prefix, not candidate 0
  assert mask[4, :5].all() and not mask[2, 3:].any() and not mask[6].any()


def test_a_one_token_candidate_lays_nothing_and_is_predicted_from_the_prefix():
  rows, report = pack([_item([11, 12], [21], [31, 32], [41])], RowShape(8, 6, 4))
  np.testing.assert_array_equal(rows["tokens"][0], [11, 12, 31, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["branch_ids"][0], [0, 0, 2, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["target_pos"][0, :4], [1, 1, 2, 1])  # 21, 31 and 41 from 12; 32 from 31
  np.testing.assert_array_equal(rows["target_ids"][0, :4], [21, 31, 32, 41])
  np.testing.assert_array_equal(rows["target_slot"][0, :5], [0, 1, 1, 2, -1])
  assert report.real_tokens == 3 and report.longest_item == 3


def test_without_sharing_every_candidate_is_its_own_segment():
  rows, report = pack([_item([11, 12, 13], [21, 22], [31])], RowShape(8, 4, 2), share_prefix=False)
  assert _segments(rows) == {(11, 12, 13, 21), (11, 12, 13)}  # a one-token candidate lays no position
  assert not rows["branch_ids"][rows["positions"] < 3].any()  # the prefix copies are branch 0
  assert report.tokens_saved_by_sharing == 0 and report.real_tokens == 7
  # 31 is predicted from the last token of its own prefix copy, which holds nothing else
  r, m = np.argwhere(rows["target_ids"] == 31)[0]
  at = rows["target_pos"][r, m]
  assert rows["tokens"][r, at] == 13 and (rows["segment_ids"][r] == rows["segment_ids"][r, at]).sum() == 3


def test_first_fit_decreasing_fills_rows():
  items = [_item(list(range(1, 1 + n)), [7, 7], [8, 8]) for n in (10, 2, 6, 12, 4, 8)]  # laid 12, 4, 8, 14, 6, 10
  rows, report = pack(items, RowShape(24, 12, 8))  # 14 + 10, 12 + 8 + 4, 6: the targets (4 an item) fill rows of 3
  assert report.rows == 3 and report.real_tokens == 54 and report.efficiency == 54 / 72
  assert sorted(rows["segment_ids"].max(1).tolist()) == [1, 2, 3]
  assert sorted(np.unique(rows["slot_item"][rows["slot_item"] >= 0]).tolist()) == list(range(6))


def test_aligned_items_start_at_multiples_of_the_alignment_and_pack_the_rest_alike():
  # laid 4 (2 + a one-token and a 3-token candidate: 0 + 2 laid), 5 and 9 tokens; rows of 16, items at multiples of 8
  items = [_item([1, 2], [3], [4, 5, 6]), _item([11, 12, 13, 14], [15, 16]), _item(list(range(21, 29)), [29, 30])]
  # first-fit decreasing: the 9 at 0 leaves no multiple of 8 with room; the 5 opens a row, the 4 follows it at 8
  rows, report = pack(items, RowShape(16, 12, 6), align=8)
  assert report.rows == 2 and report.real_tokens == 18 and report.longest_item == 9
  assert rows["tokens"][0].tolist() == list(range(21, 30)) + [0] * 7
  assert rows["tokens"][1].tolist() == [11, 12, 13, 14, 15, 0, 0, 0, 1, 2, 4, 5, 0, 0, 0, 0]
  assert rows["segment_ids"][1].tolist() == [1] * 5 + [0] * 3 + [2] * 4 + [0] * 4
  assert rows["positions"][1, 8:12].tolist() == [0, 1, 2, 3]  # the item's own positions, from 0
  # targets point at the positions that predict them: 3 and 4 from 2 (row index 9), 5 from 4, 6 from 5
  used = rows["target_slot"][1] >= 0
  assert rows["target_ids"][1][used].tolist() == [15, 16, 3, 4, 5, 6]
  assert rows["target_pos"][1][used].tolist() == [3, 4, 9, 9, 10, 11]
  same, _ = pack(items, RowShape(16, 12, 6))  # align=1: end to end, as before
  assert same["segment_ids"][0].tolist() == [1] * 9 + [2] * 5 + [0, 0]
  with pytest.raises(ValueError, match="align must divide the row length 16, not 5"):
    pack(items, RowShape(16, 12, 6), align=5)


def test_the_neighbour_free_bound_reaches_back_a_multiple_of_the_reduction_period_then_whole_leaves():
  from s2sjax.model.attention import LOCAL_BLOCK, local_window
  from s2sjax.data.packing import NEIGHBOUR_FREE_ALIGN, REDUCTION_LEAF, REDUCTION_PERIOD, neighbour_free_bound

  assert NEIGHBOUR_FREE_ALIGN == LOCAL_BLOCK  # items aligned to the query blocks of item-local attention
  reaches = {}
  for longest in (1, 2, 64, 65, 66, 150, 449, 450, 1000, 1985, 1986):
    bound = neighbour_free_bound(longest)
    reaches[longest] = window = local_window(bound, 8192).reach
    assert bound >= longest and window % REDUCTION_PERIOD == 0
    if window + LOCAL_BLOCK <= REDUCTION_LEAF:  # within one leaf: the smallest multiple
      assert window - REDUCTION_PERIOD < max(longest - 1, 1)
    else:  # a window of whole leaves less one query block: 1, 2, 4, ... leaves
      leaves = (window + REDUCTION_PERIOD) // REDUCTION_LEAF
      assert (window + REDUCTION_PERIOD) % REDUCTION_LEAF == 0 and leaves & (leaves - 1) == 0
  assert reaches == {1: 64, 2: 64, 64: 64, 65: 64, 66: 128, 150: 192, 449: 448, 450: 960, 1000: 1984, 1985: 1984,
                     1986: 4032}


def test_items_longer_than_the_row_name_the_item():
  items = [_item(list(range(1, 30)), [5, 6], [7], name="uttid 1234")]
  with pytest.raises(PackingError, match="uttid 1234: 29 prefix \\+ 1 candidate tokens laid exceed the row length 16"):
    pack(items, RowShape(16, 8, 4))


def test_truncate_prefix_drops_prefix_tokens_from_the_left_only():
  items = [_item(list(range(1, 30)), [50, 60], [70]), _item([1, 2], [3], [4])]
  rows, report = pack(items, RowShape(16, 8, 4), overlong="truncate_prefix")
  # too long to share (29 + 1 laid > 16): laid as the unshared mode lays it, 14 dropped so 15 + the longest as laid
  # (50: 60 is only predicted) fit
  assert report.truncated_items == ["item 0"] and report.truncated_tokens == 14 and report.unshared_items == 1
  assert {tuple(range(15, 30)) + (50,), tuple(range(15, 30))} <= _segments(rows)
  assert rows["positions"][rows["tokens"] == 15].tolist() == [0, 0]  # positions restart at the kept prefix


def test_sharing_on_and_off_truncate_an_overlong_item_alike():
  # prefix 100 + two candidates of 30 (29 laid) in rows of 128: shared it would need 158 and lose 30 prefix tokens,
  # each candidate alone needs 129 and loses 1; both modes must lay (and so score) the same tokens
  item = _item(list(range(1, 101)), list(range(200, 230)), list(range(300, 330)))
  shared, shared_report = pack([item], RowShape.for_length(128), overlong="truncate_prefix")
  unshared, unshared_report = pack([item], RowShape.for_length(128), share_prefix=False, overlong="truncate_prefix")
  assert _segments(shared) == _segments(unshared) == {tuple(range(2, 101)) + tuple(range(200, 229)),
                                                       tuple(range(2, 101)) + tuple(range(300, 329))}
  assert shared_report.truncated_tokens == unshared_report.truncated_tokens == 1
  assert shared_report.unshared_items == 1 and unshared_report.unshared_items == 0


def test_malformed_items_are_refused_by_name():
  shape = RowShape(32, 16, 4)
  with pytest.raises(PackingError, match="q7: has no candidates"):
    pack([_item([1], name="q7")], shape)
  with pytest.raises(PackingError, match="q9: candidate 1 is empty"):
    pack([_item([1], [2], [], name="q9")], shape)
  with pytest.raises(PackingError, match="q10: empty prefix"):
    pack([_item([], [2], [3], name="q10")], shape)
  with pytest.raises(PackingError, match="q11: its longest candidate \\(29 tokens laid\\) leaves no room"):
    pack([_item([1, 2], list(range(30)), [5], name="q11")], RowShape(24, 48, 4), overlong="truncate_prefix")


def test_the_longest_item_is_recorded_and_bounds_every_segment():
  from s2sjax.data.packing import longest_item

  items = [_item(list(range(1, 1 + n)), [7, 7], [8, 8, 8]) for n in (10, 2, 30)]
  shared, shared_report = pack(items, RowShape(64, 32, 8))
  unshared, unshared_report = pack(items, RowShape(64, 32, 8), share_prefix=False)
  # the candidates lay 1 and 2 tokens (their last is only predicted)
  assert shared_report.longest_item == longest_item(shared["segment_ids"]) == 30 + 3
  assert unshared_report.longest_item == longest_item(unshared["segment_ids"]) == 30 + 2
  assert shared_report.as_dict()["longest_item"] == 33


def test_fit_cuts_the_target_and_slot_tables_to_what_the_fullest_row_uses():
  """By hand: 40 items of 8 prefix tokens and two 3-token candidates (12 tokens laid, 6 targets, 2 slots each)
  fill rows of 256 with 21 items: 126 targets of the 128 the packer may use and 42 slots of 64. Fitted to buckets
  of 32: 128 targets (126 rounded up) and 64 slots (42 rounded up), never beyond what the packer was given; the
  longest item (12) to ITEM_BUCKET, 32."""
  items = [_item(list(range(1, 9)), [7, 7, 7], [8, 8, 8]) for _ in range(40)]
  rows, report = pack(items, RowShape.for_length(256))
  assert (rows["target_slot"] >= 0).sum(1).max() == 126 and (rows["slot_item"] >= 0).sum(1).max() == 42
  fitted, shape = fit(rows, RowShape.for_length(256), report.longest_item)
  assert (shape.max_targets, shape.max_slots, shape.max_item) == (128, 64, 32)
  wide = RowShape(256, 512, 256)  # a packer given more room than any row takes
  rows, report = pack(items, wide)
  fitted, shape = fit(rows, wide, report.longest_item)
  assert (shape.length, shape.max_targets, shape.max_slots, shape.max_item) == (256, 128, 64, 32)
  for name, value in fitted.items():  # every dropped column was padding; every kept one is as packed
    width = value.shape[1]
    np.testing.assert_array_equal(value, rows[name][:, :width], err_msg=name)
    if name.startswith(("target_", "slot_")):
      assert width in (128, 64) and (rows[name][:, width:] == (-1 if name in ("target_slot", "slot_item",
                                                                               "slot_candidate") else 0)).all()
  # a longest item past the row is capped at the row; a short one takes a whole ITEM_BUCKET
  assert fit(rows, wide, 300)[1].max_item == 256 and fit(rows, wide, 5)[1].max_item == 32
  assert fit(rows, wide, 33)[1].max_item == 64


def test_one_step_spans_the_widest_tables_of_its_row_length():
  one, two = RowShape(1024, 320, 64, max_item=128), RowShape(1024, 192, 96, max_item=256)
  assert spanning([one, two]) == RowShape(1024, 320, 96, max_item=256)
  assert spanning([one, RowShape(1024, 64, 32)]).max_item == 0  # a build that records no item bound: dense
  with pytest.raises(ValueError, match=r"one length and codebook count, not of \[\(256, 0\), \(1024, 0\)\]"):
    spanning([one, RowShape(256, 128, 64)])


def test_auto_row_length_is_the_smallest_power_of_two_that_holds_the_items():
  """At least 1024; the longest item as laid; its candidates within the row's share of targets; four median items."""
  from s2sjax.data.packing import auto_row_length

  item = lambda prefix, *candidates: Item(np.ones(prefix, np.int32), tuple(np.ones(c, np.int32) for c in candidates))
  # a candidate lays all its tokens but the last
  assert auto_row_length([item(40, 10, 12)] * 9, True, 0.5) == 1024  # 60 tokens laid: 4 x 60 = 240, the minimum
  short = [item(160, 40, 48)] * 9  # 246 tokens laid shared: 4 x 246 = 984 -> 1024
  assert auto_row_length(short, True, 0.5) == 1024
  assert auto_row_length(short + [item(1200, 80, 80)], True, 0.5) == 2048  # the longest item: 1358 tokens
  wide = short + [item(40, 600, 600)]  # 1238 laid, but 1200 targets at half a row -> 2400
  assert auto_row_length(wide, True, 0.5) == 4096
  assert auto_row_length(wide, True, 1.0) == 2048  # spoken candidates: the whole row may score
  assert auto_row_length(wide, False, 0.5) == 2048  # unshared: 639 laid, 600 scored per copy -> 1200
  assert auto_row_length([item(360, 40, 40)] * 5, True, 0.5) == 2048  # four median items: 1752


def test_stream_candidates_lay_all_their_steps_but_the_last():
  """Parallel streams (delays 0, initial ids 90 and 91): the item opens with the initial step, then its prefix
  steps; a candidate lays its steps but the last, which is a target only, as a text candidate's last token."""
  from s2sjax.data.formats.streams import StreamItem, StreamLayout, pack_streams

  layout = StreamLayout(delays=(0, 0), initial_ids=(90, 91), predicted=2)
  prefix = np.array([[1, 11], [2, 12]])
  item = StreamItem(prefix, (np.array([[3, 13], [4, 14]]), np.array([[5, 15]])), scored=(0, 1), name="q")
  rows, report = pack_streams([item], RowShape(8, 6, 2), layout)
  np.testing.assert_array_equal(rows["stream_tokens"][0, :5], [[90, 91], [1, 11], [2, 12], [3, 13], [-1, -1]])
  np.testing.assert_array_equal(rows["branch_ids"][0, :5], [0, 0, 0, 1, 0])
  np.testing.assert_array_equal(rows["target_pos"][0, :3], [2, 3, 2])  # 3|13 and 5|15 from 2|12; 4|14 from 3|13
  np.testing.assert_array_equal(rows["target_frame"][0, :3], [[3, 13], [4, 14], [5, 15]])
  assert report.real_tokens == 4 and report.longest_item == 4
  with pytest.raises(PackingError, match=r"q: 3 prefix \+ 1 candidate steps laid exceed the row length 3"):
    pack_streams([item], RowShape(3, 6, 2), layout)


def test_items_sharing_a_root_lay_it_once_and_each_rest_at_a_multiple_of_32():
  from s2sjax.data.packing import SharedRoot, longest_item

  root = np.arange(1, 65)  # 64 tokens: a few-shot prompt
  a = Item(np.r_[root, [70, 71, 72]], (np.array([5]), np.array([6])), name="a")
  b = Item(np.r_[root, np.arange(80, 120)], (np.array([7]),), name="b")
  c = Item(root.copy(), (np.array([8]), np.array([9])), name="c")  # the prompt alone: read at the root's end
  rows, report = pack([a, b, c], RowShape(256, 64, 16), align=32, roots=[SharedRoot(64, (0, 1, 2))])
  row = {name: value[0] for name, value in rows.items()}
  assert row["tokens"][:64].tolist() == root.tolist() and set(row["branch_ids"][:64]) == {0}
  assert row["tokens"][64:67].tolist() == [70, 71, 72] and row["positions"][64:67].tolist() == [64, 65, 66]
  assert row["tokens"][96:136].tolist() == list(range(80, 120)) and row["positions"][96:136].tolist() == list(range(64, 104))
  assert row["segment_ids"][67:96].tolist() == [0] * 29 and set(row["segment_ids"][136:]) == {0}
  assert row["branch_ids"][64:67].tolist() == [1] * 3 and set(row["branch_ids"][96:136]) == {2}
  # how far each rest lies past where its item alone lays it (right after the root)
  assert set(row["key_shift"][:96]) == {0} and set(row["key_shift"][96:136]) == {32}
  used = row["target_slot"] >= 0
  assert list(zip(row["target_pos"][used], row["target_ids"][used])) == [(66, 5), (66, 6), (135, 7), (63, 8), (63, 9)]
  assert list(zip(row["slot_item"][:5], row["slot_candidate"][:5])) == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
  # the root laid once for three items, a's and c's prefixes once for their two candidates
  assert report.shared_roots == 1 and report.tokens_saved_by_sharing == 2 * 64 + 67 + 64
  # an item-local window reaches over an item as laid alone (b: 104 tokens), not over the root's whole span
  assert report.longest_item == 104 == longest_item(rows["segment_ids"], rows["key_shift"])
  assert longest_item(rows["segment_ids"]) == 136

  # a row that cannot hold them all lays the root again for the rest: a alone, b and c after a root of their own
  rows, report = pack([a, b, c], RowShape(128, 64, 16), align=32, roots=[SharedRoot(64, (0, 1, 2))])
  assert report.shared_roots == 1 and report.rows == 2
  assert sorted(rows["tokens"][:, :64].tolist()) == [root.tolist()] * 2


def test_a_shared_root_refuses_items_that_cannot_share_it_by_name():
  from s2sjax.data.packing import SharedRoot

  root = np.arange(1, 33)
  fine = Item(np.r_[root, [40]], (np.array([5]),), name="fine")
  long_answer = Item(np.r_[root, [41]], (np.array([5, 6]),), name="long answer")
  other_prompt = Item(np.r_[root[::-1], [42]], (np.array([5]),), name="other prompt")
  with pytest.raises(PackingError, match="long answer: shares a root, so its candidates are one token each"):
    pack([fine, long_answer], RowShape(128, 64, 16), align=32, roots=[SharedRoot(32, (0, 1))])
  with pytest.raises(PackingError, match="other prompt: its prefix does not open with the 32 tokens of the root it "
                                         "shares with fine"):
    pack([fine, other_prompt], RowShape(128, 64, 16), align=32, roots=[SharedRoot(32, (0, 1))])
  with pytest.raises(ValueError, match="a positive multiple of 32, not 20"):
    pack([fine, fine], RowShape(128, 64, 16), align=32, roots=[SharedRoot(20, (0, 1))])
  with pytest.raises(ValueError, match="an item shares at most one root"):
    pack([fine, fine], RowShape(128, 64, 16), align=32, roots=[SharedRoot(32, (0, 1)), SharedRoot(32, (1,))])
