"""Checkpoints that are not what they claim, refused by the converter naming the file and the key (a
safetensors header naming a tensor twice or leaving bytes to no tensor, a config.json value no decoder has, a
GGUF relabelled as another architecture), and a clean legacy `.bin` read as transformers reads it."""

import json
import os
import struct

import numpy as np
import pytest
import torch

from checkpoints_conversion import safetensors_io, sources
from checkpoints_conversion.convert import convert
from s2sjax.model import families
from s2sjax.model.config import ConfigError, ModelConfig
from tests.hf_models import save_hf, state_numpy, tiny_model


@pytest.fixture(scope="module")
def hf_model():
  return tiny_model("qwen2")


@pytest.fixture
def hf_dir(tmp_path, hf_model):
  return save_hf(hf_model, str(tmp_path / "hf"))


def _header(path):
  with open(path, "rb") as f:
    size = struct.unpack("<Q", f.read(8))[0]
    return f.read(size), 8 + size


def test_a_tensor_named_twice_in_a_safetensors_header_is_refused_naming_file_and_key(tmp_path, hf_dir):
  """A second entry for the final norm, over bytes of 7s appended to the data: json.loads keeps a key's last entry,
  so the norm would have converted as 7s. The safetensors library refuses the file too."""
  path = os.path.join(hf_dir, "model.safetensors")
  text, start = _header(path)
  with open(path, "rb") as f:
    f.seek(start)
    data = f.read()
  pairs = list(json.loads(text).items())
  norm = dict(pairs)["model.norm.weight"]
  sevens = np.full(norm["shape"], 7.0, np.float32).tobytes()
  pairs.append(("model.norm.weight", dict(norm, data_offsets=[len(data), len(data) + len(sevens)])))
  doubled = ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}").encode()
  doubled += b" " * (-len(doubled) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(doubled)) + doubled + data + sevens)
  with pytest.raises(sources.SourceError, match=r"model\.safetensors: the safetensors header names "
                                                r"'model\.norm\.weight' twice"):
    convert(hf_dir, str(tmp_path / "out"))
  assert sorted(os.listdir(tmp_path)) == ["hf"]
  safetensors_numpy = pytest.importorskip("safetensors.numpy")
  with pytest.raises(Exception, match="invalid offset"):
    safetensors_numpy.load_file(path)


@pytest.mark.parametrize("entries, data_size, message", [
    ({"a": [0, 8], "b": [16, 24]}, 24, r"bytes \[8, 16\) of the data section belong to no tensor \(between a and b\)"),
    ({"a": [0, 8]}, 16, r"bytes \[8, 16\) of the data section belong to no tensor \(after a\)"),
    ({"a": [8, 16]}, 16, r"bytes \[0, 8\) of the data section belong to no tensor \(between the start and a\)"),
])
def test_offsets_that_do_not_tile_the_data_section_are_refused_as_the_library_refuses_them(tmp_path, entries,
                                                                                          data_size, message):
  path = str(tmp_path / "x.safetensors")
  header = {name: {"dtype": "F32", "shape": [2], "data_offsets": span} for name, span in entries.items()}
  blob = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob + bytes(data_size))
  with pytest.raises(safetensors_io.SafetensorsError, match=rf"x\.safetensors: {message}"):
    safetensors_io.read_header(path)
  safetensors_numpy = pytest.importorskip("safetensors.numpy")
  with pytest.raises(Exception, match="invalid offset|not fully covered"):
    safetensors_numpy.load_file(path)


def _legacy_bin(directory, state):
  """`pytorch_model.bin` in torch's legacy (pre-1.6, non-zip) serialization."""
  torch.save(state, os.path.join(directory, "pytorch_model.bin"), _use_new_zipfile_serialization=False)


def test_a_clean_legacy_bin_is_read_as_transformers_reads_it(tmp_path, hf_dir, hf_model):
  os.remove(os.path.join(hf_dir, "model.safetensors"))
  _legacy_bin(hf_dir, hf_model.state_dict())
  source = sources.open_source(hf_dir)
  expected = state_numpy(hf_model)
  assert sorted(source.keys()) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_array_equal(source.read(key), value)
  convert(hf_dir, str(tmp_path / "out"))
  assert os.path.exists(tmp_path / "out" / "model_config.json")


class _RunsCode:
  def __reduce__(self):
    return (os.mkdir, ("/nonexistent-pickle-ran",))


def test_a_legacy_bin_that_would_run_code_is_refused(tmp_path, hf_dir, hf_model):
  os.remove(os.path.join(hf_dir, "model.safetensors"))
  _legacy_bin(hf_dir, dict(hf_model.state_dict(), payload=_RunsCode()))
  with pytest.raises(sources.SourceError, match=r"pytorch_model\.bin: cannot be read as a PyTorch state dict "
                                                r"\(Weights only load failed"):
    sources.open_source(hf_dir)


