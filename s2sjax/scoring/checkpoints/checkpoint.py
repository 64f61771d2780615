"""The on-disk model format: an orbax parameter tree plus the JSON that says what it is.

    DIR/model_config.json   the config of the checkpoint's architecture (s2sjax/scoring/architectures, found by its
                            `family`): a ModelConfig (architecture, audio input tables) for the shared decoder
    DIR/params/             orbax PyTree: the architecture's `abstract_params(config)`, a stacked top-level
                            `layers` subtree (the decoder's) stored one layer at a time (`layers/<i>/...`),
                            restacked on load
    DIR/extras/             orbax PyTree of tensors kept from the source but not used by the decoder (audio heads)
    DIR/tokenizer/          the tokenizer files, when the source had them
    DIR/manifest.json       provenance (source, dtype, kept and skipped keys), every leaf's checksum
                            (s2sjax/scoring/checkpoints/checksums.py), the size of every file under params/ and extras/, and hashes of
                            model_config.json and of the tokenizer files, all verified on load; written last

Leaves are written one at a time (orbax partial saves) and layers unstacked, so writing needs memory for about
one layer's largest tensor, not the model.
Everything goes to a hidden sibling directory (named after the host and process writing it) that is renamed
into place only when complete: a directory without `manifest.json` was never finished, and a later write removes
the leftovers of writers that died. `overwrite` replaces only a finished checkpoint or an empty directory, and
only once the new one is complete: the old one is renamed aside, the new one into place, then the old one removed
(a failed write leaves the old checkpoint as it was).

`open(path)` is the one way a command reads a checkpoint: it returns a reader (`Checkpoint` for this format,
`stacks.maxtext.StepFolder` for a folder MaxText wrote, read as it is) that the command opens once and hands on; the
readers answer the same calls (`config`, `manifest()`, `load_params`, `load_tokenizer`, `tokenizer_identity`,
`content_id()`, `max_positions`, `verify_stored()`, `unverified`).

The config is part of a checkpoint's identity: a model_config.json (or tokenizer file) changed after it was
written is refused by name, unless the caller accepts the change on purpose (`accept_changed_config`,
`--accept_config_change`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import shutil
import tempfile
import time
from typing import Any, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from s2sjax.scoring import architectures
from s2sjax.scoring.checkpoints import checksums
from s2sjax.scoring.checkpoints.stacks import maxtext
from s2sjax.scoring.checkpoints.stacks.maxtext_config import RunConfig
from s2sjax.runtime import sharding
from s2sjax.data import text_tokenizer
from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Params
from s2sjax.data.checkpoint_files import CONFIG, MANIFEST
from s2sjax.runtime.output_dir import DamagedFileError, fsync_path, read_json, strict_json
from s2sjax.runtime.staging import REPLACED, owner_tag, remove_dead, swap_into_place

ACCEPT_FLAG = "--accept_config_change"
LeafPath = tuple[str, ...]


class CheckpointError(UserError, ValueError):
  """A checkpoint directory that is missing, unfinished or does not fit its config."""


def _release_freed_memory() -> None:
  # glibc keeps freed leaf buffers in its arenas; hand them back so peak RSS tracks one leaf.
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except OSError:
    pass


def _nest(path: LeafPath, value: Any) -> dict:
  for key in reversed(path):
    value = {key: value}
  return value


def _save_leaves(
  directory: epath.Path, leaves: Iterable[tuple[LeafPath, np.ndarray]], batch_bytes: int = 256 << 20
) -> dict[LeafPath, tuple[tuple, str]]:
  """Saves leaves as they come, in partial saves of about `batch_bytes` (each save has a fixed cost, each byte
  held costs memory); returns {path: (shape, checksum)} of what was written."""
  from orbax.checkpoint.experimental.v1 import partial

  written: dict[LeafPath, tuple[tuple, str]] = {}
  batch: dict = {}
  held = 0
  for path, array in leaves:
    array = np.asarray(array)
    _merge(batch, _nest(path, array))
    written[path] = (array.shape, checksums.host_checksum(array))
    held += array.nbytes
    del array
    if held >= batch_bytes:
      partial.save(directory, batch)
      batch, held = {}, 0
      _release_freed_memory()
  if batch:
    partial.save(directory, batch)
  if written:
    partial.finalize(directory)
  return written


def _model(config):
  """(abstract_params, param_logical_axes) of the model a config describes: its architecture's."""
  architecture = architectures.for_config(config)
  return architecture.abstract_params, architecture.param_logical_axes


