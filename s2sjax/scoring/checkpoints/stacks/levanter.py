"""levanter's Llama and Qwen2 parameters on this project's decoder: the map from levanter's model tree (live, as
`StepInfo.eval_model` holds it, or as its checkpoints store it) onto `s2sjax.model.decoder`'s, and a reader of its
checkpoint folders. Untested against levanter-written files: levanter does not install here (its PyPI release
pins pydantic<2 and fsspec 2023); the tests write checkpoints with the call levanter makes (below) at the paths its
key-path rule gives.

The layout (stanford-crfm/levanter 9263f81):
- a checkpoint is `step-<N>/` (`checkpoint.py:217`) with `metadata.json` (`:396`) and the TrainerState's leaves,
  the model under `model/` (`load_model` reads that subpath, `checkpoint.py:150-168`); every leaf is a TensorStore
  array written by jax's `GlobalAsyncCheckpointManager.serialize_with_paths` (`tensorstore_serialization.py:84`) at
  its key path, the field names of its modules joined by `/` (`tensorstore_serialization.py:91`,
  `utils/jax_utils.py:150`);
- `LlamaLMHeadModel` / `QwenLMHeadModel` (`models/llama.py:478`, `models/qwen.py:224`): `embeddings/token_embeddings/
  weight [vocab, embed]`, `transformer/norm/weight`, `lm_head/weight [vocab, embed]` (absent when tied), and the
  layers under `transformer/layers/stacked/` (haliax `Stacked`: every leaf with a leading layer axis) or
  `transformer/layers/blocks/<i>/` (`BlockSeq`, `scan_layers: false`, `models/llama.py:380-384`);
- a layer (`models/llama.py:283`, `models/qwen.py:142`): `input_layernorm/weight`, `post_attention_layernorm/weight`,
  `self_attn/{q,k,v,o}_proj`, `mlp/{gate,up,down}_proj`; every haliax Linear weight is its output axes then its
  input axes (`out_first=True`: haliax `nn/linear.py`), so q_proj is `[kv_heads, q_heads_per_group, head_size,
  embed]` (`layers/attention.py:1473`), k/v_proj `[kv_heads, head_size, embed]`, o_proj `[embed, heads,
  head_size]`, gate/up `[mlp, embed]`, down `[embed, mlp]`; Qwen2's q/k/v carry biases, o_proj none
  (`models/qwen.py:132-133`);
- rope rotates halves (`layers/rotary.py:17,45`), Llama 3's frequency scaling included (`:97,140`): the decoder's.

The model's hyper-parameters are its transformers config.json (levanter's configs map to it one to one:
`LlamaConfig.to_hf_config`, `models/llama.py:140`), read by this project's families.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from s2sjax.model import families
from s2sjax.runtime import sharding
from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ModelConfig
from s2sjax.model.decoder import Params, abstract_params, param_logical_axes

STEP_METADATA = "metadata.json"  # checkpoint.py:396
MODEL = "model"  # the TrainerState field the model is saved under
STACKED = ("transformer", "layers", "stacked")
BLOCKS = ("transformer", "layers", "blocks")


class LevanterError(UserError, ValueError):
  """A levanter model tree or checkpoint folder that is not the model its config describes."""


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One decoder leaf, the levanter leaf it comes from (per layer: within the layer) and how: `shape` is levanter's
  (without a layer axis), `to_decoder` turns levanter's axes (a leading layer axis kept) into the decoder's, and
  `axes[i]` is the decoder axis (of the leaf without its layer axis) levanter's axis i becomes, None for one folded
  into its neighbour."""

  target: tuple[str, ...]
  source: tuple[str, ...]
  shape: Callable[[ModelConfig], tuple[int, ...]]
  to_decoder: Callable[[jax.Array, ModelConfig], jax.Array]
  axes: tuple[int | None, ...]
  per_layer: bool = True


def _q_kernel(w, c):  # [kv, group, head, embed] -> [embed, kv * group, head]
  return jnp.moveaxis(w, -1, -4).reshape(w.shape[:-4] + (c.hidden_size, c.num_heads, c.head_dim))


def _q_bias(w, c):  # [kv, group, head] -> [kv * group, head]
  return w.reshape(w.shape[:-3] + (c.num_heads, c.head_dim))


def _same(w, c):
  return w


def _out_last(w, c):  # [out..., embed] -> [embed, out...]: k and v
  return jnp.moveaxis(w, -1, -3)


def _transposed(w, c):
  return jnp.swapaxes(w, -1, -2)


def _group(c: ModelConfig) -> int:
  return c.num_heads // c.num_kv_heads


