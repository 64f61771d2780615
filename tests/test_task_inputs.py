"""What a build reads, and when built data may be reused: a given --manual_dir must exist, data built from other
inputs (release files, spec, text or audio tokenizer) is refused unless overwritten, YAML specs name their configs
by name and contents, and a missing tokenizer directory is named."""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds
from transformers import AutoTokenizer

from s2sjax.data import task_registry
from s2sjax.data.builds import DataSelector
from s2sjax.data.task_data import load_rows, load_task_data
from s2sjax.data import spec as spec_module
from tasks.audio.precomputed import PrecomputedTokenizer
from tasks.preparation import StaleDataError, builder_class, prepare
from tasks.release import ReleaseError
from tasks.sample import RELEASE_DIR
from s2sjax.data.spec import load_spec

CMMLU_LINES = [{"uttid": k, "first": "水的沸点是", "A": "一百度。", "B": "十度。", "C": "零度。", "D": "五度。", "answer": "A"}
               for k in range(2)]


def _release(root, lines=CMMLU_LINES):
  """An sCMMLU release (text only: these builds are text or read precomputed codes)."""
  jsonl = os.path.join(root, task_registry.get("scmmlu").release_jsonl)
  os.makedirs(os.path.dirname(jsonl), exist_ok=True)
  with open(jsonl, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
  return str(root)


def test_a_manual_dir_that_does_not_exist_is_an_error_not_the_sample(tmp_path, qwen_tokenizer_dir):
  missing = str(tmp_path / "no-such-release")
  with pytest.raises(ReleaseError, match=rf"--manual_dir {re.escape(missing)} does not exist"):
    prepare("scmmlu", "demo", "text", 1024, str(tmp_path / "data"), manual_dir=missing,
            tokenizer_dir=qwen_tokenizer_dir)
  builder = builder_class("scmmlu")(config="demo-t2t-1024", data_dir=str(tmp_path / "data"),
                                    tokenizer_dir=qwen_tokenizer_dir)  # TFDS's own entry point says the same
  with pytest.raises(ReleaseError, match=rf"--manual_dir {re.escape(missing)} does not exist"):
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=missing))
  assert not builder.is_prepared()
  sample = builder_class("scmmlu")(config="demo-t2t-1024", data_dir=str(tmp_path / "data"),
                                   tokenizer_dir=qwen_tokenizer_dir)
  sample.download_and_prepare()  # no manual_dir at all: the bundled sample
  assert sample.info.metadata["source"] == RELEASE_DIR


@pytest.mark.slow
def test_data_built_from_other_release_files_or_tokenizer_is_refused_or_overwritten(tmp_path, qwen_tokenizer_dir):
  root = _release(tmp_path / "release")
  data_dir = str(tmp_path / "data")
  build = lambda **kw: prepare("scmmlu", "demo", "text", 1024, data_dir, manual_dir=root,
                               **{"tokenizer_dir": qwen_tokenizer_dir, **kw})
  first = build()
  assert set(first.inputs) == {"release", "spec", "text_tokenizer", "audio_tokenizer"}
  assert build().inputs == first.inputs  # same inputs: reused
  _release(tmp_path / "release", [dict(CMMLU_LINES[0], B="一千度。"), CMMLU_LINES[1]])
  with pytest.raises(StaleDataError, match=rf"scmmlu/demo-t2t-1024 in {re.escape(data_dir)} was built from other "
                                           r"inputs \(the release files changed; .*pass --overwrite"):
    build()
  rebuilt = build(overwrite=True)
  assert rebuilt.questions[0]["candidates"][1] == "一千度。"
  assert rebuilt.inputs["release"] != first.inputs["release"]
  _, stored = load_rows(data_dir, "scmmlu", "demo-t2t-1024")
  assert stored.questions == rebuilt.questions and build().inputs == rebuilt.inputs
  other_tokenizer = str(tmp_path / "tokenizer")  # the same tokenizer with one more token
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  tokenizer.add_tokens(["<|new_token|>"])
  tokenizer.save_pretrained(other_tokenizer)
  with pytest.raises(StaleDataError, match=r"\(the text tokenizer changed;"):
    build(tokenizer_dir=other_tokenizer)


def test_a_tokenizer_rewritten_in_its_folder_is_read_again(tmp_path, qwen_tokenizer_dir):
  from s2sjax.data import text_tokenizer

  folder = tmp_path / "tokenizer"
  shutil.copytree(qwen_tokenizer_dir, folder)
  first = text_tokenizer.load(str(folder))
  assert text_tokenizer.load(str(folder)) is first  # read once while its files stay as they are
  grown = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  grown.add_tokens(["<|new_token|>"])
  grown.save_pretrained(folder)
  assert len(text_tokenizer.load(str(folder))) == len(first) + 1