def disk_layout(abstract: Params) -> dict[LeafPath, jax.ShapeDtypeStruct]:
  """Stored leaves: every stacked `layers/...` leaf [n, ...] becomes n leaves `layers/<i>/...`."""
  out = {}
  for path, leaf in flatten(abstract):
    if path[0] == "layers":
      for i in range(leaf.shape[0]):
        out[("layers", str(i)) + path[1:]] = jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
    else:
      out[path] = leaf
  return out


def _check_shapes(expected: Mapping[LeafPath, tuple], given: Mapping[LeafPath, tuple]) -> None:
  """Raises CheckpointError naming every missing, unexpected or mis-shaped key."""
  problems = [f"missing {'/'.join(p)}" for p in sorted(expected.keys() - given.keys())]
  problems += [f"unexpected {'/'.join(p)}" for p in sorted(given.keys() - expected.keys())]
  problems += [
    f"{'/'.join(p)}: shape {given[p]}, config implies {expected[p]}"
    for p in sorted(expected.keys() & given.keys())
    if tuple(given[p]) != tuple(expected[p])
  ]
  if problems:
    raise CheckpointError("parameters do not fit the config:\n  " + "\n  ".join(problems))


PARTIAL = "partial"  # the kind of a checkpoint being written (s2sjax/runtime/staging.py)


def _remove_stale_staging(out_dir: epath.Path) -> list[str]:
  """Deletes staging directories of `out_dir` left by writers on this host that are no longer running (a kill
  leaves them behind, possibly GBs), and the old checkpoints they had renamed aside once a finished one is in
  place again; those of other hosts are left and named in the log."""
  removed = remove_dead(out_dir.parent, f".{out_dir.name}.{PARTIAL}-")
  if (out_dir / MANIFEST).exists():  # a swap that was cut short left the old one aside: the new one is whole
    removed += remove_dead(out_dir.parent, f".{out_dir.name}.{REPLACED}-")
  return removed


def _check_replaceable(out_dir: epath.Path, overwrite: bool) -> None:
  """An existing output is replaced only when asked, and only if it is a finished s2sjax checkpoint or empty."""
  if not out_dir.exists():
    return
  if not overwrite:
    raise CheckpointError(f"{out_dir} already exists (pass overwrite=True / --overwrite to replace it)")
  if not out_dir.is_dir():
    raise CheckpointError(f"{out_dir} is a file, not a checkpoint directory: --overwrite replaces only checkpoints")
  if any(out_dir.iterdir()) and not ((out_dir / MANIFEST).exists() and (out_dir / "model_config.json").exists()):
    raise CheckpointError(f"{out_dir} is neither an s2sjax checkpoint nor empty: --overwrite will not delete it "
                          "(remove it yourself, or choose another --output)")


