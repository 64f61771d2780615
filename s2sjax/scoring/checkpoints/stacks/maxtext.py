"""MaxText's parameters on this project's decoder: the map from MaxText's tree (as its checkpoints hold it and its
training loop holds it live) onto `s2sjax.model.decoder`'s, and the reader of its checkpoint folders.

MaxText's tree (maxtext 0.2.5; ../upstream-oracles/maxtext/PROVENANCE.txt, section 6, lists every leaf):
`token_embedder/embedding [vocab, emb]`, `decoder/decoder_norm/scale`, `decoder/logits_dense/kernel [emb, vocab]`
(untied models), and per layer `pre_self_attention_layer_norm`, `post_self_attention_layer_norm`,
`self_attention/{query,key,value,out}/kernel` (`[emb, heads, head_dim]`, out `[heads, head_dim, emb]`: DenseGeneral
keeps the heads as their own dims, as this decoder does), `self_attention/{query,key,value}/bias` `[heads, head_dim]`
(Qwen2) and `mlp/{wi_0,wi_1,wo}/kernel` (gate, up, down: `layers/linears.py:710,823`), under `decoder/layers` with
the layer axis at `param_scan_axis` of every leaf when scanned, under `decoder/layers_<i>` when not. The
conventions that change numbers (query pre-scaling, interleaved rope, a bfloat16 tied head) are applied as
`maxtext_config.MaxTextModel` says; the permutation of q/k features from interleaved pairs to halves is the one
MaxText's own HF export applies (`checkpoint_conversion/utils/param_mapping.py:2699`), the query rescaling its
`scale_query_layer` (`:2687`).

A checkpoint folder (`checkpointing.py:1286,1339`: `<run>/checkpoints/<step>/items`, full training state; or
`save_params_to_path`'s params-only folder, `:1112`) is an orbax PyTree of OCDBT + zarr3 arrays whose parameters
sit at `items/params/params` (`train_state_nnx.py:148`); only that subtree is restored (optimizer state, step and
NNX rng state are not read), onto the evaluation mesh with shardings derived from the decoder's, then mapped on the
devices. A folder without orbax's `commit_success.txt` is still being written (orbax writes it last,
`_src/path/atomicity.py`) and is refused.

MaxText writes no checksums of its data (its zstd chunks say `"checksum": false`). What a read is held to: the
PyTree's `_METADATA` and OCDBT B-tree (`_check_index`), every array's shard index, whose crc32c TensorStore keeps at
the end of the shard file (`verify_stored`: a cut, rewritten or missing file is named with its parameter before
any data is read), and finite values (a change that decodes to finite numbers cannot be told from trained weights).
Orbax reads in a worker thread (`cli.in_worker`), so Ctrl-C stops a command mid-read without blaming a file.
What the reader records: a folder's content id hashes its run config's model
keys, its `_CHECKPOINT_METADATA` (the commit timestamp orbax writes) and the name and size of every file (OCDBT
data files are named afresh by every write), so a step rewritten at the same path is told apart; and `load`
returns every restored leaf's checksum (`s2sjax.scoring.checkpoints.checksums`, computed on the devices), which the converter writes
into the converted checkpoint's manifest (`source_checksums`), so the converted checkpoint holds exactly the bits
read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from s2sjax.scoring.checkpoints import checksums
from s2sjax.runtime import cli, sharding
from s2sjax.data import text_tokenizer
from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Params, abstract_params, param_logical_axes
from s2sjax.scoring.checkpoints.stacks.maxtext_config import (RUN_CONFIG_FILE, MaxTextModel, RunConfig, describe, disagreements,
                                                  model_keys, run_config_for, saved_beside)

Path = tuple[str, ...]
COMMIT_MARKER = "commit_success.txt"  # orbax's, written last (atomicity.py COMMIT_SUCCESS_FILE)
STEP_METADATA = "_CHECKPOINT_METADATA"
ORBAX_METADATA = "_METADATA"  # the PyTree's own, in items/
ITEMS = "items"  # checkpointing.py:1339: the state is saved as the checkpointable named items
PARAMS = ("params", "params")  # items/params/params: the Linen `params` collection under the item's key


class MaxTextError(UserError, ValueError):
  """A MaxText folder or parameter tree that is unfinished, unreadable or not the model its run config says."""


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One decoder leaf and the MaxText leaf it comes from (per layer: relative to the layer)."""

  target: Path
  source: Path
  per_layer: bool = False
  query: bool = False  # times MaxTextModel.query_scale
  rotated: bool = False  # q/k features, last axis head_dim: interleaved pairs permuted to halves