_LEAVES = (
  Leaf(("embed", "embedding"), ("embeddings", "token_embeddings", "weight"), lambda c: (c.vocab_size, c.hidden_size),
       _same, (0, 1), per_layer=False),
  Leaf(("final_norm", "scale"), ("transformer", "norm", "weight"), lambda c: (c.hidden_size,), _same, (0,),
       per_layer=False),
  Leaf(("layers", "attn_norm", "scale"), ("input_layernorm", "weight"), lambda c: (c.hidden_size,), _same, (0,)),
  Leaf(("layers", "mlp_norm", "scale"), ("post_attention_layernorm", "weight"), lambda c: (c.hidden_size,), _same,
       (0,)),
  Leaf(("layers", "attn", "q", "kernel"), ("self_attn", "q_proj", "weight"),
       lambda c: (c.num_kv_heads, _group(c), c.head_dim, c.hidden_size), _q_kernel, (1, None, 2, 0)),
  Leaf(("layers", "attn", "k", "kernel"), ("self_attn", "k_proj", "weight"),
       lambda c: (c.num_kv_heads, c.head_dim, c.hidden_size), _out_last, (1, 2, 0)),
  Leaf(("layers", "attn", "v", "kernel"), ("self_attn", "v_proj", "weight"),
       lambda c: (c.num_kv_heads, c.head_dim, c.hidden_size), _out_last, (1, 2, 0)),
  Leaf(("layers", "attn", "o", "kernel"), ("self_attn", "o_proj", "weight"),
       lambda c: (c.hidden_size, c.num_heads, c.head_dim), lambda w, c: jnp.moveaxis(w, -3, -1), (2, 0, 1)),
  Leaf(("layers", "mlp", "gate", "kernel"), ("mlp", "gate_proj", "weight"),
       lambda c: (c.intermediate_size, c.hidden_size), _transposed, (1, 0)),
  Leaf(("layers", "mlp", "up", "kernel"), ("mlp", "up_proj", "weight"),
       lambda c: (c.intermediate_size, c.hidden_size), _transposed, (1, 0)),
  Leaf(("layers", "mlp", "down", "kernel"), ("mlp", "down_proj", "weight"),
       lambda c: (c.hidden_size, c.intermediate_size), _transposed, (1, 0)),
)
_BIASES = (
  Leaf(("layers", "attn", "q", "bias"), ("self_attn", "q_proj", "bias"),
       lambda c: (c.num_kv_heads, _group(c), c.head_dim), _q_bias, (0, None, 1)),
  Leaf(("layers", "attn", "k", "bias"), ("self_attn", "k_proj", "bias"), lambda c: (c.num_kv_heads, c.head_dim),
       _same, (0, 1)),
  Leaf(("layers", "attn", "v", "bias"), ("self_attn", "v_proj", "bias"), lambda c: (c.num_kv_heads, c.head_dim),
       _same, (0, 1)),
)
_HEAD = Leaf(("lm_head", "kernel"), ("lm_head", "weight"), lambda c: (c.vocab_size, c.hidden_size), _transposed,
             (1, 0), per_layer=False)


def decoder_config(hf_config: Mapping[str, Any] | str) -> ModelConfig:
  """The decoder config of a levanter Llama or Qwen2 model from its transformers config.json (a dict or a path)."""
  if not isinstance(hf_config, Mapping):
    hf_config = json.loads(epath.Path(hf_config).read_text())
  config = families.from_hf_config(hf_config)
  if config.family not in ("llama", "qwen2") or config.o_bias or config.mlp_bias:
    raise LevanterError(f"levanter's {config.family} model with o/mlp biases={config.o_bias}/{config.mlp_bias} is not "
                        "read here: Llama and Qwen2 (biases on q, k, v only)")
  return config


def leaves(config: ModelConfig) -> list[Leaf]:
  return list(_LEAVES) + (list(_BIASES) if config.qkv_bias else []) + ([] if config.tie_embeddings else [_HEAD])


def _placed(config: ModelConfig, stacked: bool) -> list[tuple[tuple[str, ...], tuple[int, ...], Leaf]]:
  """(levanter key path, shape, leaf) of every model leaf: layers `Stacked`, or `BlockSeq` when not `stacked`."""
  placed = []
  for leaf in leaves(config):
    shape = leaf.shape(config)
    if not leaf.per_layer:
      placed.append((leaf.source, shape, leaf))
    elif stacked:
      placed.append((STACKED + leaf.source, (config.num_layers,) + shape, leaf))
    else:
      placed += [(BLOCKS + (str(i),) + leaf.source, shape, leaf) for i in range(config.num_layers)]
  return placed


def expected_shapes(config: ModelConfig, stacked: bool) -> dict[tuple[str, ...], tuple[int, ...]]:
  """{levanter key path: shape} of every model leaf."""
  return {path: shape for path, shape, _ in _placed(config, stacked)}