def write_checkpoint(
  out_dir: str | epath.Path,
  config: ModelConfig,
  leaves: Iterable[tuple[LeafPath, np.ndarray]],
  *,
  extras: Iterable[tuple[LeafPath, np.ndarray]] = (),
  tokenizer_dir: str | epath.Path | None = None,
  manifest: Mapping[str, Any] | None = None,
  overwrite: bool = False,
) -> epath.Path:
  """Writes a checkpoint from lazily produced (path, array) leaves; returns its directory. The manifest records
  every leaf's checksum, which `Checkpoint.load_params` verifies."""
  out_dir = epath.Path(out_dir)
  _check_replaceable(out_dir, overwrite)
  _remove_stale_staging(out_dir)
  tag = owner_tag()
  staging = out_dir.parent / f".{out_dir.name}.{PARTIAL}-{tag}"
  staging.mkdir(parents=True)
  try:
    (staging / CONFIG).write_text(config.to_json())
    written = _save_leaves(staging / "params", leaves)
    expected = {path: leaf.shape for path, leaf in disk_layout(_model(config)[0](config)).items()}
    _check_shapes(expected, {path: shape for path, (shape, _) in written.items()})
    written_extras = _save_leaves(staging / "extras", extras)
    if tokenizer_dir is not None:
      shutil.copytree(str(tokenizer_dir), str(staging / "tokenizer"))
    sums = {"params": {"/".join(p): c for p, (_, c) in sorted(written.items())},
            "extras": {"/".join(p): c for p, (_, c) in sorted(written_extras.items())}}
    record = dict(manifest or {}, checksums=sums, files=_file_sizes(staging), config_sha256=_config_hash(staging),
                  tokenizer_sha256=_tokenizer_hash(staging))
    (staging / MANIFEST).write_text(strict_json(record, f"{out_dir}/{MANIFEST}", indent=2, sort_keys=True,
                                                default=str))
    fsync_path(staging / MANIFEST)
    swap_into_place(staging, out_dir, tag)
  except BaseException:
    shutil.rmtree(str(staging), ignore_errors=True)
    raise
  return out_dir


def _file_sizes(ckpt_dir: epath.Path) -> dict[str, int]:
  """{relative path: bytes} of every file under params/ and extras/: what orbax will read back."""
  return {f"{folder}/{name}": path.stat().length for folder in ("params", "extras")
          for name, path in _files(ckpt_dir / folder)}


def _config_hash(ckpt_dir: epath.Path) -> str:
  return hashlib.sha256((ckpt_dir / CONFIG).read_bytes()).hexdigest()


def _tokenizer_files(ckpt_dir: epath.Path) -> list[epath.Path]:
  """The tokenizer's files: the regular, visible files of tokenizer/ (what transformers reads; a notebook's
  `.ipynb_checkpoints` or a `.DS_Store` left there is not the tokenizer)."""
  folder = ckpt_dir / "tokenizer"
  if not folder.exists():
    return []
  return sorted((p for p in folder.iterdir() if not p.name.startswith(".") and not p.is_dir()), key=lambda p: p.name)


def _tokenizer_hash(ckpt_dir: epath.Path) -> str | None:
  files = _tokenizer_files(ckpt_dir)
  if not files:
    return None
  digest = hashlib.sha256()
  for path in files:
    digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
  return digest.hexdigest()


def flatten(tree: Mapping[str, Any], prefix: LeafPath = ()) -> list[tuple[LeafPath, Any]]:
  """Nested dict -> [(key path, leaf)] in sorted key order."""
  items = []
  for key in sorted(tree):
    value = tree[key]
    items.extend(flatten(value, prefix + (key,)) if isinstance(value, Mapping) else [(prefix + (key,), value)])
  return items


def save_params(out_dir, config: ModelConfig, params: Params, **kwargs) -> epath.Path:
  """Saves an in-memory parameter tree (e.g. from a JAX training run) after checking it against the config."""
  check_params(config, params)
  return write_checkpoint(out_dir, config, _unstacked(params), **kwargs)


def _unstacked(params: Params) -> Iterator[tuple[LeafPath, np.ndarray]]:
  for path, leaf in flatten(params):
    if path[0] == "layers":
      for i in range(leaf.shape[0]):
        yield ("layers", str(i)) + path[1:], np.asarray(jax.device_get(leaf[i]))
    else:
      yield path, np.asarray(jax.device_get(leaf))


def check_params(config: ModelConfig, params: Params) -> None:
  """Raises CheckpointError naming every missing, unexpected or mis-shaped key of an in-memory tree."""
  expected = {path: leaf.shape for path, leaf in flatten(_model(config)[0](config))}
  _check_shapes(expected, {path: tuple(np.shape(leaf)) for path, leaf in flatten(params)})