@pytest.mark.parametrize("edit, message", [
    ({"num_hidden_layers": -1}, r"config\.json num_hidden_layers=-1: must be a positive integer"),
    ({"vocab_size": 0}, r"config\.json vocab_size=0: must be a positive integer"),
    ({"rms_norm_eps": -1}, r"config\.json rms_norm_eps=-1\.0: must be a positive number"),
    ({"rms_norm_eps": float("nan")}, r"config\.json rms_norm_eps=nan: must be a positive number"),
    ({"rope_theta": 0}, r"config\.json rope_theta=0\.0: must be a positive number \(the rotary base\)"),
    ({"num_attention_heads": 0}, r"config\.json num_attention_heads=0: must be a positive integer"),
    ({"num_key_value_heads": 0}, r"config\.json num_key_value_heads=0: must be a positive integer"),
    ({"intermediate_size": 1.5}, r"config\.json intermediate_size=1\.5: must be a positive integer"),
    ({"hidden_size": "64"}, r"config\.json hidden_size='64' is not a number"),
    ({"rms_norm_eps": True}, r"config\.json rms_norm_eps=True is not a number"),
])
def test_config_values_no_decoder_has_are_refused_when_read_naming_key_and_value(tmp_path, hf_dir, edit, message):
  path = os.path.join(hf_dir, "config.json")
  with open(path) as f:
    config = json.load(f)
  config.update(edit)
  if "rope_theta" in edit and "rope_parameters" in config:  # transformers v5 spells it there
    config["rope_parameters"]["rope_theta"] = edit["rope_theta"]
  with open(path, "w") as f:
    json.dump(config, f)
  with pytest.raises(ConfigError, match=message):
    convert(hf_dir, str(tmp_path / "out"))
  assert sorted(os.listdir(tmp_path)) == ["hf"]


@pytest.mark.parametrize("family_config, message", [
    ({"model_type": "chatglm", "padded_vocab_size": 64, "hidden_size": 32, "ffn_hidden_size": 64, "num_layers": 0,
      "num_attention_heads": 2, "kv_channels": 16, "layernorm_epsilon": 1e-5},
     r"config\.json num_layers=0: must be a positive integer"),
    ({"model_type": "opt", "vocab_size": 64, "hidden_size": 32, "ffn_dim": -64, "num_hidden_layers": 1,
      "num_attention_heads": 2, "max_position_embeddings": 32, "do_layer_norm_before": True},
     r"config\.json ffn_dim=-64: must be a positive integer"),
    ({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 0, "rms_norm_eps": 1e-5, "rope_theta": 1e4},
     r"config\.json num_attention_heads=0: must be a positive integer"),
])
def test_every_family_names_a_refused_value_in_its_own_spelling(family_config, message):
  with pytest.raises(ConfigError, match=message):
    families.from_hf_config(family_config)


def test_model_config_json_values_are_checked_when_read():
  good = json.loads(ModelConfig("llama", 64, 32, 64, 1, 2, 2, 16, 1e4, 16, False, 1e-5, False, False, False,
                                False).to_json())
  for field, value, message in (("num_layers", 0, "num_layers=0: must be a positive integer"),
                                ("rms_norm_eps", -1e-5, "rms_norm_eps=-1e-05: must be a positive number"),
                                ("vocab_size", True, "vocab_size=True: must be a positive integer")):
    with pytest.raises(ConfigError, match=message):
      ModelConfig.from_json(json.dumps(dict(good, **{field: value})))


def test_a_config_json_that_is_no_object_is_refused_naming_the_file(tmp_path, hf_dir):
  path = os.path.join(hf_dir, "config.json")
  with open(path) as f:
    config = json.load(f)
  for text, message in ((json.dumps([config]), r"config\.json holds a JSON list, not an object of settings"),
                        ('{"model_type": "qwen2",', r"config\.json is not JSON")):
    with open(path, "w") as f:
      f.write(text)
    with pytest.raises(sources.SourceError, match=message):
      convert(hf_dir, str(tmp_path / "out"))


def test_a_gguf_relabelled_as_another_architecture_is_refused_naming_the_missing_key(tmp_path):
  gguf = pytest.importorskip("gguf")
  path = str(tmp_path / "relabelled.gguf")
  writer = gguf.GGUFWriter(path, "qwen2")  # general.architecture; the settings below are llama's
  for key, value in {"block_count": 1, "embedding_length": 8, "feed_forward_length": 16, "attention.head_count": 2,
                     "context_length": 64}.items():
    writer.add_uint32(f"llama.{key}", value)
  writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
  writer.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(sources.SourceError, match=r"relabelled\.gguf: GGUF general\.architecture is 'qwen2' but the file "
                                                r"has no qwen2\.attention\.head_count \(its settings are under llama: "
                                                r"relabelled\?\)"):
    sources.open_source(path)