def flat_tree(tree: Any) -> dict[tuple[str, ...], Any]:
  """{key path: array} of a levanter model (an equinox module of haliax NamedArrays, or nested dicts alike): field
  names, dict keys and list indices, as levanter's `leaf_key_paths` names them; a NamedArray's array is its leaf."""
  def name(key) -> str:
    for attribute in ("name", "key", "idx"):
      if hasattr(key, attribute):
        return str(getattr(key, attribute))
    return str(key)

  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names = tuple(name(key) for key in path)
    out[names[:-1] if names and names[-1] == "array" else names] = leaf
  return out


def to_decoder_params(config: ModelConfig, tree: Any) -> Params:
  """levanter's model tree (module docstring) as the decoder's parameters: pure jnp, jit-friendly. A `model/`
  level (a saved TrainerState's) is stepped into."""
  flat = flat_tree(tree)
  if not any(path[0] == "embeddings" for path in flat) and any(path[0] == MODEL for path in flat):
    flat = {path[1:]: value for path, value in flat.items() if path[0] == MODEL}
  stacked = any(path[:3] == STACKED for path in flat)
  expected = expected_shapes(config, stacked)
  problems = [f"missing {'/'.join(p)}" for p in sorted(expected.keys() - flat.keys())]
  problems += [f"{'/'.join(p)}: {list(jnp.shape(flat[p]))}, config implies {list(s)}"
               for p, s in sorted(expected.items()) if p in flat and tuple(jnp.shape(flat[p])) != s]
  if problems:
    raise LevanterError("the levanter model does not fit its config:\n  " + "\n  ".join(problems[:20]))
  out: dict = {}
  for leaf in leaves(config):
    if not leaf.per_layer:
      value = flat[leaf.source]
    elif stacked:
      value = flat[STACKED + leaf.source]
    else:
      value = jnp.stack([flat[BLOCKS + (str(i),) + leaf.source] for i in range(config.num_layers)])
    node = out
    for key in leaf.target[:-1]:
      node = node.setdefault(key, {})
    node[leaf.target[-1]] = leaf.to_decoder(value, config)
  return out


def params_adapter(config: ModelConfig) -> Callable[[Any], Params]:
  """For the Evaluator (or `levanter_hook.s2sbench_hook`'s `params_of`): levanter's live model as the decoder's
  parameters, in one compiled program on the devices that hold it."""
  return jax.jit(lambda tree: to_decoder_params(config, tree))


def is_step_folder(path: str | epath.Path) -> bool:
  path = epath.Path(path)
  return (path / STEP_METADATA).exists() and (path / MODEL).is_dir()


def load(step_dir: str | epath.Path, config: ModelConfig, mesh: Mesh | None = None) -> Params:
  """A levanter checkpoint's model (`step-N/model/...`) on `mesh`, each leaf read by jax's TensorStore
  deserializer (levanter's own call) onto the sharding of the decoder leaf it becomes, then mapped on the devices."""
  from jax.experimental.array_serialization import serialization

  step_dir = epath.Path(step_dir)
  if not is_step_folder(step_dir):
    raise LevanterError(f"{step_dir} is not a levanter checkpoint (no {STEP_METADATA} beside {MODEL}/): levanter "
                        "writes metadata.json once every leaf is committed")
  mesh = mesh or sharding.make_mesh()
  targets = sharding.logical_to_sharding(param_logical_axes(config), abstract_params(config), mesh)
  stacked = (step_dir / MODEL / "/".join(STACKED)).exists()
  specs = dict(_flat_specs(targets))
  paths, shardings, keys = [], [], []
  for path, shape, leaf in _placed(config, stacked):
    target = specs[leaf.target]
    within = target[1:] if leaf.per_layer else target
    spec = [within[axis] if axis is not None else None for axis in leaf.axes]
    if leaf.per_layer and stacked:
      spec = [target[0]] + spec
    paths.append(str(step_dir / MODEL / "/".join(path)))
    shardings.append(NamedSharding(mesh, sharding.fit_spec(PartitionSpec(*spec), shape, mesh)))
    keys.append(path)
  missing = [p for p in paths if not epath.Path(p).exists()]
  if missing:
    raise LevanterError(f"{step_dir}: {len(missing)} model leaves missing, first {missing[0]}")
  arrays = serialization.GlobalAsyncCheckpointManager().deserialize_with_paths(shardings=shardings, paths=paths)
  tree: dict = {}
  for path, array in zip(keys, arrays):
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = array
  return jax.jit(lambda t: to_decoder_params(config, t), out_shardings=targets)(tree)


def _flat_specs(targets) -> list[tuple[tuple[str, ...], tuple]]:
  out = []

  def walk(node, prefix):
    for key, value in node.items():
      if isinstance(value, Mapping):
        walk(value, prefix + (key,))
      else:
        out.append((prefix + (key,), tuple(value.spec)))
  walk(targets, ())
  return out
