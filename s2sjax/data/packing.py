"""Packs benchmark items (a prefix and the candidate continuations that follow it) into fixed-length rows.

`pack_laid` is the engine every input format's packer hands its items to, once laid as the fields of its row
format (`LaidItem`: per position, per target); `pack` lays the shared decoder's token items (below) and
s2sjax/data/formats/streams.py its stream items. Token rows (docs/architecture.md, "Packed rows"), every row the same
shape so the scoring step compiles once:

  tokens, segment_ids, branch_ids, positions   [L]      segment 0 = padding; branch 0 = the item's prefix,
                                                         branch c + 1 = candidate c's own tokens
  audio_codes                                  [L, K]   codebook ids at audio positions, -1 elsewhere (K may be 0)
  target_pos, target_ids, target_slot          [M]      which position's logits predict which token, for which
                                                         candidate slot (-1 = unused)
  slot_item, slot_candidate                    [C]      slot -> (item index, candidate index); -1 = unused

With prefix sharing (default) an item's prefix is laid down once and every candidate branches from it: the first
token of every candidate is predicted from the last prefix position, and a candidate's positions continue from the
end of its prefix. Without sharing, every prefix + candidate is its own segment, as the reference implementation
scores it; both give the same numbers. A candidate's last token is a target only: no scored position reads it, so
it is not laid (a one-token candidate lays no position at all and is predicted from the prefix alone).

With `align` (`pack`), every item starts at a multiple of it, padding between: at NEIGHBOUR_FREE_ALIGN an item's
scores are the same bits whatever shares its row (`scoring.Scorer(neighbour_free=True)`).

Items whose prefixes open with the same tokens (a few-shot prompt's shots, a task's instructions) and whose
candidates are one token each can share that opening too (`SharedRoot`): it is laid once as branch 0 of one
segment, each item's rest of the prefix as a branch of its own after it, at a multiple of NEIGHBOUR_FREE_ALIGN,
and each candidate a target at its branch's last position. `key_shift` [L] says how far each such rest lies past
where the item alone lays it (right after the root); neighbour-free scoring reads each query block's keys from
there (`model/attention.gathered_windows`), so every item scores the same bits as when it is laid alone.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from s2sjax.runtime.errors import UserError
from s2sjax.data.rows import TOKEN_ROWS


class PackingError(UserError, ValueError):
  """An item that cannot be packed: too long for the row, empty, or malformed. Names the item."""


@dataclasses.dataclass(frozen=True)
class Item:
  """One prefix and the candidates scored after it, in the model's id space (the unit the packer lays down).

  prefix: token ids [P]; prefix_codes: [P, K] codebook ids at audio positions, -1 elsewhere (None without
  `codebook_tables` audio); candidates: token ids of each continuation. Which candidate is right is the
  benchmark's business, not the packer's: a question whose candidates have different prefixes (two renderings of
  the same speech) is several items."""

  prefix: np.ndarray
  candidates: tuple[np.ndarray, ...]
  prefix_codes: np.ndarray | None = None
  name: str = ""  # for error messages (e.g. the uttid)


# Item bounds are rounded up to this, and fitted target and slot tables (`fit`) to TABLE_BUCKET, so that tasks
# with similar items share one compiled step. The item bound sets the item-local window, which grows in blocks of
# 32 queries (model/attention.LOCAL_BLOCK): a coarser bucket only widens it. StoryCloze items (at most 86 tokens laid)
# get 128 keys a query block, not the 160 of a bucket of 64 (attention over 30 SmolLM2 layers, 2 rows of 1024 on a
# 2-core CPU: 547 ms against 649).
ITEM_BUCKET = 32
TABLE_BUCKET = 32

# Where an item sits in its row changes its fp32 numbers, by the rounding of XLA:CPU's reductions: a sum over an
# axis (the softmax's over keys) groups its terms by their index mod 64 (measured: 150 terms moved by 1 to 32
# places sum to other bits, moved by 64 or 128 to the same; zeros after them change nothing), so an item moved by
# a few positions adds its keys in another grouping (SmolLM2-135M: up to 1.1e-4 on an xstorycloze_zh ending's
# log-likelihood from one packing to another). Masked keys add exact zeros. Over item-local windows (queries in
# blocks of 32, model/attention/xla.py) a key's index is its position less its block's window start: items that
# start at multiples of the block, in windows that reach back a multiple of 64 (and past one leaf, below, a window
# of whole leaves: `neighbour_free_bound`), keep every key's index, so their scores are the same bits whatever shares their rows (`scoring.Scorer(neighbour_free=True)`).
# Over whole rows the dense matmuls group keys by larger blocks (items at multiples of 64 still move).
NEIGHBOUR_FREE_ALIGN = 32  # model/attention.LOCAL_BLOCK
REDUCTION_PERIOD = 64
# Past 512 keys the attention over a window sums in leaves of 512 keys, added pairwise: an item whose keys cross a
# leaf boundary in one window and not in another moves (one layer's attention, an item of 168 keys: the same bits
# at every reach from 192 to 448 keys and from 704 to 960, other bits at 512, 576 and 640). A window spanning a power of two
# leaves less one query block keeps every item no longer than its reach in the same leaves as the windows below
# it (measured on items of 40 to 900 keys: the same bits at reaches 448, 960 and 1,984 as at their shortest
# multiple of 64; other bits at 1,472 for items longer than one leaf).
REDUCTION_LEAF = 512
ONE_LEAF_REACH = REDUCTION_LEAF - REDUCTION_PERIOD  # 448: the longest reach, a multiple of 64, whose window fits a leaf


@dataclasses.dataclass(frozen=True)
class SharedRoot:
  """Items (indices into `pack`'s items) whose prefixes open with the same `length` tokens, a multiple of
  NEIGHBOUR_FREE_ALIGN, and whose candidates are one token each: the opening is laid once for as many of them as a
  row holds (docs/architecture.md, "Packed rows")."""

  length: int
  items: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RowShape:
  length: int  # L: tokens per row
  max_targets: int  # M: scored tokens per row
  max_slots: int  # C: candidate slots per row
  num_codebooks: int = 0  # K
  max_item: int = 0  # no item (prefix and its candidates, as laid) spans more tokens; 0 = unknown (dense attention)

  @classmethod
  def for_length(cls, length: int, num_codebooks: int = 0) -> "RowShape":
    """Defaults that fit S2SBench's items: candidates take at most half a row (they are short next to their
    prefix, but sCMMLU's text rows are mostly options), and items are rarely shorter than 4 tokens a slot."""
    return cls(length, max(length // 2, 1), max(length // 4, 4), num_codebooks)

  def with_length(self, length: int) -> "RowShape":
    """This shape's proportions at another length: targets and slots scale with the row."""
    return dataclasses.replace(self, length=length, max_targets=max(length * self.max_targets // self.length, 1),
                               max_slots=max(length * self.max_slots // self.length, 4))


@dataclasses.dataclass
class PackReport:
  items: int = 0
  rows: int = 0
  real_tokens: int = 0  # tokens laid into rows (prefixes counted once per copy actually laid)
  capacity: int = 0
  tokens_saved_by_sharing: int = 0
  truncated_items: list[str] = dataclasses.field(default_factory=list)
  truncated_tokens: int = 0
  unshared_items: int = 0  # with sharing on, items too long to lay shared (laid a prefix copy per candidate)
  longest_item: int = 0  # tokens of the longest unit laid contiguously (a prefix and its candidates)
  shared_roots: int = 0  # copies of a SharedRoot laid for two or more items (one per row its items spread over)

  @property
  def efficiency(self) -> float:
    return self.real_tokens / self.capacity if self.capacity else 0.0

  def as_dict(self) -> dict:
    return {
      "items": self.items, "rows": self.rows, "real_tokens": self.real_tokens, "capacity": self.capacity,
      "packing_efficiency": round(self.efficiency, 6), "tokens_saved_by_sharing": self.tokens_saved_by_sharing,
      "truncated_items": len(self.truncated_items), "truncated_prefix_tokens": self.truncated_tokens,
      "unshared_items": self.unshared_items, "longest_item": self.longest_item, "shared_roots": self.shared_roots,
    }


@dataclasses.dataclass(frozen=True)
class _Unit:
  """What is laid down contiguously in one row: a prefix and the candidates that branch from it."""

  item: int
  candidates: tuple[int, ...]
  prefix_len: int
  tokens: int
  targets: int

  @property
  def slots(self) -> int:
    return len(self.candidates)

  @property
  def longest(self) -> int:
    return self.tokens


@dataclasses.dataclass(frozen=True)
class _RootUnit:
  """A shared root and the items laid after it in one row: item `items[b]`'s rest of the prefix starts `offsets[b]`
  after the root's first token, its candidates one target each at that part's last position."""

  root: int  # the root's length
  items: tuple[int, ...]
  offsets: tuple[int, ...]
  tokens: int  # span, root to the last item's last token
  targets: int
  longest: int  # the longest item as laid alone (root and its rest): what an item-local window must reach

  @property
  def slots(self) -> int:
    return self.targets  # one target per candidate


@dataclasses.dataclass(frozen=True)
class LaidItem:
  """An item as a row format lays it, the unit every format's packer hands `pack_laid`: the fields its prefix
  writes per position [P, ...], and per candidate the fields it writes per position and per target: a target per
  position and one more (the last token or step, which no scored position reads, is a target only). `share`: laid
  as one unit (`fits_shared`), else a prefix copy per candidate."""

  prefix: Mapping[str, np.ndarray]
  candidates: tuple[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], ...]
  share: bool
  name: str = ""


def _length(fields: Mapping[str, np.ndarray]) -> int:
  """How many positions (or targets) a laid part spans: the common length of its fields."""
  return len(next(iter(fields.values())))


def item_name(index: int, item) -> str:
  """The item's name in errors (any format's item: a `name` and `candidates`); refuses one without candidates."""
  name = item.name or f"item {index}"
  if not item.candidates:
    raise PackingError(f"{name}: has no candidates")
  return name


def _validate(index: int, item: Item, num_codebooks: int) -> str:
  name = item_name(index, item)
  if len(item.prefix) == 0:
    raise PackingError(f"{name}: empty prefix")
  for c, candidate in enumerate(item.candidates):
    if len(candidate) == 0:
      raise PackingError(f"{name}: candidate {c} is empty")
  if num_codebooks:
    if item.prefix_codes is None or item.prefix_codes.shape != (len(item.prefix), num_codebooks):
      got = None if item.prefix_codes is None else item.prefix_codes.shape
      raise PackingError(f"{name}: prefix_codes must be [{len(item.prefix)}, {num_codebooks}], got {got}")
  return name


def _laid_length(candidate: np.ndarray) -> int:
  """Positions a text candidate takes in a row: all its tokens but the last, which is only predicted."""
  return len(candidate) - 1


def _lengths(item: Item | LaidItem) -> tuple[int, list[int], list[int]]:
  """(prefix positions, positions each candidate lays, targets each scores) of a token item or a laid one."""
  if isinstance(item, LaidItem):
    return (_length(item.prefix), [_length(positions) for positions, _ in item.candidates],
            [_length(targets) for _, targets in item.candidates])
  return len(item.prefix), [_laid_length(c) for c in item.candidates], [len(c) for c in item.candidates]


def item_positions(item: Item | LaidItem) -> int:
  """Positions the longest sequence of an item reads (its prefix and one candidate, as laid: the highest position id
  it is given, plus one), however it is packed: what the model's trained positions must cover."""
  prefix, laid, _ = _lengths(item)
  return prefix + max(laid)


def required_length(item: Item | LaidItem, share_prefix: bool) -> int:
  """Row length the item needs: its prefix plus all candidates as laid (shared), or plus the longest (not shared)."""
  prefix, laid, _ = _lengths(item)
  return prefix + (sum(laid) if share_prefix else max(laid))


def _scored_length(item: Item | LaidItem, share_prefix: bool) -> int:
  """Targets the item needs in one row: all its candidates' tokens (shared), or the longest candidate's."""
  scored = _lengths(item)[2]
  return sum(scored) if share_prefix else max(scored)


# Short rows save nothing once attention is item-local (a token's cost is its item's, not its row's), while they
# pack looser and take more steps: on all 1,871 StoryCloze stories (one run, this project's 2-core CPU), rows of 1024
# took 0.39x the reference's wall time against 0.44x for the 256 the four-median rule alone gives.
AUTO_MIN_LENGTH = 1024


def auto_row_length(items: Sequence[Item | LaidItem], share_prefix: bool, targets_per_token: float) -> int:
  """The row length of a build not given one: the smallest power of two, at least AUTO_MIN_LENGTH, that holds the
  longest item as laid, its candidates within the row's targets (`targets_per_token` of its length: a half for
  text candidates, all of it for spoken ones), and four median items, so that a row packs several and the padding
  of the last one stays small. Long speech items get long rows."""
  laid = np.array([required_length(item, share_prefix) for item in items])
  scored = np.array([_scored_length(item, share_prefix) for item in items])
  need = max(AUTO_MIN_LENGTH, int(laid.max()), int(np.ceil(scored.max() / targets_per_token)),
             4 * int(np.median(laid)))
  return 1 << (need - 1).bit_length()


def fits_shared(prefix_len: int, laid: Sequence[int], scored: Sequence[int], shape: RowShape,
                share_prefix: bool) -> bool:
  """Whether, with sharing on, a prefix and candidates laying `laid` positions and scoring `scored` targets each
  fit an empty row as one unit (positions, targets and slots), in any row format."""
  return (share_prefix and prefix_len + sum(laid) <= shape.length and sum(scored) <= shape.max_targets
          and len(scored) <= shape.max_slots)


def lays_shared(item: Item, shape: RowShape, share_prefix: bool) -> bool:
  """Whether the item is laid as one shared unit: with sharing on, when prefix and all candidates fit an empty
  row. An item that does not is laid as the unshared mode lays it (a copy of the prefix per candidate), so both
  modes truncate the same prefix tokens and give the same numbers."""
  return fits_shared(len(item.prefix), [_laid_length(c) for c in item.candidates],
                      [len(c) for c in item.candidates], shape, share_prefix)


def _truncation(name: str, item: Item, shape: RowShape, share: bool, policy: str) -> int:
  """How many prefix tokens to drop from the left so the item, laid shared or not (`lays_shared`), fits an empty
  row (0 if it fits)."""
  scored = _scored_length(item, share)
  if scored > shape.max_targets:
    raise PackingError(f"{name}: a candidate of {scored} tokens exceeds a row's {shape.max_targets} targets")
  needed = required_length(item, share)
  laid, excess = needed - len(item.prefix), needed - shape.length
  if excess <= 0:
    return 0
  if policy != "truncate_prefix":
    raise PackingError(
      f"{name}: {len(item.prefix)} prefix + {laid} candidate tokens laid exceed the row length {shape.length} "
      "(raise the row length, or use the truncate_prefix policy)"
    )
  if excess >= len(item.prefix):
    raise PackingError(f"{name}: its longest candidate ({laid} tokens laid) leaves no room for a prefix token in a "
                       f"row of {shape.length}")
  return excess


def check_item(item: Item, shape: RowShape, share_prefix: bool = True, overlong: str = "error") -> None:
  """Raises the PackingError (naming the item) that `pack` would raise for this item: a builder's per-question
  check, so that a question that cannot be packed is named or skipped where it is read."""
  _truncation(_validate(0, item, shape.num_codebooks), item, shape, lays_shared(item, shape, share_prefix), overlong)


def pack(
  items: Sequence[Item],
  shape: RowShape,
  share_prefix: bool = True,
  overlong: str = "error",
  align: int = 1,
  roots: Sequence[SharedRoot] = (),
) -> tuple[dict[str, np.ndarray], PackReport]:
  """First-fit-decreasing packing of `items` into rows of `shape`. Returns (rows: field -> [R, ...] arrays, report).

  overlong: "error" (default: names the item) or "truncate_prefix" (drops prefix tokens from the left, never
  candidate tokens; counted in the report). align: every item (every prefix copy, unshared) starts at a multiple
  of it in its row (`NEIGHBOUR_FREE_ALIGN`); 1 packs them end to end. roots: items laying a shared opening once
  (with sharing on; without, every candidate is its own segment all the same)."""
  if overlong not in ("error", "truncate_prefix"):
    raise ValueError(f"overlong must be 'error' or 'truncate_prefix', not {overlong!r}")
  if align < 1 or shape.length % align:
    raise ValueError(f"align must divide the row length {shape.length}, not {align}")
  report = PackReport(items=len(items))
  laid = []
  for index, item in enumerate(items):
    name = _validate(index, item, shape.num_codebooks)
    share = lays_shared(item, shape, share_prefix)
    drop = _truncation(name, item, shape, share, overlong)
    if drop:
      report.truncated_items.append(name)
      report.truncated_tokens += drop
    prefix = {"tokens": np.asarray(item.prefix[drop:])}
    if item.prefix_codes is not None and shape.num_codebooks:
      prefix["audio_codes"] = item.prefix_codes[drop:]
    candidates = [np.asarray(candidate) for candidate in item.candidates]
    laid.append(LaidItem(prefix, tuple(({"tokens": c[:-1]}, {"target_ids": c}) for c in candidates), share, name))
  roots = [_checked_root(root, items, laid, report, shape) for root in roots] if share_prefix else []
  return pack_laid(laid, shape, share_prefix, lambda count: empty_rows(count, shape), report, align, roots)


def _checked_root(root: SharedRoot, items: Sequence[Item], laid: Sequence[LaidItem], report: PackReport,
                  shape: RowShape) -> SharedRoot:
  """The root, refused by the first item that cannot share it: each item is laid whole (not truncated), its prefix
  opens with the root's tokens (or is them) and its candidates are one token each."""
  if root.length <= 0 or root.length % NEIGHBOUR_FREE_ALIGN:
    raise ValueError(f"a shared root's length is a positive multiple of {NEIGHBOUR_FREE_ALIGN}, not {root.length}")
  first = items[root.items[0]]
  for index in root.items:
    item, name = items[index], laid[index].name
    if name in report.truncated_items or not laid[index].share:
      raise PackingError(f"{name}: does not fit a row of {shape.length} whole, so it cannot share a root")
    if any(len(candidate) != 1 for candidate in item.candidates):
      raise PackingError(f"{name}: shares a root, so its candidates are one token each (a longer one would need a "
                         "branch of its own after the item's)")
    opens = len(item.prefix) >= root.length and np.array_equal(item.prefix[:root.length], first.prefix[:root.length])
    if not opens or (item.prefix_codes is not None and shape.num_codebooks
                     and not np.array_equal(item.prefix_codes[:root.length], first.prefix_codes[:root.length])):
      raise PackingError(f"{name}: its prefix does not open with the {root.length} tokens of the root it shares with "
                         f"{laid[root.items[0]].name}")
  return root


def fit_laid(index: int, item: LaidItem, shape: RowShape, share_prefix: bool) -> bool:
  """Whether a laid item of any format is laid shared (`fits_shared`); a PackingError naming it when even a prefix
  copy per candidate does not fit an empty row (laid items are not truncated: a format that truncates does so
  before it lays them)."""
  name = item_name(index, item)
  p = _length(item.prefix)
  laid = [_length(positions) for positions, _ in item.candidates]
  scored = [_length(targets) for _, targets in item.candidates]
  if min(scored) == 0 or any(n != s - 1 for n, s in zip(laid, scored)):
    raise PackingError(f"{name}: every candidate is scored on at least one target and lays one position fewer")
  if max(scored) > shape.max_targets:
    raise PackingError(f"{name}: a candidate of {max(scored)} targets exceeds a row's {shape.max_targets} targets")
  if p + max(laid) > shape.length:
    raise PackingError(f"{name}: {p} prefix + {max(laid)} candidate positions laid exceed the row length "
                       f"{shape.length}")
  return fits_shared(p, laid, scored, shape, share_prefix)


def pack_laid(laid: Sequence[LaidItem], shape: RowShape, share_prefix: bool,
              empty: Callable[[int], dict[str, np.ndarray]], report: PackReport | None = None,
              align: int = 1, roots: Sequence[SharedRoot] = ()) -> tuple[dict[str, np.ndarray], PackReport]:
  """First-fit-decreasing packing of laid items (any format) into `empty(count)` rows, each field of an item written
  where its part lies; completes the report. `roots` as `pack` checks them (`_checked_root`)."""
  report = report or PackReport(items=len(laid))
  units: list[_Unit | _RootUnit] = []
  rooted = set()
  for root in roots:
    if rooted & set(root.items) or len(set(root.items)) < len(root.items):
      raise ValueError(f"an item shares at most one root, once: {sorted(rooted & set(root.items))}")
    rooted |= set(root.items)
    units += _root_units(root, laid, shape)
  report.shared_roots = sum(len(unit.items) > 1 for unit in units)
  for unit in units:  # the root laid once for its items, each item's prefix once for its candidates
    report.tokens_saved_by_sharing += (len(unit.items) - 1) * unit.root + sum(
      (len(laid[i].candidates) - 1) * _length(laid[i].prefix) for i in unit.items)
  for index, item in enumerate(laid):
    if index in rooted:
      continue
    p = _length(item.prefix)
    laid_lengths = [_length(positions) for positions, _ in item.candidates]
    scored = [_length(targets) for _, targets in item.candidates]
    report.unshared_items += share_prefix and not item.share
    if item.share:
      units.append(_Unit(index, tuple(range(len(scored))), p, p + sum(laid_lengths), sum(scored)))
      report.tokens_saved_by_sharing += (len(scored) - 1) * p
    else:
      units.extend(_Unit(index, (c,), p, p + laid_lengths[c], n) for c, n in enumerate(scored))
  rows = _first_fit(units, shape, align)
  arrays = empty(len(rows))
  if roots:
    arrays["key_shift"] = np.zeros_like(arrays["segment_ids"])
  for r, row_units in enumerate(rows):
    _lay_row(arrays, r, row_units, laid, align)
  report.rows = len(rows)
  report.longest_item = max((unit.longest for unit in units), default=0)
  report.real_tokens = int((arrays["segment_ids"] > 0).sum())
  report.capacity = len(rows) * shape.length
  return arrays, report


def _branch_offsets(root: int, rests: Sequence[int]) -> tuple[list[int], int]:
  """Where each item's rest of the prefix (`rests`, in tokens) starts after a shared root of `root` tokens (a
  multiple of NEIGHBOUR_FREE_ALIGN), and the span of them all: the first right after the root, as the item alone
  lays it, each next one at the first multiple of NEIGHBOUR_FREE_ALIGN past the one before, so that no query block
  holds two items' rests (query blocks read their keys by the block: model/attention.gathered_windows)."""
  offsets, end = [], root
  for rest in rests:
    # a prefix that is the root lays nothing: its candidates are read at the root's last position
    offset = -(-end // NEIGHBOUR_FREE_ALIGN) * NEIGHBOUR_FREE_ALIGN if rest else end
    offsets.append(offset)
    end = offset + rest
  return offsets, end


def _root_units(root: SharedRoot, laid: Sequence[LaidItem], shape: RowShape) -> list[_RootUnit]:
  """The root's items in order, as many a unit as a row holds (positions, targets, slots), the root laid once a
  unit."""
  units, group = [], []

  def unit(items: list[int]) -> _RootUnit | None:
    offsets, span = _branch_offsets(root.length, [_length(laid[i].prefix) - root.length for i in items])
    targets = sum(len(laid[i].candidates) for i in items)
    if span > shape.length or targets > min(shape.max_targets, shape.max_slots):
      return None
    longest = max(_length(laid[i].prefix) for i in items)
    return _RootUnit(root.length, tuple(items), tuple(offsets), span, targets, longest)

  for index in root.items:
    if group and unit(group + [index]) is None:
      units.append(unit(group))
      group = []
    if unit(group + [index]) is None:
      raise PackingError(f"{laid[index].name}: its prefix and candidates do not fit an empty row of {shape.length}")
    group.append(index)
  return units + [unit(group)]


def fit(rows: dict[str, np.ndarray], shape: RowShape, longest_item: int) -> tuple[dict[str, np.ndarray], RowShape]:
  """The rows and their shape as a build records them (either format): the target table (M) and the candidate
  slots (C) cut to what the fullest row uses, rounded up to TABLE_BUCKET, and `max_item` set from the longest item
  laid, rounded up to ITEM_BUCKET. The head then runs over the targets the rows hold, not over the capacity the
  packer was given (half the row for text: about twice what StoryCloze rows use), and item-local attention
  knows its window (model/attention.local_window)."""
  bucket = lambda n, size, cap: min(max(-(-n // size) * size, size), cap)
  last_used = lambda used: int(np.where(used.any(0))[0].max(initial=-1)) + 1  # the table's highest column in use
  targets = bucket(last_used(rows["target_slot"] >= 0), TABLE_BUCKET, shape.max_targets)
  slots = bucket(last_used(rows["slot_item"] >= 0), TABLE_BUCKET, shape.max_slots)
  fitted = {name: (value[:, :targets] if name.startswith("target_") else
                   value[:, :slots] if name.startswith("slot_") else value) for name, value in rows.items()}
  return fitted, dataclasses.replace(shape, max_targets=targets, max_slots=slots,
                                     max_item=bucket(longest_item, ITEM_BUCKET, shape.length))


def neighbour_free_bound(longest_item: int) -> int:
  """The item bound (`RowShape.max_item`) at least `longest_item` whose item-local window (reaching back
  max_item - 1 keys, model/attention.local_window) sums every item's keys in the same grouping as any shorter
  one: a reach that is a multiple of REDUCTION_PERIOD while the window fits one REDUCTION_LEAF, beyond that a
  window of a power of two leaves less one query block (reach 960, 1,984, ...)."""
  need = max(longest_item - 1, 1)
  reach = -(-need // REDUCTION_PERIOD) * REDUCTION_PERIOD
  if reach > ONE_LEAF_REACH:
    leaves = 1 << (-(-(need + REDUCTION_PERIOD) // REDUCTION_LEAF) - 1).bit_length()
    reach = leaves * REDUCTION_LEAF - REDUCTION_PERIOD
  return reach + 1


def spanning(shapes: Sequence[RowShape]) -> RowShape:
  """The narrowest shape whose step reads rows of each of `shapes` (one length and codebook count): the widest
  tables and the longest item of any, or no item bound (dense attention) if one records none. Tasks built with
  one row length share one compiled step this way; the Scorer pads narrower tables per step."""
  kinds = {(shape.length, shape.num_codebooks) for shape in shapes}
  if len(kinds) != 1:
    raise ValueError(f"one step reads rows of one length and codebook count, not of {sorted(kinds)}")
  return dataclasses.replace(shapes[0], max_targets=max(s.max_targets for s in shapes),
                             max_slots=max(s.max_slots for s in shapes),
                             max_item=0 if any(s.max_item == 0 for s in shapes) else max(s.max_item for s in shapes))


def _first_fit(units: list[_Unit | _RootUnit], shape: RowShape, align: int = 1) -> list[list[_Unit | _RootUnit]]:
  """First-fit decreasing by tokens; ties broken by item order so packing is deterministic on every host. A unit
  starts at the row's first multiple of `align` past the units before it."""
  order = sorted(range(len(units)), key=lambda u: (-units[u].tokens, u))
  rows: list[list[_Unit | _RootUnit]] = []
  free: list[list[int]] = []  # per row: [tokens, targets, slots] still available, tokens from the next start
  for u in order:
    unit = units[u]
    need = (unit.tokens, unit.targets, unit.slots)
    for r, room in enumerate(free):
      if room[0] >= need[0] and room[1] >= need[1] and room[2] >= need[2]:
        break
    else:
      rows.append([])
      free.append([shape.length, shape.max_targets, shape.max_slots])
      r = len(rows) - 1
    rows[r].append(unit)
    tokens_left = free[r][0] - need[0]
    free[r] = [tokens_left - tokens_left % align, free[r][1] - need[1], free[r][2] - need[2]]
  return rows


def longest_items(segment_ids: np.ndarray, key_shift: np.ndarray | None = None) -> np.ndarray:
  """[R]: the most tokens any segment of each row of [R, L] spans, first to last token (0 for padding only); with
  `key_shift` (shared roots), each token counted where its item alone lays it."""
  rows, length = segment_ids.shape
  real = segment_ids > 0
  key = (np.arange(rows)[:, None] * (length + 1) + segment_ids)[real]
  index = np.broadcast_to(np.arange(length), segment_ids.shape)
  index = (index if key_shift is None else index - key_shift)[real]
  first, last = np.full(rows * (length + 1), length), np.full(rows * (length + 1), -1)
  np.minimum.at(first, key, index)
  np.maximum.at(last, key, index)
  return np.maximum((last - first + 1).reshape(rows, length + 1).max(axis=1, initial=0), 0)


def longest_item(segment_ids: np.ndarray, key_shift: np.ndarray | None = None) -> int:
  """The most tokens any segment of these rows [R, L] spans (`longest_items` over all rows)."""
  return int(longest_items(segment_ids, key_shift).max(initial=0))


def empty_rows(count: int, shape: RowShape) -> dict[str, np.ndarray]:
  """`count` padding token rows: they score nothing (all slots and targets unused)."""
  return TOKEN_ROWS.empty(count, shape, {"codebooks": shape.num_codebooks})


def _lay_row(arrays: dict[str, np.ndarray], r: int, units: list[_Unit | _RootUnit], laid: Sequence[LaidItem],
             align: int = 1) -> None:
  """Lays row r (either format): per unit, from the next multiple of `align`, its prefix, then each candidate
  branching from it (the positions its `LaidItem` gives), a target per candidate token and a slot per
  candidate; or a shared root and its items (`_lay_root_unit`)."""
  cursor, n_targets, n_slots = 0, 0, 0
  for segment, unit in enumerate(units, 1):
    cursor = -(-cursor // align) * align
    if isinstance(unit, _RootUnit):
      n_targets, n_slots = _lay_root_unit(arrays, r, cursor, segment, unit, laid, n_targets, n_slots)
      cursor += unit.tokens
      continue
    item = laid[unit.item]
    p = unit.prefix_len
    _lay_part(arrays, r, cursor, item.prefix, segment, 0, 0)
    last_prefix = cursor + p - 1
    cursor += p
    for c in unit.candidates:
      at_positions, at_targets = item.candidates[c]
      n, n_laid = _length(at_targets), _length(at_positions)
      _lay_part(arrays, r, cursor, at_positions, segment, c + 1, p)
      # token j of the candidate is predicted by the previous token: the last prefix token for j = 0
      _lay_targets(arrays, r, n_targets, np.concatenate([[last_prefix], cursor + np.arange(n - 1)]), at_targets,
                   n_slots, unit.item, c)
      n_targets += n
      n_slots += 1
      cursor += n_laid


def _lay_part(arrays: dict[str, np.ndarray], r: int, start: int, fields: Mapping[str, np.ndarray], segment: int,
              branch: int, first_position: int) -> None:
  """Writes a laid part's fields from `start` in row r, as `branch` of `segment`, positions from `first_position`."""
  span = slice(start, start + _length(fields))
  for name, value in fields.items():
    arrays[name][r, span] = value
  arrays["segment_ids"][r, span] = segment
  arrays["branch_ids"][r, span] = branch
  arrays["positions"][r, span] = first_position + np.arange(span.stop - span.start)


def _lay_targets(arrays: dict[str, np.ndarray], r: int, first: int, positions: np.ndarray,
                 fields: Mapping[str, np.ndarray], slot: int, item: int, candidate: int) -> None:
  """Writes one candidate's targets from table column `first` (predicted at `positions`) and its slot."""
  targets = slice(first, first + len(positions))
  arrays["target_pos"][r, targets] = positions
  for name, value in fields.items():
    arrays[name][r, targets] = value
  arrays["target_slot"][r, targets] = slot
  arrays["slot_item"][r, slot] = item
  arrays["slot_candidate"][r, slot] = candidate


def _lay_root_unit(arrays: dict[str, np.ndarray], r: int, start: int, segment: int, unit: _RootUnit,
                   laid: Sequence[LaidItem], n_targets: int, n_slots: int) -> tuple[int, int]:
  """Lays a shared root from `start` (branch 0 of `segment`, from its first item's prefix), then each item's rest of
  the prefix at its offset as branch b + 1 with positions continuing the root's, each of its one-token candidates a
  target at that part's last position (the root's last, for an item whose prefix is the root). Returns the target
  and slot counts after it."""
  root = unit.root
  _lay_part(arrays, r, start, {name: value[:root] for name, value in laid[unit.items[0]].prefix.items()}, segment,
            0, 0)
  for b, (index, offset) in enumerate(zip(unit.items, unit.offsets)):
    item = laid[index]
    rest = {name: value[root:] for name, value in item.prefix.items()}
    _lay_part(arrays, r, start + offset, rest, segment, b + 1, root)
    arrays["key_shift"][r, start + offset:start + offset + _length(rest)] = offset - root
    last = start + (offset + _length(rest) if _length(rest) else root) - 1
    for c, (_, at_targets) in enumerate(item.candidates):
      _lay_targets(arrays, r, n_targets, np.array([last]), at_targets, n_slots, index, c)
      n_targets += 1
      n_slots += 1
  return n_targets, n_slots