def _require_finished(ckpt_dir: epath.Path) -> None:
  if not (ckpt_dir / MANIFEST).exists():
    if ckpt_dir.exists():
      raise CheckpointError(f"{ckpt_dir} is not a finished s2sjax checkpoint (no {MANIFEST})")
    raise CheckpointError(f"checkpoint {ckpt_dir} does not exist")


def _read_json(path: epath.Path, what: str) -> Any:
  try:
    value = read_json(path, what, "the checkpoint is damaged: restore it or re-convert it")
  except DamagedFileError as e:
    raise CheckpointError(str(e)) from None
  if not isinstance(value, dict):
    raise CheckpointError(f"{path}, {what}, holds a JSON {type(value).__name__}, not an object: restore it or "
                          "re-convert it")
  return value


def _load_config(ckpt_dir: str | epath.Path, accept_changed_config: bool = False):
  """The checkpoint's config: a ModelConfig, or the config of the architecture model_config.json's `family` names
  (`architectures.for_family`). A
  model_config.json that differs from the one written with the checkpoint (the manifest's hash) is refused, unless
  `accept_changed_config` (an edit made on purpose)."""
  ckpt_dir = epath.Path(ckpt_dir)
  manifest = _load_manifest(ckpt_dir)
  path = ckpt_dir / CONFIG
  if not path.exists():
    raise CheckpointError(f"{path} is missing: restore it or re-convert the checkpoint")
  fields = _read_json(path, "the model's config")
  recorded = manifest.get("config_sha256")
  if recorded is not None and recorded != _config_hash(ckpt_dir) and not accept_changed_config:
    raise CheckpointError(
      f"{path} differs from the config written with the checkpoint (its hash in {MANIFEST}): edited or replaced "
      f"after conversion, so the parameters may not mean what it says. Restore it or re-convert; to score the "
      f"edited config on purpose, pass {ACCEPT_FLAG}")
  text = path.read_text()
  try:
    return architectures.for_family(fields.get("family")).config_class.from_json(text)
  except (TypeError, KeyError) as e:  # a field missing or unknown: the dataclass's own words
    raise CheckpointError(f"{path} does not describe a model ({type(e).__name__}: {e}): restore it or re-convert "
                          "the checkpoint") from None


def _load_manifest(ckpt_dir: str | epath.Path) -> dict:
  ckpt_dir = epath.Path(ckpt_dir)
  _require_finished(ckpt_dir)
  return _read_json(ckpt_dir / MANIFEST, "the checkpoint's manifest")


def _check_files(ckpt_dir: epath.Path, recorded: Mapping[str, int], folder: str) -> None:
  """Every file orbax wrote under `folder`, there and of the size it was written with: a deleted data file or
  process folder, or a truncated one, is named here rather than in a page of orbax's errors."""
  recorded = {name: size for name, size in recorded.items() if name.startswith(folder + "/")}
  found = dict((f"{folder}/{name}", path) for name, path in _files(ckpt_dir / folder))
  problems = [f"{name} is missing" for name in sorted(recorded.keys() - found.keys())]
  problems += [f"{name} holds {found[name].stat().length} bytes, {size} were written (truncated or replaced)"
               for name, size in sorted(recorded.items()) if name in found and found[name].stat().length != size]
  if problems:
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    raise CheckpointError(f"{ckpt_dir} is damaged: {shown}. Restore it or re-convert it.")


