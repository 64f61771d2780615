"""The opt family (TWIST-350M / 1.3B are OPT models) computes what transformers' OPTForCausalLM computes: pre- and
post-norm residuals, learned positions at position + 2 (packed rows included), embedding projections, tied and
untied heads; and SlamKit `UnitLM` folders (a causal LM under `lm.`) convert as the LM inside."""

import json
import os

import jax
import numpy as np
import pytest
import torch
from transformers import OPTConfig, OPTForCausalLM

from checkpoints_conversion import safetensors_io
from checkpoints_conversion.convert import convert
from checkpoints_conversion.export_hf import export
from checkpoints_conversion.sources import SourceError, open_source
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model import families
from s2sjax.runtime import sharding
from s2sjax.model.families import from_hf_config
from s2sjax.model.config import ConfigError
from s2sjax.model.decoder import abstract_params, param_count, sequence_log_probs
from s2sjax.data.packing import RowShape, fit, pack
from s2sjax.scoring.scorer import Scorer, collect
from tests.hf_models import save_hf, tiny_model, torch_log_probs, write_raw_checkpoint
from tests.scoring_cases import random_items, reference_mean_nll

LENGTH = 600  # position-table errors (a wrong offset) hide on short inputs no better than rope errors do
TOLERANCE = 1e-4

SMALL_OPT = dict(vocab_size=512, hidden_size=64, ffn_dim=160, num_hidden_layers=3, num_attention_heads=4,
                 max_position_embeddings=1024, dropout=0.0)
# OPT-350m's shape in small: post-norm, no final LayerNorm, embeddings narrower than the layers, tied head.
OPT_350M_LIKE = dict(do_layer_norm_before=False, word_embed_proj_dim=32)
CASES = {
  "tied_pre_norm": {},
  "projected_untied": dict(word_embed_proj_dim=32, tie_word_embeddings=False),
  "post_norm_projected": OPT_350M_LIKE,
  "no_bias_no_final_norm": dict(enable_bias=False, _remove_final_layer_norm=True),
}


def tiny_opt(seed: int = 0, **overrides) -> OPTForCausalLM:
  """A random OPTForCausalLM with weights big enough that errors show (std 0.1), LayerNorm scales and biases away
  from 1 and 0 so that a mis-mapped one cannot hide."""
  torch.manual_seed(seed)
  model = OPTForCausalLM(OPTConfig(**dict(SMALL_OPT, init_std=0.1, **overrides)))
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "layer_norm" in name and name.endswith(".weight"):
        param.copy_(1.0 + 0.2 * torch.randn_like(param))
      elif name.endswith(".bias"):
        param.copy_(0.2 * torch.randn_like(param))
  return model.eval()


def _converted(model, directory) -> tuple:
  convert(save_hf(model, os.path.join(directory, "hf")), os.path.join(directory, "ckpt"))
  ckpt = os.path.join(directory, "ckpt")
  return checkpoint.load_config(ckpt), checkpoint.load_params(ckpt)


def _max_log_prob_diff(model, config, params, seed=1) -> float:
  ids = np.random.default_rng(seed).integers(0, config.vocab_size, size=(1, LENGTH))
  return float(np.abs(np.asarray(sequence_log_probs(config, params, ids)) - torch_log_probs(model, ids)).max())


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_fp32_log_probs_match_transformers(tmp_path, case, record_property):
  model = tiny_opt(**CASES[case])
  config, params = _converted(model, str(tmp_path))
  hf = model.config
  assert (config.family, config.pre_norm, config.tie_embeddings) == ("opt", hf.do_layer_norm_before,
                                                                     hf.tie_word_embeddings)
  assert config.final_norm == (hf.do_layer_norm_before and not hf._remove_final_layer_norm)
  assert config.embed_dim == hf.word_embed_proj_dim and config.qkv_bias == hf.enable_bias
  diff = _max_log_prob_diff(model, config, params)
  record_property("max_abs_log_prob_diff", diff)
  print(f"opt {case}: max |log p_torch - log p_jax| = {diff:.2e} over {LENGTH} tokens")
  assert diff <= TOLERANCE


@pytest.fixture(scope="module")
def post_norm_opt(tmp_path_factory):
  """OPT-350m's shape in small, converted."""
  model = tiny_opt(seed=2, **OPT_350M_LIKE)
  directory = tmp_path_factory.mktemp("post_norm_opt")
  _converted(model, str(directory))
  return model, directory / "ckpt"


