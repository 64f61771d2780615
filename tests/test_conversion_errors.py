"""Bad checkpoints fail with errors that name the key, the shapes or the file, and leave nothing half-written."""

import json
import os
import re
import shutil
import struct

import numpy as np
import pytest

from checkpoints_conversion import safetensors_io, sources
from checkpoints_conversion.convert import ConversionError, convert
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.model.config import ConfigError
from tests.hf_models import save_hf, tiny_model, write_raw_checkpoint


@pytest.fixture
def hf_dir(tmp_path):
  return save_hf(tiny_model("qwen2"), str(tmp_path / "hf"))


def _rewrite(directory, edit_tensors=None, edit_config=None):
  path = os.path.join(directory, "model.safetensors")
  shard = safetensors_io.SafetensorsFile(path)
  tensors = {k: np.array(shard.read(k)) for k in shard.keys()}
  del shard
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  os.remove(path)
  write_raw_checkpoint(directory, edit_config(config) if edit_config else config, edit_tensors(tensors) if edit_tensors else tensors)


def test_missing_key_is_named(tmp_path, hf_dir):
  _rewrite(hf_dir, lambda t: {k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"})
  with pytest.raises(ConversionError, match=r"missing key model\.layers\.1\.mlp\.up_proj\.weight"):
    convert(hf_dir, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")


def test_unexpected_keys_are_listed_unless_skipped_deliberately(tmp_path, hf_dir):
  _rewrite(hf_dir, lambda t: dict(t, **{"model.vision_tower.proj.weight": np.ones((2, 2), np.float32)}))
  with pytest.raises(ConversionError, match=r"1 unexpected key\(s\)[\s\S]*model\.vision_tower\.proj\.weight"):
    convert(hf_dir, str(tmp_path / "out"))
  manifest = convert(hf_dir, str(tmp_path / "out"), skip_prefixes=["model.vision_tower."])
  assert manifest["skipped"] == ["model.vision_tower.proj.weight"]
  assert checkpoint.load_manifest(tmp_path / "out")["skipped"] == ["model.vision_tower.proj.weight"]


def test_shape_mismatch_names_key_and_both_shapes(tmp_path, hf_dir):
  _rewrite(hf_dir, edit_config=lambda c: dict(c, intermediate_size=96))
  with pytest.raises(ConversionError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight: checkpoint has \(160, 64\), config\.json implies \(96, 64\)"):
    convert(hf_dir, str(tmp_path / "out"))


def test_unknown_architecture_lists_supported_ones(tmp_path, hf_dir):
  _rewrite(hf_dir, edit_config=lambda c: dict(c, model_type="gpt2"))
  with pytest.raises(ConversionError, match=r"'gpt2'.*supported families.*qwen2.*llama.*glm4.*baichuan_audio"):
    convert(hf_dir, str(tmp_path / "out"))
  with pytest.raises(ConfigError, match="rope_type 'yarn' is not supported"):
    from s2sjax.model.families import from_hf_config

    from_hf_config({**tiny_model("llama").config.to_dict(), "rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5}})


def test_family_flag_must_agree_with_the_checkpoint(tmp_path, hf_dir):
  with pytest.raises(ConversionError, match=r"model_type 'qwen2' is not supported for --family=glm4"):
    convert(hf_dir, str(tmp_path / "out"), family="glm4")


def test_tokenizer_larger_than_embedding_table(tmp_path, hf_dir, qwen_tokenizer_dir):
  for name in os.listdir(qwen_tokenizer_dir):
    shutil.copy(os.path.join(qwen_tokenizer_dir, name), hf_dir)
  with pytest.raises(ConversionError, match=r"tokenizer has 1516\d\d tokens but the embedding table only 512 rows"):
    convert(hf_dir, str(tmp_path / "out"))


def test_failure_midway_leaves_no_output_and_no_staging(tmp_path, hf_dir, monkeypatch):
  original = sources.SafetensorsSource.read

  def failing_read(self, key):
    if key == "model.norm.weight":  # read late, after several leaves were written
      raise OSError("disk vanished")
    return original(self, key)

  monkeypatch.setattr(sources.SafetensorsSource, "read", failing_read)
  with pytest.raises(OSError, match="disk vanished"):
    convert(hf_dir, str(tmp_path / "out"))
  assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_existing_output_is_not_overwritten_by_accident(tmp_path, hf_dir):
  convert(hf_dir, str(tmp_path / "out"))
  with pytest.raises(checkpoint.CheckpointError, match="already exists"):
    convert(hf_dir, str(tmp_path / "out"))
  convert(hf_dir, str(tmp_path / "out"), overwrite=True)


def test_corrupt_or_incomplete_sources_name_the_file(tmp_path, hf_dir):
  with open(os.path.join(hf_dir, "model.safetensors"), "r+b") as f:
    f.seek(8)
    f.write(b"\xff\xfe garbage")
  with pytest.raises(sources.SourceError, match=r"model\.safetensors: corrupt safetensors header"):
    convert(hf_dir, str(tmp_path / "out"))
  sharded = save_hf(tiny_model("qwen2"), str(tmp_path / "sharded"), max_shard_size="40KB")
  os.remove(os.path.join(sharded, sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))[1]))
  with pytest.raises(sources.SourceError, match="names shards that are missing"):
    convert(sharded, str(tmp_path / "out2"))


def test_saving_params_that_do_not_fit_the_config(tmp_path):
  import jax

  from s2sjax.model.families import from_hf_config
  from s2sjax.model.decoder import init_params

  config = from_hf_config(tiny_model("qwen2").config.to_dict())
  params = init_params(config, jax.random.PRNGKey(0))
  params["layers"]["mlp"]["up"]["kernel"] = np.zeros((3, 64, 7), np.float32)
  params["extra"] = {"w": np.zeros(2)}
  with pytest.raises(checkpoint.CheckpointError, match=r"unexpected extra/w[\s\S]*layers/mlp/up/kernel: shape \(3, 64, 7\), config implies \(3, 64, 160\)"):
    checkpoint.save_params(tmp_path / "x", config, params)
  assert not os.path.exists(tmp_path / "x")


def _shard_tensors(path):
  """{key: (begin, end)} of a shard, in file order (read as raw JSON: the file may be broken on purpose)."""
  with open(path, "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
  header.pop("__metadata__", None)
  return dict(sorted(((k, tuple(v["data_offsets"])) for k, v in header.items()), key=lambda item: item[1]))


def test_truncated_shards_are_all_named_before_anything_is_written(tmp_path):
  sharded = save_hf(tiny_model("qwen2"), str(tmp_path / "sharded"), max_shard_size="40KB")
  shards = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))
  last_keys = []
  for name in shards[:2]:  # two shards lose their last bytes, as after an interrupted download
    path = os.path.join(sharded, name)
    last_keys.append(list(_shard_tensors(path))[-1])
    os.truncate(path, os.path.getsize(path) - 4)
  with pytest.raises(sources.SourceError) as error:
    convert(sharded, str(tmp_path / "out"))
  for name, key in zip(shards[:2], last_keys):
    assert re.search(rf"{re.escape(name)}: tensor {re.escape(key)}: bytes .* lie past the end", str(error.value))
  assert "2 problem(s)" in str(error.value)  # the keys of the unreadable shards are not also called unlisted
  assert sorted(os.listdir(tmp_path)) == ["sharded"]


def test_corrupt_length_prefix_and_non_object_header_name_the_file(tmp_path, hf_dir):
  path = os.path.join(hf_dir, "model.safetensors")
  with open(path, "r+b") as f:
    f.write(struct.pack("<Q", 2**63 + 5))
  with pytest.raises(sources.SourceError, match=r"model\.safetensors: corrupt safetensors header \(length prefix"):
    convert(hf_dir, str(tmp_path / "out"))
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", 8) + b"[1, 2]  ")
  with pytest.raises(sources.SourceError, match=r"model\.safetensors: corrupt safetensors header \(a JSON list"):
    convert(hf_dir, str(tmp_path / "out"))


def _write_header(path, header, data_size):
  blob = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob + bytes(data_size))
  return str(path)


@pytest.mark.parametrize("entry, message", [
  ({"dtype": "F32", "shape": [2]}, r"tensor bad: entry .* lacks dtype, shape or data_offsets"),
  ({"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}, r"tensor bad: shape \[2, -1\] is not a list of non-"),
  ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, r"tensor bad: data_offsets \[8, 0\] are not \[begin, end\]"),
  ({"dtype": "F32", "shape": [2], "data_offsets": [60, 68]}, r"tensor bad: bytes \[60, 68\] lie past the end"),
  ({"dtype": "F32", "shape": [3], "data_offsets": [32, 40]}, r"tensor bad: 8 bytes, but F32 \(3,\) needs 12"),
  ({"dtype": "BF16", "shape": [4], "data_offsets": [28, 36]}, r"tensors good and bad overlap at bytes \[28, 32\)"),
])
def test_malformed_tensor_entries_name_the_file_and_the_tensor(tmp_path, entry, message):
  path = _write_header(tmp_path / "x.safetensors", {"good": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                                                    "bad": entry}, data_size=64)
  with pytest.raises(ValueError, match=rf"x\.safetensors: {message}"):
    safetensors_io.read_header(path)


def test_sound_headers_pass_with_every_problem_listed_otherwise(tmp_path):
  sound = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]},
           "empty": {"dtype": "I64", "shape": [0], "data_offsets": [16, 16]},  # zero bytes overlap nothing
           "b": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}, "__metadata__": {"format": "pt"}}
  header, start = safetensors_io.read_header(_write_header(tmp_path / "ok.safetensors", sound, data_size=32))
  assert sorted(header) == ["a", "b", "empty"] and start > 8
  nested = {"outer": {"dtype": "U8", "shape": [32], "data_offsets": [0, 32]},
            "first": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]},
            "second": {"dtype": "U8", "shape": [4], "data_offsets": [16, 20]}}
  with pytest.raises(ValueError) as error:
    safetensors_io.read_header(_write_header(tmp_path / "nested.safetensors", nested, data_size=32))
  assert str(error.value).splitlines() == [
    f"{tmp_path / 'nested.safetensors'}: tensors outer and first overlap at bytes [4, 8)",
    f"{tmp_path / 'nested.safetensors'}: tensors outer and second overlap at bytes [16, 20)",
  ]