def _load_params(ckpt_dir: str | epath.Path, mesh: Mesh | None = None, dtype=None, verify: bool = True,
                 accept_changed_config: bool = False) -> Params:
  """Restores the parameters onto `mesh` (default: every device, data-parallel), sharded by the logical rules,
  optionally cast to `dtype`. Works for any device count, whatever the one the checkpoint was written with.
  With `verify`, every leaf's checksum is held against the one written with it (on the devices, one pass over
  the parameters), and a leaf that differs is refused by name; a deleted or truncated file is refused by name
  before orbax reads anything."""
  from orbax.checkpoint.experimental import v1 as ocp

  ckpt_dir = epath.Path(ckpt_dir)
  config = _load_config(ckpt_dir, accept_changed_config)
  manifest = _load_manifest(ckpt_dir)
  if "files" in manifest:
    _check_files(ckpt_dir, manifest["files"], "params")
  mesh = mesh or sharding.make_mesh()
  abstract_params, param_logical_axes = _model(config)
  abstract = abstract_params(config)
  shardings = dict(flatten(sharding.logical_to_sharding(param_logical_axes(config), abstract, mesh)))
  try:
    saved = dict(flatten(ocp.metadata(ckpt_dir / "params").metadata))
  except Exception as e:  # orbax's many kinds of "cannot read this": one line, naming the folder
    raise CheckpointError(f"{ckpt_dir}/params cannot be read ({type(e).__name__}: {_first_line(e)}); restore or "
                          "re-convert it") from e
  stored = disk_layout(abstract)
  mismatched = sorted(set(saved) ^ set(stored))
  if mismatched:
    raise CheckpointError(f"{ckpt_dir}/params does not match model_config.json at keys: {mismatched[:10]}")

  def layer_sharding(path: LeafPath):
    whole = shardings[("layers",) + path[2:] if path[0] == "layers" else path]
    return whole if path[0] != "layers" else NamedSharding(mesh, PartitionSpec(*whole.spec[1:]))

  target = {}
  for path, leaf in stored.items():  # restored as saved: the checksums are of the saved bits
    _merge(target, _nest(path, jax.ShapeDtypeStruct(leaf.shape, saved[path].dtype, sharding=layer_sharding(path))))
  try:
    restored = ocp.load(ckpt_dir / "params", target)
  except Exception as e:  # what unreadable (truncated, corrupted) files raise, of many types
    raise CheckpointError(f"{ckpt_dir}/params cannot be read ({type(e).__name__}: {_first_line(e)}); restore or "
                          "re-convert it") from e
  if "layers" in abstract:  # the decoder's layers, stored one at a time
    per_layer = restored.pop("layers")
    layers = {}
    for path, _ in flatten(abstract["layers"]):
      slices = [dict(flatten(per_layer[str(i)]))[path] for i in range(config.num_layers)]
      stack = jax.jit(lambda *xs: jnp.stack(xs), out_shardings=shardings[("layers",) + path])
      _merge(layers, _nest(path, stack(*slices)))
    restored["layers"] = layers
  expected = manifest.get("checksums", {}).get("params")
  if verify and expected is not None:
    _verify(ckpt_dir, restored, expected)
  if dtype is None:
    return restored
  cast = jax.jit(lambda tree: jax.tree.map(lambda leaf: leaf.astype(dtype), tree),  # one program for the tree
                 out_shardings=jax.tree.map(lambda leaf: leaf.sharding, restored))
  return cast(restored)


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [""])[0][:300]


def _verify(ckpt_dir: epath.Path, params: Params, expected: Mapping[str, str]) -> None:
  """Raises CheckpointError naming every leaf whose checksum differs from the one written with it."""
  start = time.time()
  leaves = flatten(params)
  stacked = [path[0] == "layers" for path, _ in leaves]
  found = checksums.device_checksums([leaf for _, leaf in leaves], stacked)
  differ = []
  for (path, leaf), is_stacked, sums in zip(leaves, stacked, found):
    names = (["/".join(("layers", str(i)) + path[1:]) for i in range(leaf.shape[0])] if is_stacked
             else ["/".join(path)])
    differ += [name for name, checksum in zip(names, sums) if expected.get(name) != checksum]
  if differ:
    shown = ", ".join(differ[:10]) + (f" and {len(differ) - 10} more" if len(differ) > 10 else "")
    raise CheckpointError(f"{ckpt_dir}: {len(differ)} parameter leaf/leaves differ from the checksums written with "
                          f"them (corrupted or replaced files): {shown}. Re-convert or restore the checkpoint.")
  logging.info("%s: %d parameter leaves verified in %.2fs", ckpt_dir, len(expected), time.time() - start)


