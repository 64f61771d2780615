"""A model family is one module: the registry finds it by name, by config.json model_type and by GGUF architecture,
and a family only a test defines (a plugin) converts and scores like the built-ins, through the library and the
command line. No module that looks families up spells one out."""

import ast
import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from checkpoints_conversion.convert import convert
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model import families
from s2sjax.runtime import plugins
from s2sjax.model.families import from_hf_config
from s2sjax.model.config import ConfigError
from s2sjax.model.decoder import sequence_log_probs
from tests.hf_models import tiny_model, toy_family_checkpoint, torch_log_probs

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOY_PLUGIN = "tests.plugins.toy_family"

@pytest.fixture
def toy_family(monkeypatch):
  monkeypatch.setenv(plugins.ENV, TOY_PLUGIN)
  assert "toyllama" in families.names()  # the lookup imported the plugin, which registered itself
  return families.get("toyllama")


@pytest.mark.slow
def test_a_family_only_a_plugin_defines_converts_and_matches_transformers(tmp_path, toy_family):
  model = tiny_model("llama")
  source = toy_family_checkpoint(model, str(tmp_path / "toy"))
  manifest = convert(source, str(tmp_path / "ckpt"))
  assert manifest["source_model_type"] == "toyllama"
  config, params = checkpoint.load_config(tmp_path / "ckpt"), checkpoint.load_params(tmp_path / "ckpt")
  assert config.family == "toyllama" and config.rope_theta == 50000.0
  ids = np.random.default_rng(7).integers(0, config.vocab_size, size=(1, 600))  # rope errors hide on short inputs
  assert np.abs(np.asarray(sequence_log_probs(config, params, ids)) - torch_log_probs(model, ids)).max() <= 1e-4

  # The command line sees the family through $S2SJAX_PLUGINS, and only through it.
  command = [sys.executable, "-m", "checkpoints_conversion.convert", f"--source={source}", "--family=toyllama"]
  without = {k: v for k, v in os.environ.items() if k != plugins.ENV}
  refused = subprocess.run(command + [f"--output={tmp_path / 'refused'}"], cwd=ROOT, env=without, capture_output=True,
                           text=True)
  assert refused.returncode != 0 and "--family=toyllama: value should be one of" in refused.stderr
  subprocess.run(command + [f"--output={tmp_path / 'cli'}"], cwd=ROOT, env=dict(without, **{plugins.ENV: TOY_PLUGIN}),
                 check=True, capture_output=True)
  from_cli = checkpoint.load_params(tmp_path / "cli")
  for (path, a), (_, b) in zip(checkpoint.flatten(params), checkpoint.flatten(from_cli)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg="/".join(path))


def test_a_plugin_family_reaches_the_planner_and_declares_its_audio_inputs(toy_family):
  shape = families.planner_shapes()["toyllama-1b"]
  assert shape.family == "toyllama" and np.isclose(shape.num_params() / 1e9, 1.1, atol=0.05)  # TinyLlama's size
  assert toy_family.audio_inputs == ("extended_vocab",)


def test_vendor_layouts_are_layouts_of_a_family_not_families():
  qwen2, glm4 = families.get("qwen2"), families.get("glm4")
  assert families.layout_for_model_type("omni") is qwen2.layout("baichuan_audio")
  assert families.layout_for_model_type("chatglm") is glm4.layout("chatglm")
  assert families.layout_for_model_type("glm") is glm4.layout(families.HF)
  assert not {"baichuan_audio", "chatglm"} & set(families.names())
  assert {"auto", "qwen2", "llama", "glm4", "baichuan_audio"} <= {"auto", *families.layout_choices()}  # --family
  assert families.model_types("glm4") == ("glm", "chatglm") and families.model_types("baichuan_audio") == ("omni",)
  baichuan = {"model_type": "omni", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, "rms_norm_eps": 1e-6,
              "rotary_emb_base": 1e6,
              "audio_config": {"vq_config": {"codebook_sizes": [8, 4]}, "audio_pad_token_id": 90}}
  config = from_hf_config(baichuan)
  assert (config.family, config.audio_codebook_sizes) == ("qwen2", (9, 5))
  assert families.gguf_layout("llama") is families.get("llama").gguf
  with pytest.raises(ConfigError, match=r"GGUF architecture 'mamba' is not supported \(supported: qwen2, llama\)"):
    families.gguf_layout("mamba")