def test_a_folders_identity_is_remembered_by_its_files_and_worked_out_again_when_they_change(
    tmp_path, qwen_tokenizer_dir, monkeypatch):
  from s2sjax.data import text_tokenizer

  monkeypatch.setenv("S2SJAX_CACHE", str(tmp_path / "cache"))
  folder = tmp_path / "tokenizer"
  shutil.copytree(qwen_tokenizer_dir, folder)
  read = text_tokenizer.identity(AutoTokenizer.from_pretrained(folder))
  assert text_tokenizer.folder_identity(str(folder)) == read
  (remembered,) = (tmp_path / "cache" / text_tokenizer.IDENTITIES).iterdir()

  def unread(*args):
    raise AssertionError("the tokenizer was read again")

  with monkeypatch.context() as m:  # asked again, the tokenizer is not read, and its copy elsewhere is the same
    m.setattr(text_tokenizer, "load", unread)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert text_tokenizer.folder_identity(str(copy)) == {**read, "name_or_path": "copy"}
  remembered.write_text("{not json")  # damaged: worked out again, and written again
  assert text_tokenizer.folder_identity(str(folder)) == read and json.loads(remembered.read_text())
  grown = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  grown.add_tokens(["<|new_token|>"])
  grown.save_pretrained(folder)  # other files: another identity, not the one remembered for the old files
  assert text_tokenizer.folder_identity(str(folder)) == text_tokenizer.identity(AutoTokenizer.from_pretrained(folder))
  assert text_tokenizer.folder_identity(str(folder))["size"] == read["size"] + 1


def test_a_changed_preset_spec_is_refused(tmp_path, qwen_tokenizer_dir, monkeypatch):
  data_dir = str(tmp_path / "data")
  prepare("scmmlu", "demo", "text", 1024, data_dir, tokenizer_dir=qwen_tokenizer_dir)
  specs = tmp_path / "specs"
  shutil.copytree(spec_module.SPECS_DIR, specs)
  with open(specs / "demo.yaml", "a", encoding="utf-8") as f:
    f.write("text_separator: {zh: ' '}\n")
  monkeypatch.setattr(spec_module, "SPECS_DIR", str(specs))
  with pytest.raises(StaleDataError, match=r"\(the spec changed;"):
    prepare("scmmlu", "demo", "text", 1024, data_dir, tokenizer_dir=qwen_tokenizer_dir)


@pytest.mark.slow
def test_a_yaml_spec_names_its_config_and_precomputed_codes_are_fingerprinted_by_content(tmp_path, qwen_tokenizer_dir):
  """A spec given as a path builds `<its name>-<content hash>-...` inside data_dir, the evaluator finds it by the
  same path, and codes rewritten in place (same names, same sizes) are a different audio tokenizer."""
  root = _release(tmp_path / "release")
  yaml_path = str(tmp_path / "specs" / "mydemo.yaml")
  os.makedirs(os.path.dirname(yaml_path))
  with open(yaml_path, "w", encoding="utf-8") as f:
    f.write("name: mydemo\naudio_mode: codebook_tables\naudio_tokenizer: {type: precomputed}\ncodebook_sizes: [16]\n"
            "placeholder_token: '<|endoftext|>'\n")
  name = DataSelector("sstorycloze", "speech", yaml_path, 1024).config
  assert name == f"mydemo-{load_spec(yaml_path).digest()[:8]}-s2t-1024"
  codes_dir = tmp_path / "codes"
  codes_dir.mkdir()
  rng = np.random.default_rng(0)
  for uttid in ("0", "1"):
    np.save(codes_dir / f"{uttid}.npy", rng.integers(0, 16, (20, 1)))
  data_dir = str(tmp_path / "data")
  build = lambda **kw: prepare("scmmlu", yaml_path, "speech", 1024, data_dir, manual_dir=root,
                               tokenizer_dir=qwen_tokenizer_dir, audio_tokenizer_dir=str(codes_dir), **kw)
  build()
  assert sorted(os.listdir(tmp_path)) == ["codes", "data", "release", "specs"]  # nothing written beside data_dir
  assert [n for n in os.listdir(os.path.join(data_dir, "scmmlu")) if not n.startswith(".")] == [name]
  data = load_task_data(data_dir, "scmmlu", "speech", yaml_path, 1024)
  assert data.metadata.spec.name == "mydemo"
  before = PrecomputedTokenizer(str(codes_dir), (16,)).fingerprint()
  new_codes = (np.load(codes_dir / "0.npy") + 1) % 16
  np.save(codes_dir / "0.npy", new_codes)
  assert PrecomputedTokenizer(str(codes_dir), (16,)).fingerprint() != before
  with pytest.raises(StaleDataError, match=r"\(the audio tokenizer changed;"):
    build()
  build(overwrite=True)
  rows = load_task_data(data_dir, "scmmlu", "speech", yaml_path, 1024).rows
  item = data.questions.slots[0, 0, 0]
  r = np.argwhere(rows["slot_item"] == item)[0][0]
  segment = rows["segment_ids"][r][rows["target_pos"][r][rows["target_slot"][r] == 0][0]]
  audio = (rows["segment_ids"][r] == segment) & (rows["audio_codes"][r][:, 0] >= 0)
  np.testing.assert_array_equal(rows["audio_codes"][r][audio][:, 0], new_codes[:, 0])


def test_a_missing_tokenizer_directory_is_named(tmp_path):
  root = _release(tmp_path / "release")
  missing = str(tmp_path / "no-tokenizer")
  with pytest.raises(FileNotFoundError, match=rf"text tokenizer directory {re.escape(missing)} \(--tokenizer_dir\)"):
    prepare("scmmlu", "demo", "text", 1024, str(tmp_path / "data"), manual_dir=root, tokenizer_dir=missing)
  default = re.escape(os.path.join(root, "tokenizer"))
  with pytest.raises(FileNotFoundError,
                     match=rf"text tokenizer directory {default} \(the default: <manual_dir>/tokenizer\)"):
    prepare("scmmlu", "qwen2.5", "text", 1024, str(tmp_path / "data"), manual_dir=root)
