"""What a MaxText run config says its model is: the `key=value` overrides a MaxText user passes to `train.py` (or
the `config.yml` MaxText writes beside a run), resolved as MaxText's pyconfig resolves them, and turned into the
project's decoder config plus the conventions MaxText's own forward follows.

Where a value comes from, first match wins (maxtext 0.2.5 `configs/pyconfig.py:488`, `override_model_config`):
the run's own keys, then `configs/models/<model_name>.yml` (`MODELS` below: those files' values, for the models
this reader maps), then `configs/base.yml`'s defaults (`BASE_DEFAULTS`). Only Qwen2.5 (decoder_block `qwen2`) and
Llama 3.x (decoder_block `llama2`) are read; any other model_name, and any switch this decoder does not implement,
is refused by name.

The conventions (held to ../upstream-oracles/maxtext, whose PROVENANCE.txt gives each with its MaxText file:line):
- the query kernel of a `llama2` block carries 1/sqrt(head_dim), folded in at init and never applied at run time
  (`layers/attentions.py:668,672`, qk einsum unscaled `layers/attention_op.py:3122`); Qwen2 scales the query at run
  time (`models/qwen2.py:87`, `layers/attentions.py:1301`), as this decoder does;
- a model_name starting with `llama3.1` (or rope_type `llama3.1`) rotates interleaved pairs with Llama 3.1's
  frequency scaling, hard-coded factor 8, low 1, high 4, context 8192 (`layers/attentions.py:935`,
  `layers/embeddings.py:491,501,574`, `rope_use_scale` `configs/base.yml:1147`); every other model here rotates
  halves (`layers/embeddings.py:258`), llama3-8b and llama3.3-70b included;
- the head is `decoder/logits_dense` unless `logits_via_embedding`, where MaxText reads the embedding table cast to
  bfloat16 (`layers/embeddings.py:201`), divided by sqrt(emb) when `normalize_embedding_logits`
  (`layers/nnx_decoders.py:1611`);
- with `scan_layers`, every per-layer weight (norm scales and biases too) carries the layer axis at
  `param_scan_axis` (default 1: `configs/base.yml:482`, `layers/nnx_decoders.py:374,396`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from typing import Any, Mapping

import yaml
from etils import epath

from s2sjax.runtime.errors import UserError
from s2sjax.model.config import ModelConfig

RUN_CONFIG_FILE = "config.yml"  # what MaxText's save_config_to_gcs writes at <base_output_directory>/<run_name>/
FLAG = "--maxtext_config"
LLAMA31_ROPE_SCALING = (8.0, 1.0, 4.0, 8192.0)  # layers/embeddings.py:501: factor, low, high, original context

# configs/base.yml's defaults of every key this reader looks at (AI-Hypercomputer/maxtext e591f30 base.yml).
BASE_DEFAULTS: dict[str, Any] = {
  "model_name": "default", "decoder_block": "llama2", "global_parameter_scale": 1,
  "base_emb_dim": 2048, "base_num_query_heads": 16, "base_num_kv_heads": 16, "base_mlp_dim": 7168,
  "base_num_decoder_layers": 16, "head_dim": 128, "vocab_size": 32000, "normalization_layer_epsilon": 1e-5,
  "mlp_activations": ["silu", "linear"], "logits_via_embedding": False, "normalize_embedding_logits": True,
  "scan_layers": True, "param_scan_axis": 1, "attention_bias": False, "use_qk_norm": False, "fused_qkv": False,
  "fused_mlp": False, "attn_logits_soft_cap": 0.0, "final_logits_soft_cap": 0.0, "use_post_attn_norm": False,
  "use_post_ffw_norm": False, "quantization": "", "rope_type": "default", "rope_linear_scaling_factor": 1.0,
  "rope_use_scale": True, "rope_min_timescale": 1, "rope_max_timescale": 10000, "tokenizer_path": "",
  "tokenizer_type": "sentencepiece", "max_target_length": 2048,
}


def _model(emb, heads, kv, mlp, layers, vocab, block, eps, theta, **switches) -> dict[str, Any]:
  return dict(base_emb_dim=emb, base_num_query_heads=heads, base_num_kv_heads=kv, base_mlp_dim=mlp,
              base_num_decoder_layers=layers, head_dim=128, vocab_size=vocab, decoder_block=block,
              normalization_layer_epsilon=eps, rope_max_timescale=theta, **switches)


_QWEN = dict(attention_bias=True, normalize_embedding_logits=False, tokenizer_type="huggingface")
# configs/models/<model_name>.yml (e591f30) of the models read here; mlp_activations are silu, linear in each.
MODELS: dict[str, dict[str, Any]] = {
  "qwen2.5-1.5b": _model(1536, 12, 2, 8960, 28, 151936, "qwen2", 1e-6, 1e6, logits_via_embedding=True, **_QWEN),
  "qwen2.5-7b": _model(3584, 28, 4, 18944, 28, 152064, "qwen2", 1e-6, 1e6, logits_via_embedding=False, **_QWEN),
  "qwen2.5-14b": _model(5120, 40, 8, 13824, 48, 152064, "qwen2", 1e-6, 1e6, logits_via_embedding=False, **_QWEN),
  **{name: _model(emb, heads, 8, mlp, layers, 128256, "llama2", 1e-5, 500000, logits_via_embedding=False)
     for name, (emb, heads, mlp, layers) in {
       "llama3-8b": (4096, 32, 14336, 32), "llama3-70b": (8192, 64, 28672, 80),
       "llama3-405b": (16384, 128, 53248, 126), "llama3.1-8b": (4096, 32, 14336, 32),
       "llama3.1-70b": (8192, 64, 28672, 80), "llama3.1-405b": (16384, 128, 53248, 126),
       "llama3.3-70b": (8192, 64, 28672, 80)}.items()},
}
BLOCK_FAMILIES = {"qwen2": "qwen2", "llama2": "llama"}  # decoder_block -> this project's family

# Switches MaxText has and this decoder does not: the value each must keep (its base.yml default).
UNSUPPORTED = ("global_parameter_scale", "use_qk_norm", "fused_qkv", "fused_mlp", "attn_logits_soft_cap",
               "final_logits_soft_cap", "use_post_attn_norm", "use_post_ffw_norm", "quantization",
               "rope_linear_scaling_factor", "rope_min_timescale")


class MaxTextConfigError(UserError, ValueError):
  """A MaxText run config that is missing, unreadable, or names a model this reader does not map."""


def _coerce(key: str, value: Any, where: str) -> Any:
  """A value as MaxText's typed config holds it: the type of its base.yml default (yaml reads `1e-6` as text)."""
  default = BASE_DEFAULTS.get(key)
  try:
    if isinstance(default, bool):
      if isinstance(value, str):
        if value.lower() not in ("true", "false"):
          raise ValueError(value)
        return value.lower() == "true"
      return bool(value)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
      number = float(str(value).replace("_", ""))
      return int(number) if isinstance(default, int) and number.is_integer() else number
  except ValueError:
    raise MaxTextConfigError(f"{where}: {key}={value!r} is not a {type(default).__name__}") from None
  return value


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The keys a MaxText run was configured with (overrides and saved config alike), and where they were read."""

  keys: tuple[tuple[str, Any], ...]
  source: str

  @classmethod
  def parse(cls, text: str, source: str = FLAG) -> "RunConfig":
    """From a MaxText command line's arguments: `key=value` overrides, and the config yml it names (train.py and
    MaxText's base.yml are skipped: BASE_DEFAULTS stand for it; a yml of the user's is read). A single path to a
    config.yml reads that file."""
    text = text.strip()
    if text.endswith((".yml", ".yaml")) and "=" not in text:
      return cls.from_yaml(text)
    keys: dict[str, Any] = {}
    for token in shlex.split(text):
      if "=" not in token:
        if os.path.basename(token) in ("base.yml", "train.py"):  # MODELS and BASE_DEFAULTS stand for base.yml
          continue
        if not (token.endswith((".yml", ".yaml")) and os.path.exists(token)):
          raise MaxTextConfigError(f"{source}: {token!r} is neither key=value nor a config .yml found here")
        keys.update(dict(cls.from_yaml(token).keys))
        continue
      key, _, value = token.partition("=")
      keys[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    if not keys:
      raise MaxTextConfigError(f"{source} is empty: give the run's key=value overrides (model_name=... and the "
                               "base_* sizes it was trained with) or the path of its config.yml")
    return cls(tuple((key, _coerce(key, value, source)) for key, value in keys.items()), source)

  @classmethod
  def from_yaml(cls, path: str | os.PathLike) -> "RunConfig":
    """From a config.yml: MaxText's saved raw keys, or a model/run yml of the user's."""
    path = epath.Path(path)
    try:
      loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
      raise MaxTextConfigError(f"{path}: cannot be read as a MaxText config ({type(e).__name__}: {e})") from None
    if not isinstance(loaded, dict):
      raise MaxTextConfigError(f"{path}: holds a YAML {type(loaded).__name__}, not a MaxText config's keys")
    return cls(tuple((str(k), _coerce(str(k), v, str(path))) for k, v in loaded.items()), str(path))

  def get(self, key: str) -> Any:
    """The value MaxText's pyconfig gives `key`: the run's own, else its model yml's, else base.yml's."""
    own = dict(self.keys)
    if key in own:
      return own[key]
    model = MODELS.get(self.model_name, {})
    return model[key] if key in model else BASE_DEFAULTS[key]

  @property
  def model_name(self) -> str:
    name = str(dict(self.keys).get("model_name", "default"))
    return name.replace("-Instruct", "")  # configs/pyconfig.py:460: an instruct model reads its base model's yml


@dataclasses.dataclass(frozen=True)
class MaxTextModel:
  """The model a run config describes, as this project's decoder config plus MaxText's own conventions (the
  module docstring): how the checkpoint's tree maps onto the decoder's."""

  model_name: str
  config: ModelConfig
  scan_layers: bool
  scan_axis: int  # where a scanned weight carries its layer axis
  query_scale: float  # the stored query kernel times this is the decoder's (sqrt(head_dim) for llama2 blocks)
  interleaved_rope: bool  # q/k output features rotate in (2i, 2i+1) pairs: permuted to halves for the decoder
  tied_head: bool  # logits from the embedding table (cast to bfloat16), not decoder/logits_dense
  head_divisor: float  # tied head: logits divided by this (sqrt(emb) with normalize_embedding_logits), else 1


def describe(run: RunConfig) -> MaxTextModel:
  """The model of a run config; a MaxTextConfigError names a model or a switch this reader does not map."""
  name = run.model_name
  if name not in MODELS:
    raise MaxTextConfigError(
      f"{run.source}: model_name={name!r} is not a MaxText model this reader maps; it reads "
      f"{', '.join(MODELS)} (Qwen2.5 and Llama 3.x, decoder blocks qwen2 and llama2)")
  block = run.get("decoder_block")
  if block not in BLOCK_FAMILIES:
    raise MaxTextConfigError(f"{run.source}: decoder_block={block!r} is not read (only {', '.join(BLOCK_FAMILIES)})")
  changed = [f"{key}={run.get(key)!r}" for key in UNSUPPORTED if run.get(key) != BASE_DEFAULTS[key]]
  if list(run.get("mlp_activations")) != ["silu", "linear"]:
    changed.append(f"mlp_activations={run.get('mlp_activations')!r}")
  if changed:
    raise MaxTextConfigError(f"{run.source}: {', '.join(changed)} is not implemented by this decoder (MaxText's "
                             "default is required)")
  llama31_rope = name.startswith("llama3.1") or str(run.get("rope_type")).startswith("llama3.1")
  if block != "llama2" and llama31_rope:
    raise MaxTextConfigError(f"{run.source}: rope_type llama3.1 on a {block} block is not read")
  if str(run.get("rope_type")) not in ("default", "llama3.1"):
    raise MaxTextConfigError(f"{run.source}: rope_type={run.get('rope_type')!r} is not read (default, llama3.1)")
  head_dim, emb = int(run.get("head_dim")), int(run.get("base_emb_dim"))
  tied = bool(run.get("logits_via_embedding"))
  config = ModelConfig(
    family=BLOCK_FAMILIES[block], vocab_size=int(run.get("vocab_size")), hidden_size=emb,
    intermediate_size=int(run.get("base_mlp_dim")), num_layers=int(run.get("base_num_decoder_layers")),
    num_heads=int(run.get("base_num_query_heads")), num_kv_heads=int(run.get("base_num_kv_heads")),
    head_dim=head_dim, rope_theta=float(run.get("rope_max_timescale")), rotary_dim=head_dim, rope_interleaved=False,
    rms_norm_eps=float(run.get("normalization_layer_epsilon")),
    qkv_bias=block == "qwen2" and bool(run.get("attention_bias")),  # models/qwen2.py:109; llama2 passes none
    o_bias=False, mlp_bias=False,
    tie_embeddings=False,  # a tied MaxText head reads the table in bfloat16: the decoder gets it as its own head
    rope_scaling=LLAMA31_ROPE_SCALING if llama31_rope and run.get("rope_use_scale") else (),
  )
  return MaxTextModel(
    model_name=name, config=config, scan_layers=bool(run.get("scan_layers")), scan_axis=int(run.get("param_scan_axis")),
    query_scale=math.sqrt(head_dim) if block == "llama2" else 1.0, interleaved_rope=llama31_rope, tied_head=tied,
    head_divisor=math.sqrt(emb) if tied and run.get("normalize_embedding_logits") else 1.0,
  )


# ---- Which run config a command reads ------------------------------------------------------------------------------


def define_flag() -> None:
  """--maxtext_config, for a command that reads checkpoints: what `from_flag` reads."""
  from absl import flags

  flags.DEFINE_string("maxtext_config", None, "A MaxText checkpoint's run config: the key=value overrides it was "
                      "trained with (model_name=..., base_* sizes, scan_layers, ...) or the path of its config.yml; "
                      "default: the config.yml MaxText wrote beside its run.")


def saved_beside(step_dir: epath.Path) -> epath.Path | None:
  """MaxText's config.yml of the run a step folder belongs to (<run>/checkpoints/<step>), when it wrote one."""
  if step_dir.parent.name != "checkpoints":
    return None
  path = step_dir.parent.parent / RUN_CONFIG_FILE
  return path if path.exists() else None