def test_the_evaluator_refuses_audio_inputs_the_family_does_not_take():
  from s2sjax.scoring.evaluator import EvalError, check_fit
  from s2sjax.data.task_data import TaskData

  glm = families.planner_shapes()["glm-4-9b"]
  from s2sjax.data.builds import BuildMetadata
  from s2sjax.data.packing import RowShape
  from s2sjax.data.spec import load_spec, spec_from_dict

  spec = dict(load_spec("baichuan_audio").as_dict(), codebook_sizes=[1025] * 8)
  data = TaskData("scmmlu", "s2t", rows={}, metadata=BuildMetadata(
    "scmmlu", "s2t", spec_from_dict(spec), RowShape(length=1024, max_targets=512, max_slots=256, num_codebooks=8),
    tokenizer={"name_or_path": "qwen", "size": 151_000, "vocab_sha": "0" * 16}))
  with pytest.raises(EvalError, match=r"spec baichuan_audio feeds audio as codebook_tables; the glm4 family takes "
                                      r"extended_vocab"):
    check_fit(glm, data)
  check_fit(glm, dataclasses.replace(data, modality="t2t"))  # its text rows are fine


def test_unknown_family_names_the_registered_ones_and_the_plugin_variable():
  message = r"unknown model family 'mamba'; registered: qwen2, llama, glm4.*S2SJAX_PLUGINS"
  with pytest.raises(ConfigError, match=message):
    dataclasses.replace(families.planner_shapes()["qwen2.5-0.5b"], family="mamba")


def _layout(name="hf", model_types=("qwen3",)):
  return families.Layout(name, model_types, parse_config=lambda cfg: None, rules=lambda config, cfg: [])


@pytest.mark.parametrize("family, message", [
  (families.Family("qwen3", (_layout(model_types=("qwen2",)),)), r"model_type 'qwen2' is read by qwen2/hf already"),
  (families.Family("qwen3", (_layout("chatglm"),)), r"layout name 'chatglm' is taken"),
  (families.Family("qwen3", (_layout(),), audio_inputs=("streams",)), r"unknown audio input 'streams'"),
  (families.Family("llama", (_layout(),)), r"a family named 'llama' is registered already"),
])
def test_register_refuses_what_would_make_a_lookup_ambiguous(family, message):
  before = families.names()
  with pytest.raises(ValueError, match=message):
    families.register(family)
  assert families.names() == before


# Modules that look families and layouts up; each must find them in the registry, not spell them out. (The
# conversion memory benchmark writes a Qwen2 checkpoint on purpose: an input, not a lookup.)
LOOKING_UP = [
  "checkpoints_conversion/convert.py", "checkpoints_conversion/sources.py", "checkpoints_conversion/export_hf.py",
  "checkpoints_conversion/verify.py", "s2sjax/scoring/planner.py", "s2sjax/model/config.py", "s2sjax/model/decoder.py",
  "s2sjax/benchmarks/accelerator.py",
]
# Fragments of vendor and llama.cpp key spellings, and of transformers' architecture names.
KEY_SPELLINGS = ("W_pack", "query_key_value", "dense_h_to_4h", "gate_up_proj", "audio_embed_layers", "audio_head",
                 "token_embd", "blk.", "attn_q", "ForCausalLM", "transformer.encoder")


def _registered_names() -> set[str]:
  names = set(families.names())
  for family, layout in families.all_layouts():
    names.update(layout.model_types)
    names.update({layout.name} - {families.HF})
    names.update({family.gguf.architecture} if family.gguf else set())
  return names


def spelled_out(source: str) -> list[str]:
  """String constants (docstrings aside: they may name examples) that are a family, layout, model_type or GGUF
  architecture name, or hold a piece of a family's key spelling."""
  tree = ast.parse(source)
  docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
  names = _registered_names()
  return sorted(
    node.value for node in ast.walk(tree)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    and (node.value in names or any(fragment in node.value for fragment in KEY_SPELLINGS))
  )


@pytest.mark.parametrize("path", LOOKING_UP)
def test_modules_that_look_families_up_list_none(path):
  assert spelled_out((ROOT / path).read_text(encoding="utf-8")) == []


def test_the_check_sees_a_family_table():
  sample = '"""Converts llama and qwen2."""\nARCH = {"llama": "LlamaForCausalLM"}\nKEY = f"{p}.W_pack.weight"\n'
  assert spelled_out(sample) == [".W_pack.weight", "LlamaForCausalLM", "llama"]