_LAYER_LEAVES = (
  Leaf(("layers", "attn_norm", "scale"), ("pre_self_attention_layer_norm", "scale"), True),
  Leaf(("layers", "mlp_norm", "scale"), ("post_self_attention_layer_norm", "scale"), True),
  Leaf(("layers", "attn", "q", "kernel"), ("self_attention", "query", "kernel"), True, query=True, rotated=True),
  Leaf(("layers", "attn", "k", "kernel"), ("self_attention", "key", "kernel"), True, rotated=True),
  Leaf(("layers", "attn", "v", "kernel"), ("self_attention", "value", "kernel"), True),
  Leaf(("layers", "attn", "o", "kernel"), ("self_attention", "out", "kernel"), True),
  Leaf(("layers", "mlp", "gate", "kernel"), ("mlp", "wi_0", "kernel"), True),
  Leaf(("layers", "mlp", "up", "kernel"), ("mlp", "wi_1", "kernel"), True),
  Leaf(("layers", "mlp", "down", "kernel"), ("mlp", "wo", "kernel"), True),
)
_BIASES = (
  Leaf(("layers", "attn", "q", "bias"), ("self_attention", "query", "bias"), True, query=True, rotated=True),
  Leaf(("layers", "attn", "k", "bias"), ("self_attention", "key", "bias"), True, rotated=True),
  Leaf(("layers", "attn", "v", "bias"), ("self_attention", "value", "bias"), True),
)
EMBEDDING = ("token_embedder", "embedding")


def leaves(model: MaxTextModel) -> list[Leaf]:
  """Every decoder leaf a MaxText model maps to, except a tied head (made from the embedding)."""
  found = [Leaf(("embed", "embedding"), EMBEDDING), Leaf(("final_norm", "scale"), ("decoder", "decoder_norm", "scale"))]
  if not model.tied_head:
    found.append(Leaf(("lm_head", "kernel"), ("decoder", "logits_dense", "kernel")))
  return found + list(_LAYER_LEAVES) + (list(_BIASES) if model.config.qkv_bias else [])


def source_paths(model: MaxTextModel, leaf: Leaf) -> list[Path]:
  """Where a leaf sits in MaxText's tree: once (scanned, or not per layer) or once per layer."""
  if not leaf.per_layer:
    return [leaf.source]
  if model.scan_layers:
    return [("decoder", "layers") + leaf.source]
  return [("decoder", f"layers_{i}") + leaf.source for i in range(model.config.num_layers)]


def _scanned_axes(model: MaxTextModel, axes: tuple) -> tuple:
  """A per-layer leaf's target axes (layer first) in the order MaxText stores them: the layer axis at scan_axis."""
  rest = list(axes[1:])
  return tuple(rest[: model.scan_axis] + [axes[0]] + rest[model.scan_axis:])


def expected_shapes(model: MaxTextModel) -> dict[Path, tuple[int, ...]]:
  """{MaxText path: shape} of every parameter the model's checkpoint must hold."""
  abstract = _flat(abstract_params(model.config))
  shapes = {}
  for leaf in leaves(model):
    shape = tuple(abstract[leaf.target].shape)
    for path in source_paths(model, leaf):
      shapes[path] = (_scanned_axes(model, shape) if model.scan_layers else shape[1:]) if leaf.per_layer else shape
  return shapes