def _benchmark_scores(ckpt, mesh_spec: str, items) -> np.ndarray:
  """Mean NLL per question and candidate, scored as a benchmark is: packed rows, prefixes shared by their candidates,
  each candidate's positions continuing from its prefix's end."""
  config = checkpoint.load_config(ckpt)
  shape = RowShape(length=512, max_targets=256, max_slots=32)
  rows, report = pack(items, shape, share_prefix=True)
  assert report.tokens_saved_by_sharing > 0
  mesh = sharding.make_mesh(mesh_spec, jax.devices()[: 1 if mesh_spec == "data:1" else 8])
  rows, shape = fit(rows, shape, report.longest_item)
  scorer = Scorer(config, shape, mesh=mesh, batch_size=2)
  nll_sum, n_tokens = scorer.score(checkpoint.load_params(ckpt, mesh=mesh), rows, progress=False)
  return collect(rows, nll_sum, n_tokens, [len(it.candidates) for it in items]).mean_nll


@pytest.mark.slow
def test_packed_rows_read_the_position_table_where_a_whole_forward_does(post_norm_opt):
  """The learned table is read at the positions the naive one-forward-per-candidate run reads."""
  model, ckpt = post_norm_opt
  items = random_items(12, checkpoint.load_config(ckpt).vocab_size, seed=3)
  np.testing.assert_allclose(_benchmark_scores(ckpt, "data:1", items), reference_mean_nll(model, items),
                             atol=TOLERANCE, equal_nan=True)


@pytest.mark.slow
def test_a_mesh_that_splits_the_embeddings_gives_the_same_numbers(post_norm_opt):
  """fsdp splits the embedding width, next to the projections' and the position table's replicated axes."""
  model, ckpt = post_norm_opt
  items = random_items(12, checkpoint.load_config(ckpt).vocab_size, seed=3)
  np.testing.assert_allclose(_benchmark_scores(ckpt, "data:2,fsdp:2,model:2", items),
                             reference_mean_nll(model, items), atol=TOLERANCE, equal_nan=True)


@pytest.mark.parametrize("shape", ["opt-350m", "opt-1.3b"])
def test_num_params_counts_the_real_parameter_tree(shape):
  config = families.planner_shapes()[shape]
  assert config.num_params() == param_count(abstract_params(config))
  published = {"opt-350m": 331_196_416, "opt-1.3b": 1_315_758_080}  # facebook/opt-*'s parameter counts
  assert config.num_params() == published[shape]
  for case in CASES.values():  # the switches the planner shapes leave at one value
    small = from_hf_config(OPTConfig(**dict(SMALL_OPT, **case)).to_dict())
    assert small.num_params() == param_count(abstract_params(small)) == tiny_opt(**case).num_parameters()


@pytest.mark.parametrize("change, message", [
  (dict(activation_function="gelu"), r"OPT activation_function='gelu' is not supported"),
  (dict(layer_norm_elementwise_affine=False), r"OPT layer_norm_elementwise_affine=false .* is not supported"),
  (dict(do_layer_norm_before=None), r"config\.json has none of \['do_layer_norm_before'\]"),
  (dict(max_position_embeddings=None), r"config\.json has none of \['max_position_embeddings'\]"),
])
def test_switches_the_decoder_lacks_are_refused_by_name(change, message):
  cfg = dict(OPTConfig(**SMALL_OPT).to_dict(), **change)
  with pytest.raises(ConfigError, match=message):
    from_hf_config({k: v for k, v in cfg.items() if v is not None})


def test_config_written_before_it_had_the_new_switches_reads_as_before():
  llama = from_hf_config(tiny_model("llama").config.to_dict())
  old = {k: v for k, v in json.loads(llama.to_json()).items()
         if k not in ("norm", "pre_norm", "final_norm", "mlp", "position_embedding", "max_positions",
                      "position_offset", "word_embed_dim")}
  assert type(llama).from_json(json.dumps(old)) == llama