def from_flag(text: str | None) -> RunConfig | None:
  """--maxtext_config's run config (the overrides the run was trained with, or a config.yml); None when not given,
  which leaves each folder to the config.yml beside its run."""
  return RunConfig.parse(text) if text else None


def run_config_for(step_dir: epath.Path, given: RunConfig | None = None) -> RunConfig:
  """The run config a step folder is read with: the one given (--maxtext_config), else the config.yml MaxText
  wrote beside its run; neither is a MaxTextConfigError saying how to give one."""
  if given is not None:
    return given
  saved = saved_beside(step_dir)
  if saved is not None:
    return RunConfig.from_yaml(saved)
  raise MaxTextConfigError(
    f"{step_dir} is a MaxText checkpoint and no run config says which model it holds (MaxText writes "
    f"{RUN_CONFIG_FILE} beside a run only with save_config_to_gcs=true): pass the overrides it was trained with, "
    f"e.g. {FLAG}=\"model_name=qwen2.5-7b\" (with any base_* sizes, scan_layers, vocab_size you set), or "
    f"{FLAG}=PATH/config.yml")


def model_keys(run: RunConfig) -> Mapping[str, Any]:
  """The resolved keys that decide the model (its identity in content ids and records)."""
  return {key: run.get(key) for key in sorted(BASE_DEFAULTS)
          if key not in ("tokenizer_path", "tokenizer_type", "max_target_length")}


def disagreements(given: RunConfig, saved: RunConfig) -> list[str]:
  """The model's keys a given run config sets to other values than the one MaxText saved with the run
  (`key=given (saved says ...)`), model_name first: a llama3-8b given for a llama3.1-8b run rotates otherwise
  (module docstring). Keys the given config leaves out are the saved one's to say."""
  ours = dict(model_keys(given), model_name=given.model_name)
  theirs = dict(model_keys(saved), model_name=saved.model_name)
  stated = [key for key in sorted(dict(given.keys), key=lambda key: key != "model_name") if key in ours]
  return [f"{key}={ours[key]!r} ({saved.source} says {theirs[key]!r})" for key in stated if ours[key] != theirs[key]]