def _halves_order(head_dim: int) -> np.ndarray:
  """Feature order that turns rope's interleaved pairs (2i, 2i+1) into halves (i, i + head_dim/2)."""
  return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def to_decoder_params(model: MaxTextModel, tree: Mapping[str, Any]) -> Params:
  """MaxText's parameter tree (its `params` collection; one enclosing {"params": ...} is unwrapped) as the
  decoder's: pure jnp, so it runs under jit, on the devices that hold the tree."""
  if "decoder" not in tree and set(tree) == {"params"}:
    tree = tree["params"]
  out: dict = {}
  for leaf in leaves(model):
    pieces = [_get(tree, path) for path in source_paths(model, leaf)]
    if not leaf.per_layer:
      value = pieces[0]
    elif model.scan_layers:
      value = jnp.moveaxis(pieces[0], model.scan_axis, 0)
    else:
      value = jnp.stack(pieces)
    if leaf.query and model.query_scale != 1.0:
      value = value * jnp.asarray(model.query_scale, value.dtype)
    if leaf.rotated and model.interleaved_rope:
      value = value[..., _halves_order(model.config.head_dim)]
    _put(out, leaf.target, value)
  if model.tied_head:  # layers/embeddings.py:201: MaxText's tied logits read the table in bfloat16
    table = _get(tree, EMBEDDING)
    head = table.astype(jnp.bfloat16).astype(table.dtype) / jnp.asarray(model.head_divisor, table.dtype)
    _put(out, ("lm_head", "kernel"), head.T)
  return out


def params_adapter(run: RunConfig | str) -> Callable[[Any], Params]:
  """For `Evaluator(config, data, params_adapter=...)` in a MaxText training loop: its live parameters (the
  Linen-layout tree its checkpoints hold: `state.params`, or `to_linen_checkpoint_dict(state)["params"]` of an NNX
  train state, `train_state_nnx.py:148`) mapped onto the decoder in one compiled program, on the devices, with no
  copy through the host. `decoder_config(run)` is the config to build the Evaluator with."""
  model = describe(RunConfig.parse(run) if isinstance(run, str) else run)
  return jax.jit(functools.partial(to_decoder_params, model))


def decoder_config(run: RunConfig | str) -> ModelConfig:
  """The decoder config of a MaxText run config (`--maxtext_config`'s text, or a RunConfig)."""
  return describe(RunConfig.parse(run) if isinstance(run, str) else run).config


# ---- Checkpoint folders ----------------------------------------------------------------------------------------------


def step_root(path: str | epath.Path) -> epath.Path:
  """The folder a MaxText path names: a `.../items` path as its step folder (`checkpointing.py:633`)."""
  path = epath.Path(path)
  return path.parent if path.name == ITEMS and (path.parent / STEP_METADATA).exists() else path


def is_step_folder(path: str | epath.Path) -> bool:
  """Whether a path is a checkpoint folder MaxText's CheckpointManager or save_params_to_path wrote (finished or
  not): orbax's step metadata beside an `items` PyTree."""
  root = step_root(path)
  return (root / STEP_METADATA).exists() and (root / ITEMS).is_dir()


def is_committed(path: str | epath.Path) -> bool:
  return (step_root(path) / COMMIT_MARKER).exists()


@dataclasses.dataclass(frozen=True)
class Loaded:
  config: ModelConfig
  params: Params
  checksums: dict[str, str]  # MaxText path -> checksum of the leaf as restored (s2sjax.scoring.checkpoints.checksums)