@pytest.mark.slow
def test_export_writes_what_transformers_loads_back_unchanged(tmp_path):
  model = tiny_opt(seed=4, **OPT_350M_LIKE)
  _converted(model, str(tmp_path))
  export(str(tmp_path / "ckpt"), str(tmp_path / "exported"))
  back = OPTForCausalLM.from_pretrained(str(tmp_path / "exported"), dtype=torch.float32).eval()
  assert back.config.do_layer_norm_before is False and back.config.word_embed_proj_dim == 32
  original = model.state_dict()
  for key, tensor in back.state_dict().items():
    torch.testing.assert_close(tensor, original[key], rtol=0, atol=0, msg=key)


def slamkit_checkpoint(model, directory: str, base_vocab_size: int) -> str:
  """`model` saved as SlamKit's UnitLM saves it: the LM's tensors, as transformers writes them, under `lm.`, and a
  config.json holding the LM's config as `base_config` with the base model's vocab size."""
  lm = save_hf(model, directory + "-lm")
  shard = safetensors_io.SafetensorsFile(os.path.join(lm, "model.safetensors"))
  tensors = {f"lm.{key}": shard.read(key) for key in shard.keys()}
  c = model.config
  config = {
    "model_type": "speech_language_model", "architectures": ["UnitLM"],
    "base_model_name": {"opt": "facebook/opt-350m", "qwen2": "Qwen/Qwen2.5-0.5B"}[c.model_type],
    "base_config": dict(c.to_dict(), vocab_size=base_vocab_size), "vocab_size": c.vocab_size, "twist_init": True,
    "tie_word_embeddings": c.tie_word_embeddings, "max_position_embeddings": c.max_position_embeddings,
    "use_cache": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1,
  }
  return write_raw_checkpoint(directory, config, tensors)


@pytest.mark.parametrize("family", ["opt", "qwen2"])
def test_a_slamkit_unit_lm_converts_as_the_lm_inside(tmp_path, family, record_property):
  """SlamKit (github.com/slp-rl/slamkit at 388b402) saves a UnitLM so, slamkit/model/unit_lm.py:
    line 33      UnitLMConfig.model_type = "speech_language_model";
    lines 63-73  the LM's own config is kept as `base_config`, a nested dict in config.json with its model_type
                 (qwen2 for SLAM: config/model/slam.yaml; opt for TWIST: config/model/default.yaml);
    line 87      UnitLM.base_model_prefix = "lm", and line 94 the LM is `self.lm`: every tensor key starts `lm.`;
    line 102     the LM's embeddings are resized to UnitLMConfig's own top-level vocab_size, which base_config's
                 need not be (transformers builds the LM from a copy of base_config).
  UnitLM is a transformers PreTrainedModel trained by the transformers Trainer (cli/train.py line 80), so a
  checkpoint is PreTrainedModel.save_pretrained's folder: config.json and model.safetensors (safe serialization
  is the default), a tied head left out as for the bare LM."""
  model = tiny_opt(seed=5, **OPT_350M_LIKE) if family == "opt" else tiny_model("qwen2", tied=True, seed=5)
  source = slamkit_checkpoint(model, str(tmp_path / "slamkit"), base_vocab_size=1000)
  assert all(key.startswith("lm.") for key in safetensors_io.SafetensorsFile(f"{source}/model.safetensors").keys())
  manifest = convert(source, str(tmp_path / "ckpt"))
  assert manifest["source_model_type"] == family and "SlamKit UnitLM" in manifest["source_description"]
  config, params = checkpoint.load_config(tmp_path / "ckpt"), checkpoint.load_params(tmp_path / "ckpt")
  assert config.vocab_size == model.config.vocab_size  # the top-level size, not base_config's
  diff = _max_log_prob_diff(model, config, params, seed=6)
  record_property("max_abs_log_prob_diff", diff)
  print(f"SlamKit UnitLM ({family}): max |log p_torch - log p_jax| = {diff:.2e} over {LENGTH} tokens")
  assert diff <= TOLERANCE


def test_a_wrapper_config_without_the_lm_config_is_refused(tmp_path):
  source = write_raw_checkpoint(str(tmp_path / "broken"), {"model_type": "speech_language_model", "vocab_size": 8},
                                {"lm.lm_head.weight": np.zeros((8, 4), np.float32)})
  with pytest.raises(SourceError, match=r"SlamKit UnitLM config\.json .* needs `base_config` with its model_type"):
    open_source(source)