def _content_id(ckpt_dir: str | epath.Path) -> str:
  """What the checkpoint holds, as a short hash: its config, every leaf's checksum and its tokenizer files. A
  checkpoint replaced at the same path gets another id; a copy elsewhere the same one. Checkpoints written before
  checksums were recorded are hashed from their files' bytes instead."""
  ckpt_dir = epath.Path(ckpt_dir)
  manifest = _load_manifest(ckpt_dir)
  digest = hashlib.sha256((ckpt_dir / CONFIG).read_bytes())
  if "checksums" in manifest:
    digest.update(json.dumps(manifest["checksums"], sort_keys=True).encode())
    for path in _tokenizer_files(ckpt_dir):
      digest.update(f"tokenizer/{path.name}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
  for folder in ("params", "extras", "tokenizer"):
    for name, path in _files(ckpt_dir / folder):
      digest.update(f"{folder}/{name}".encode() + b"\0" + path.read_bytes())
  return digest.hexdigest()[:16]


def _files(root: epath.Path, prefix: str = "") -> list[tuple[str, epath.Path]]:
  """(relative name, path) of every file under `root`, sorted (epath has no recursive glob for buckets)."""
  if not root.exists():
    return []
  found = []
  for path in sorted(root.iterdir()):
    name = f"{prefix}{path.name}"
    found += _files(path, name + "/") if path.is_dir() else [(name, path)]
  return found


def _load_tokenizer(ckpt_dir: str | epath.Path, trust_remote_code: bool = False,
                    accept_changed_config: bool = False):
  """The checkpoint's text tokenizer (transformers), or None when it holds none. A bucket's files are copied to a
  local temporary folder first: transformers reads local folders only (stray folders and hidden files left in
  tokenizer/ are not copied). A tokenizer shipped as code (GLM-4's `tokenization_chatglm.py`) runs only with
  `trust_remote_code`. Tokenizer files changed since the checkpoint was written are refused like its config."""
  return _read_tokenizer(ckpt_dir, trust_remote_code, accept_changed_config, text_tokenizer.load)


def _tokenizer_identity(ckpt_dir: str | epath.Path, trust_remote_code: bool = False,
                        accept_changed_config: bool = False) -> dict | None:
  """`text_tokenizer.identity` of `load_tokenizer`'s tokenizer, under the same rules, without loading it when its
  files were read before (`text_tokenizer.folder_identity`); None when the checkpoint holds no tokenizer."""
  return _read_tokenizer(ckpt_dir, trust_remote_code, accept_changed_config, text_tokenizer.folder_identity)


def _read_tokenizer(ckpt_dir: str | epath.Path, trust_remote_code: bool, accept_changed_config: bool, read):
  """`read(folder, trust_remote_code, whose)` of a local copy of the checkpoint's tokenizer/ files, once they are
  held to the manifest's hash; None when there are none."""
  ckpt_dir = epath.Path(ckpt_dir)
  tokenizer_dir = ckpt_dir / "tokenizer"
  if not tokenizer_dir.exists():
    return None
  files = _tokenizer_files(ckpt_dir)
  if not files:  # an empty folder (or one holding only a notebook's leftovers) holds no tokenizer
    return None
  recorded = _load_manifest(ckpt_dir).get("tokenizer_sha256")
  if recorded is not None and recorded != _tokenizer_hash(ckpt_dir) and not accept_changed_config:
    raise CheckpointError(
      f"{tokenizer_dir}'s files ({', '.join(p.name for p in files) or 'none'}) differ from the ones written with "
      f"the checkpoint (their hash in {MANIFEST}): edited or replaced after conversion. Restore them or re-convert; "
      f"to use them on purpose, pass {ACCEPT_FLAG}")
  with tempfile.TemporaryDirectory() as local:
    for item in files:
      (epath.Path(local) / item.name).write_bytes(item.read_bytes())
    return read(local, trust_remote_code, f"{ckpt_dir}'s tokenizer")


def load_extras(ckpt_dir: str | epath.Path) -> dict[str, np.ndarray]:
  from orbax.checkpoint.experimental import v1 as ocp

  path = epath.Path(ckpt_dir) / "extras"
  return ocp.load(path) if path.exists() else {}


def _merge(tree: dict, other: dict) -> dict:
  for key, value in other.items():
    tree[key] = _merge(tree.get(key, {}), value) if isinstance(value, dict) else value
  return tree


# Keys of a transformers config.json that give the positions a model was trained on (the hf lm-eval backend's
# `max_length` reads n_positions, max_position_embeddings, n_ctx: lm_eval/models/huggingface.py)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_sequence_length")


class Checkpoint:
  """A checkpoint this project wrote (module docstring), opened once: its config and manifest read and verified
  here, its parameters and tokenizer when asked."""

  def __init__(self, path: str | epath.Path, accept_changed_config: bool = False):
    self.path = epath.Path(path)
    self.accept_changed_config = accept_changed_config
    self._manifest = _load_manifest(self.path)
    self.unverified: list[str] = []  # the manifest's hashes hold the config and the tokenizer

  @functools.cached_property
  def config(self):
    """model_config.json, held to the hash written with it (`accept_changed_config` takes an edit on purpose)."""
    return _load_config(self.path, self.accept_changed_config)

  def manifest(self) -> dict:
    return self._manifest

  @property
  def max_positions(self) -> int | None:
    """The positions the model was trained on: its position table's, else the source config.json's (None when it
    names none, as a config written by hand need not)."""
    if self.config.max_positions:
      return self.config.max_positions
    source = self._manifest.get("source_config") or {}
    found = [source[key] for key in POSITION_KEYS if isinstance(source.get(key), int) and source[key] > 0]
    return found[0] if found else None

  def verify_stored(self) -> None:
    """Every parameter file there and of the size it was written with (the checksums are held as they load)."""
    if "files" in self._manifest:
      _check_files(self.path, self._manifest["files"], "params")

  def load_params(self, mesh: Mesh | None = None, dtype=None, verify: bool = True) -> Params:
    return _load_params(self.path, mesh, dtype, verify, self.accept_changed_config)

  def load_tokenizer(self, trust_remote_code: bool = False):
    return _load_tokenizer(self.path, trust_remote_code, self.accept_changed_config)

  def tokenizer_identity(self, trust_remote_code: bool = False) -> dict | None:
    return _tokenizer_identity(self.path, trust_remote_code, self.accept_changed_config)

  def content_id(self) -> str:
    return _content_id(self.path)


def open(path: str | epath.Path, run_config: RunConfig | None = None,  # noqa: A001 - checkpoint.open, as io.open
         accept_changed_config: bool = False) -> "Checkpoint | maxtext.StepFolder":
  """The reader of the checkpoint at `path`: a MaxText step folder's (read with `run_config`, else the config.yml
  beside its run), or this project's (a model_config.json changed on purpose read with `accept_changed_config`).
  Opened once per command and handed on."""
  if maxtext.is_step_folder(path):
    return maxtext.StepFolder(path, run_config)
  return Checkpoint(path, accept_changed_config)


def load_config(path: str | epath.Path, accept_changed_config: bool = False):
  """The config of the checkpoint at `path` (`open(path).config`), for a caller that needs nothing else."""
  return open(path, accept_changed_config=accept_changed_config).config


def load_manifest(path: str | epath.Path) -> dict:
  return open(path).manifest()


def load_params(path: str | epath.Path, mesh: Mesh | None = None, dtype=None, verify: bool = True,
                accept_changed_config: bool = False) -> Params:
  return open(path, accept_changed_config=accept_changed_config).load_params(mesh, dtype, verify)


def load_tokenizer(path: str | epath.Path, trust_remote_code: bool = False, accept_changed_config: bool = False):
  return open(path, accept_changed_config=accept_changed_config).load_tokenizer(trust_remote_code)