class StepFolder:
  """One MaxText checkpoint folder, read with a run config (given, or the config.yml beside its run): the reader
  `s2sjax.scoring.checkpoints.checkpoint.open` returns for it."""

  def __init__(self, path: str | epath.Path, run: RunConfig | None = None):
    self.path = step_root(path)
    if not is_step_folder(self.path):
      raise MaxTextError(f"{path} is not a MaxText checkpoint folder (no {STEP_METADATA} beside {ITEMS}/)")
    if not is_committed(self.path):
      raise MaxTextError(f"{self.path} has no {COMMIT_MARKER}: orbax is still writing it (or its writer died); it "
                         "is read once committed")
    self.run = run_config_for(self.path, run)
    saved = saved_beside(self.path)
    if run is not None and saved is not None:  # the run's own config, with what the flag adds (a tokenizer_path)
      own = RunConfig.from_yaml(saved)
      if differ := disagreements(run, own):
        raise MaxTextError(f"{self.path}: {run.source} gives {'; '.join(differ)}: the checkpoint's own config names "
                           f"another model; drop the flag, or fix the keys it gives")
      self.run = RunConfig(tuple({**dict(own.keys), **dict(run.keys)}.items()), f"{saved} with {run.source}")
    # what no file here confirms: the run config's model is taken as given
    self.unverified = [] if saved is not None else [
      f"model_name={self.run.model_name!r} and the rope, head and norm settings: taken from {self.run.source}, as no "
      f"{RUN_CONFIG_FILE} beside the run says which model this is"]
    self.step_metadata = self._read_step_metadata()
    self.top_level, self.saved = self._saved_params()
    self.model = self._model()

  def _read_step_metadata(self) -> dict:
    try:
      value = json.loads((self.path / STEP_METADATA).read_text())
    except (OSError, ValueError) as e:
      raise MaxTextError(f"{self.path}/{STEP_METADATA} cannot be read ({e}): the folder is damaged") from None
    return value if isinstance(value, dict) else {}

  def _saved_params(self) -> tuple[list[str], dict[Path, Any]]:
    """(the items' top-level keys, {path under items/params/params: orbax ArrayMetadata}), read from the PyTree's
    metadata alone. Orbax reads in a worker (`cli.in_worker`): Ctrl-C stops the command, and no file is blamed
    for a read it cut short."""
    from orbax.checkpoint.experimental import v1 as ocp

    _check_index(self.path / ITEMS)
    try:
      tree = cli.in_worker(lambda: ocp.metadata(self.path, checkpointable_name=ITEMS).metadata)
    except Exception as e:  # orbax's many kinds of "cannot read this": one line naming the folder
      raise MaxTextError(f"{self.path}/{ITEMS} cannot be read as an orbax PyTree ({type(e).__name__}: "
                         f"{_first_line(e)})") from None
    if tree is None:  # what orbax returns for a _METADATA or OCDBT index it cannot parse
      raise MaxTextError(f"{self.path}/{ITEMS}: orbax reads no tree from its {ORBAX_METADATA} and OCDBT index "
                         f"(manifest.ocdbt, d/): the folder is damaged; restore the step")
    params = tree
    for key in PARAMS:
      if not isinstance(params, Mapping) or key not in params:
        raise MaxTextError(f"{self.path}/{ITEMS} holds no {'/'.join(PARAMS)} (its top level: "
                           f"{sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__})")
      params = params[key]
    return sorted(tree), _flat(params)

  def _model(self) -> MaxTextModel:
    """The run config's model with the layout the checkpoint has (layer keys say whether it is scanned), its
    every parameter's shape held against what the config implies."""
    described = describe(self.run)
    scanned = ("decoder", "layers") in {path[:2] for path in self.saved}
    stated = dict(self.run.keys).get("scan_layers")
    recorded = (self.step_metadata.get("custom_metadata") or {}).get("scan_layers")  # checkpointing.py:1334
    for says, what in ((stated, f"{self.run.source} says scan_layers={stated}"),
                       (recorded, f"its {STEP_METADATA} records scan_layers={recorded}")):
      if says is not None and bool(says) != scanned:
        raise MaxTextError(f"{self.path} holds {'scanned' if scanned else 'unscanned'} layers, but {what}: is this "
                           "the run config of this checkpoint?")
    model = dataclasses.replace(described, scan_layers=scanned)
    expected = expected_shapes(model)
    problems = [f"missing {'/'.join(p)}" for p in sorted(expected.keys() - self.saved.keys())]
    problems += [f"unexpected {'/'.join(p)}" for p in sorted(self.saved.keys() - expected.keys())]
    problems += [f"{'/'.join(p)}: checkpoint {list(self.saved[p].shape)}, run config implies {list(expected[p])}"
                 for p in sorted(expected.keys() & self.saved.keys()) if tuple(self.saved[p].shape) != expected[p]]
    if problems:
      shown = "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else "")
      raise MaxTextError(f"{self.path} does not hold the {model.model_name} its run config ({self.run.source}) "
                         f"describes:\n  {shown}")
    return model

  @property
  def config(self) -> ModelConfig:
    return self.model.config

  @property
  def max_positions(self) -> int:
    """The positions the run trained on: its max_target_length (`configs/base.yml`)."""
    return int(self.run.get("max_target_length"))

  def load_params(self, mesh: Mesh | None = None, dtype=None, verify: bool = True) -> Params:
    """`load`'s parameters (the reader's common call, `s2sjax.scoring.checkpoints.checkpoint.open`); MaxText wrote no checksums
    to `verify` against, so what is read is held to its shard indexes and to finite values whatever `verify`."""
    del verify
    return self.load(mesh, dtype).params

  def verify_stored(self) -> None:
    """Every parameter's stored shards there and whole, read from their indexes alone (TensorStore's zarr3 sharding
    keeps a crc32c of each index at the end of its shard file, so a cut, rewritten or missing file fails here): a
    MaxTextError naming the parameter and the file, before orbax reads any data."""
    for path, saved in self.saved.items():
      _verify_shards(self.path / ITEMS, "/".join(PARAMS + path), saved.shape)

  def load(self, mesh: Mesh | None = None, dtype=None) -> Loaded:
    """The parameters on `mesh` (default: every device, data-parallel), sharded as the decoder's are, without the
    whole tree passing through one host; optionally cast to `dtype`. Stored shards are checked first
    (`verify_stored`) and every value read is held to be finite (MaxText's zstd chunks carry no checksum, so
    damaged data can decode): a MaxTextError names the first parameter that is not."""
    mesh = mesh or sharding.make_mesh()
    config = self.model.config
    self.verify_stored()
    tree = self.restore_tree(mesh)
    flat = _flat(tree)
    finite = jax.jit(lambda leaves: [jnp.isfinite(leaf).all() for leaf in leaves])(list(flat.values()))
    for path, ok in zip(flat, finite):
      if not bool(ok):
        raise MaxTextError(f"{self.path}: parameter {'/'.join(path)} holds non-finite values (NaN or inf): the "
                           f"checkpoint is damaged or its training diverged; restore the step or score another")
    found = checksums.device_checksums(list(flat.values()), [False] * len(flat))
    sums = {"/".join(path): value[0] for path, value in zip(flat, found)}
    adapt = jax.jit(functools.partial(to_decoder_params, self.model),
                    out_shardings=sharding.logical_to_sharding(param_logical_axes(config), abstract_params(config),
                                                               mesh))
    params = adapt(tree)
    if dtype is not None:
      params = jax.jit(lambda t: jax.tree.map(lambda x: x.astype(dtype), t),
                       out_shardings=jax.tree.map(lambda x: x.sharding, params))(params)
    logging.info("%s: %d MaxText leaves restored and checksummed", self.path, len(sums))
    return Loaded(config, params, sums)

  def restore_tree(self, mesh: Mesh) -> dict:
    """MaxText's parameter tree as saved (its `params` collection), restored onto `mesh`: each leaf sharded as the
    decoder leaf it becomes, its axes in MaxText's order. Optimizer state, step and rng state are not read."""
    from orbax.checkpoint.experimental import v1 as ocp

    targets = _flat(sharding.logical_to_sharding(param_logical_axes(self.model.config),
                                                 abstract_params(self.model.config), mesh))
    restore: dict = {}
    for leaf in leaves(self.model):
      spec = tuple(targets[leaf.target].spec)  # one entry per dim (sharding.fit_spec)
      if leaf.per_layer:
        spec = _scanned_axes(self.model, spec) if self.model.scan_layers else spec[1:]
      for path in source_paths(self.model, leaf):
        saved = self.saved[path]
        _put(restore, path, jax.ShapeDtypeStruct(saved.shape, saved.dtype,
                                                 sharding=NamedSharding(mesh, PartitionSpec(*spec))))
    context = ocp.Context()
    context.pytree.loading.partial_load = True

    def read() -> dict:
      with context:  # entered in the worker thread that reads: the options are the reading thread's
        return ocp.load(self.path, {"params": {"params": restore}}, checkpointable_name=ITEMS)

    try:
      restored = cli.in_worker(read)  # in a worker, as `_saved_params` reads
    except Exception as e:  # what unreadable (truncated, corrupted) files raise, of many types
      raise MaxTextError(f"{self.path}/{ITEMS} cannot be read ({type(e).__name__}: {_first_line(e)})") from e
    return restored["params"]["params"]

  def files(self) -> dict[str, int]:
    """{relative path: bytes} of every file of the folder."""
    return {name: path.stat().length for name, path in _files(self.path)}

  def content_id(self) -> str:
    """What the folder holds, as a short hash (module docstring): another write at the same path gets another."""
    digest = hashlib.sha256(json.dumps(model_keys(self.run), sort_keys=True, default=str).encode())
    digest.update((self.path / STEP_METADATA).read_bytes())
    digest.update(json.dumps(self.files(), sort_keys=True).encode())
    return digest.hexdigest()[:16]

  def manifest(self) -> dict:
    """The folder's record, in the keys of a converted checkpoint's manifest: its source and layout."""
    kind = "training state" if "opt_state" in self.top_level else "params only"
    return {"source": str(self.path), "source_description": f"MaxText {self.model.model_name} checkpoint ({kind})",
            "source_model_type": f"maxtext:{self.model.model_name}", "source_config": None,
            "maxtext_run_config": self.run.source, "scan_layers": self.model.scan_layers,
            "files": self.files(), "trust_remote_code": False}

  def tokenizer_dir(self) -> str | None:
    """The run's tokenizer when its `tokenizer_path` is a folder here holding a transformers tokenizer."""
    path = str(self.run.get("tokenizer_path") or "")
    return path if path and epath.Path(path).is_dir() else None

  def load_tokenizer(self, trust_remote_code: bool = False):
    return self._read_tokenizer(text_tokenizer.load, trust_remote_code)

  def tokenizer_identity(self, trust_remote_code: bool = False) -> dict | None:
    return self._read_tokenizer(text_tokenizer.folder_identity, trust_remote_code)

  def _read_tokenizer(self, read, trust_remote_code: bool):
    folder = self.tokenizer_dir()
    return None if folder is None else read(folder, trust_remote_code, f"{self.path}'s tokenizer_path")


