"""levanter checkpoints read from their TensorStore layout (s2sjax/scoring/checkpoints/stacks/levanter.py). Untested against
levanter-written files (levanter does not install here): the checkpoints below are written by the call levanter
makes, jax's `GlobalAsyncCheckpointManager.serialize_with_paths` (levanter tensorstore_serialization.py:84), at
the paths its key-path rule gives, with the arrays levanter's state-dict rule makes of a transformers model (a
Linear's HF `[out, in]` weight is its haliax weight, out axes then in axes, flattened: haliax nn/linear.py); the
decoder they are read into is held to the project's converter of that transformers model, itself held to
transformers' forward."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from checkpoints_conversion.convert import convert
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.runtime import sharding
from s2sjax.scoring.checkpoints.stacks import levanter
from tests.hf_models import save_hf, state_numpy, tiny_model


def levanter_arrays(state: dict[str, np.ndarray], hf: dict, stacked: bool) -> dict[str, np.ndarray]:
  """{levanter key path: array} of a transformers Llama / Qwen2 state dict."""
  heads, kv, layers = hf["num_attention_heads"], hf["num_key_value_heads"], hf["num_hidden_layers"]
  head_dim = hf["hidden_size"] // heads
  shapes = {"q_proj.weight": (kv, heads // kv, head_dim, -1), "q_proj.bias": (kv, heads // kv, head_dim),
            "k_proj.weight": (kv, head_dim, -1), "v_proj.weight": (kv, head_dim, -1), "k_proj.bias": (kv, head_dim),
            "v_proj.bias": (kv, head_dim), "o_proj.weight": (-1, heads, head_dim)}
  per_layer: dict[str, list] = {}
  out = {"embeddings/token_embeddings/weight": state["model.embed_tokens.weight"],
         "transformer/norm/weight": state["model.norm.weight"]}
  if "lm_head.weight" in state and not hf.get("tie_word_embeddings"):
    out["lm_head/weight"] = state["lm_head.weight"]
  for i in range(layers):
    for key, value in state.items():
      prefix = f"model.layers.{i}."
      if not key.startswith(prefix):
        continue
      name = key[len(prefix):]
      value = value.reshape(shapes[name.split(".", 1)[1]]) if name.startswith("self_attn.") else value
      per_layer.setdefault(name.replace(".", "/"), []).append(value)
  for name, values in per_layer.items():
    if stacked:
      out[f"transformer/layers/stacked/{name}"] = np.stack(values)
    else:
      out.update({f"transformer/layers/blocks/{i}/{name}": value for i, value in enumerate(values)})
  return out


def write_levanter_checkpoint(step_dir: str, arrays: dict[str, np.ndarray]) -> None:
  """A levanter step folder: the model's leaves under model/ by levanter's call, then metadata.json (written by
  levanter once the leaves are committed, checkpoint.py:380-399)."""
  import jax
  from jax.experimental.array_serialization import serialization

  manager = serialization.GlobalAsyncCheckpointManager()
  names = sorted(arrays)
  manager.serialize_with_paths([jax.numpy.asarray(arrays[n]) for n in names],
                               [os.path.join(step_dir, "model", *n.split("/")) for n in names])
  manager.wait_until_finished()
  with open(os.path.join(step_dir, "metadata.json"), "w") as f:
    json.dump({"step": 20, "timestamp": "2025-09-26T12:00:00", "is_temporary": False}, f)


@pytest.mark.parametrize("family,stacked", [("llama", True), ("qwen2", True), ("llama", False)])
def test_a_levanter_checkpoint_reads_as_the_transformers_model_it_came_from(tmp_path, family, stacked):
  model = tiny_model(family)
  hf_dir = save_hf(model, str(tmp_path / "hf"))
  hf = model.config.to_dict()
  step = tmp_path / "checkpoints" / "step-20"
  write_levanter_checkpoint(str(step), levanter_arrays(state_numpy(model), hf, stacked))
  assert levanter.is_step_folder(step)
  config = levanter.decoder_config(os.path.join(hf_dir, "config.json"))
  ours = levanter.load(step, config, sharding.make_mesh("data:2,fsdp:2,model:2"))
  convert(hf_dir, str(tmp_path / "converted"))
  assert checkpoint.load_config(str(tmp_path / "converted")) == config
  expected = checkpoint.load_params(str(tmp_path / "converted"))
  for (path, a), (_, b) in zip(checkpoint.flatten(ours), checkpoint.flatten(expected), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg="/".join(path))


def test_a_model_that_does_not_fit_its_config_names_its_leaves(tmp_path):
  model = tiny_model("llama")
  hf = model.config.to_dict()
  arrays = levanter_arrays(state_numpy(model), hf, stacked=True)
  del arrays["transformer/layers/stacked/mlp/up_proj/weight"]
  config = levanter.decoder_config(dict(hf, intermediate_size=hf["intermediate_size"] * 2))
  with pytest.raises(levanter.LevanterError, match="missing transformer/layers/stacked/mlp/up_proj/weight.*\n.*"
                                                   "mlp/down_proj/weight"):
    levanter.to_decoder_params(config, _nested(arrays))


def _nested(flat: dict[str, np.ndarray]) -> dict:
  tree: dict = {}
  for key, value in flat.items():
    node = tree
    parts = key.split("/")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = value
  return tree