def _flat(tree: Mapping[str, Any], prefix: Path = ()) -> dict[Path, Any]:
  out = {}
  for key in sorted(tree):
    value = tree[key]
    out.update(_flat(value, prefix + (key,)) if isinstance(value, Mapping) else {prefix + (key,): value})
  return out


def _get(tree: Mapping[str, Any], path: Path) -> Any:
  node = tree
  for depth, key in enumerate(path):
    if not isinstance(node, Mapping) or key not in node:
      raise MaxTextError(f"the MaxText parameter tree has no {'/'.join(path[: depth + 1])} (a {'/'.join(path)} was "
                         "expected: is it the tree of the model the run config names?)")
    node = node[key]
  return node


def _put(tree: dict, path: Path, value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _files(root: epath.Path, prefix: str = "") -> list[tuple[str, epath.Path]]:
  found = []
  for path in sorted(root.iterdir()):
    name = f"{prefix}{path.name}"
    found += _files(path, name + "/") if path.is_dir() else [(name, path)]
  return found


def _check_index(items: epath.Path) -> None:
  """The PyTree's _METADATA parses and its OCDBT B-tree (when there is one) lists: a damaged one is named here, in
  one line, where orbax's own read returns no tree and prints its tasks' failures."""
  import tensorstore

  try:
    json.loads((items / ORBAX_METADATA).read_text())
  except FileNotFoundError:
    return  # not an orbax PyTree of this layout: orbax's read names what it is
  except (OSError, ValueError) as e:
    raise MaxTextError(f"{items}/{ORBAX_METADATA} cannot be read ({_first_line(e)}): the folder is damaged; restore "
                       "the step") from None
  if (items / "manifest.ocdbt").exists():
    try:
      tensorstore.KvStore.open({"driver": "ocdbt", "base": f"{_kvstore_url(items)}/"}).result().list().result()
    except ValueError as e:
      raise MaxTextError(f"{items}: its OCDBT index (manifest.ocdbt and the B-tree under d/) cannot be read "
                         f"({_first_line(e)}): the folder is damaged; restore the step") from None


def _verify_shards(items: epath.Path, name: str, shape: tuple[int, ...]) -> None:
  """One array's shard files (zarr3 `sharding_indexed`, as orbax writes MaxText's arrays, OCDBT or not) all there
  with an index that reads and lists every inner chunk: a MaxTextError naming the parameter and the file."""
  import itertools

  import tensorstore

  ocdbt = (items / "manifest.ocdbt").exists()
  array = name.replace("/", ".")
  base = ({"driver": "ocdbt", "base": f"{_kvstore_url(items)}/", "path": f"{array}/"} if ocdbt else
          {"driver": "file", "path": f"{items}/{array}/"})
  where = lambda key: (f"{items}/{_ocdbt_file(items, f'{array}/{key}')} (its {array}/{key})" if ocdbt
                       else f"{items}/{array}/{key}")
  parameter = "/".join(name.split("/")[len(PARAMS):])
  try:
    metadata = tensorstore.open({"driver": "zarr3", "kvstore": base}, open=True).result().spec().to_json()["metadata"]
  except ValueError as e:
    raise MaxTextError(f"parameter {parameter}: {where('zarr.json')} cannot be read ({_first_line(e)}): the "
                       "checkpoint is damaged; restore the step") from None
  outer = metadata["chunk_grid"]["configuration"]["chunk_shape"]
  codec = metadata["codecs"][0]
  if codec["name"] != "sharding_indexed":  # unsharded chunks have no index to read: orbax checks them as it reads
    return
  inner = codec["configuration"]["chunk_shape"]
  separator = metadata["chunk_key_encoding"].get("configuration", {}).get("separator", "/")
  for index in itertools.product(*(range(-(-size // chunk)) for size, chunk in zip(shape, outer))):
    key = separator.join(["c", *map(str, index)]) if shape else "c"
    grid = [chunk // part for chunk, part in zip(outer, inner)]
    spec = {"driver": "zarr3_sharding_indexed", "base": dict(base, path=base["path"] + key), "grid_shape": grid,
            "index_codecs": codec["configuration"]["index_codecs"],
            "index_location": codec["configuration"].get("index_location", "end")}
    try:
      listed = tensorstore.KvStore.open(spec).result().list().result()
    except ValueError as e:
      raise MaxTextError(f"parameter {parameter}: {where(key)} is damaged ({_first_line(e)}): restore the "
                         "step") from None
    if not listed:
      raise MaxTextError(f"parameter {parameter}: {where(key)} is missing: restore the step")


def _ocdbt_file(items: epath.Path, key: str) -> str:
  """The data file an OCDBT database keeps `key`'s value in (`ocdbt.process_<i>/d/<id>`, read from its B-tree:
  `tensorstore.ocdbt.dump`), or its d/ folders when the tree itself cannot be read."""
  import tensorstore
  import tensorstore.ocdbt

  try:
    base = tensorstore.KvStore.open(f"{_kvstore_url(items)}/").result()
    nodes = [tensorstore.ocdbt.dump(base).result()["versions"][-1]["root"]["location"]]
    while nodes:
      for entry in tensorstore.ocdbt.dump(base, nodes.pop()).result()["entries"]:
        for field, value in entry.items():
          if isinstance(value, str) and value.startswith("btreenode::"):  # an interior node's child
            nodes.append(value)
          elif field == "indirect_value" and entry["key"] == key.encode():  # value:<prefix>:<file>:<offset>:<length>
            _, prefix, file, *_ = value.split(":")
            return prefix + file
  except (ValueError, KeyError, IndexError):
    pass
  return "d/ or ocdbt.process_*/d/"


def _kvstore_url(path: epath.Path) -> str:
  """A TensorStore kvstore URL of a folder: a bucket's as it is, a local one as an absolute file:// URL."""
  text = str(path)
  return text if "://" in text else f"file://{os.path.abspath(text)}"


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [""])[0][:300]
