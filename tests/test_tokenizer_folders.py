"""A text tokenizer folder is read only as what it says it is: a tokenizer_config.json that is not one JSON object
is refused in one line naming the file, and code its `auto_map` names outside the folder (a path climbing out of
it, another repository) is never run, with --trust_remote_code or without: refused in one line that says so,
before transformers is asked (it would fail on the path with "too many values to unpack", or fetch the other
repository's code)."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from s2sjax.data import text_tokenizer
from s2sjax.data.text_tokenizer import RemoteCodeError, TokenizerConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]

# What the planted module would do when imported or its class built: leave a marker beside itself.
PLANTED = '''import os
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "RAN"), "w").close()

from transformers import PreTrainedTokenizerFast


class Tok(PreTrainedTokenizerFast):
  pass
'''


def _folder(tmp_path, qwen_tokenizer_dir, settings) -> pathlib.Path:
  """Qwen2.5's tokenizer files with tokenizer_config.json replaced by `settings` (written as JSON)."""
  folder = tmp_path / "tok"
  shutil.copytree(qwen_tokenizer_dir, folder)
  (folder / "tokenizer_config.json").write_text(json.dumps(settings))
  return folder


def _prepare(tmp_path, tokenizer_dir, *flags) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "tasks.prepare", "--task=sstorycloze", "--modality=t2t",
                         f"--tokenizer_dir={tokenizer_dir}", f"--data_dir={tmp_path / 'data'}", *flags],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def _one_line(done: subprocess.CompletedProcess) -> str:
  """The error line of a command refused as a user's mistake: exit 1, the line, then where to see more."""
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  assert done.returncode == 1 and len(lines) == 2 and lines[0].startswith("error: "), done.stderr
  assert lines[1] == "(--verbosity=1 shows where it was raised)"
  return lines[0]


def test_a_tokenizer_config_holding_a_list_is_refused_naming_the_file(tmp_path, qwen_tokenizer_dir):
  folder = _folder(tmp_path, qwen_tokenizer_dir, [{"model_max_length": 131072}])
  line = _one_line(_prepare(tmp_path, folder))
  assert f"{folder / 'tokenizer_config.json'} holds a JSON list, not an object" in line
  assert not (tmp_path / "data").exists() or not list((tmp_path / "data").rglob("dataset_info.json"))


@pytest.mark.parametrize("written, says", [
  ("{not json", "is not JSON"),
  ('"a string"', "holds a JSON str, not an object"),
  ('{"auto_map": "tok.Tok"}', "auto_map is a str, not an object"),
  ('{"auto_map": {"AutoTokenizer": [7, null]}}', "auto_map.AutoTokenizer is [7, null], not class names"),
  ('{"auto_map": [7, null]}', "auto_map.AutoTokenizer is [7, null], not class names"),
])
def test_a_malformed_tokenizer_config_is_refused_by_every_reader(tmp_path, qwen_tokenizer_dir, written, says):
  folder = _folder(tmp_path, qwen_tokenizer_dir, {})
  (folder / "tokenizer_config.json").write_text(written)
  for read in (lambda: text_tokenizer.load(str(folder)), lambda: text_tokenizer.folder_identity(str(folder)),
               lambda: text_tokenizer.check_trusted(str(folder), trust_remote_code=True)):
    path = re.escape(str(folder / "tokenizer_config.json"))
    with pytest.raises(TokenizerConfigError, match=rf"^{path}.*{re.escape(says)}"):
      read()


def _planted(tmp_path) -> pathlib.Path:
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "tok.py").write_text(PLANTED)
  return outside


@pytest.mark.slow
def test_code_named_outside_the_tokenizer_folder_is_never_run(tmp_path, qwen_tokenizer_dir):
  """auto_map `../outside/tok.Tok`, the module planted there writing a marker when imported: tasks.prepare exits 1
  with one line saying code outside the folder is never run, with the flag and without (not "read
  ../outside/tok.py, then pass --trust_remote_code"), and the marker is never written."""
  outside = _planted(tmp_path)
  folder = _folder(tmp_path, qwen_tokenizer_dir, {"auto_map": {"AutoTokenizer": ["../outside/tok.Tok", None]},
                                                  "tokenizer_class": "Tok"})
  for flags in ((), ("--trust_remote_code",)):
    line = _one_line(_prepare(tmp_path, folder, *flags))
    assert "auto_map names '../outside/tok.Tok'" in line and "code outside the folder is never run" in line
    assert "then pass --trust_remote_code" not in line
  assert not (outside / "RAN").exists()


@pytest.mark.parametrize("entry", ["../outside/tok.Tok", "/abs/outside/tok.Tok", "other/repo--tok.Tok",
                                   "tok.Tok.Inner", "outside.tok.Tok"])
def test_every_reader_refuses_code_outside_the_folder_trusted_or_not(tmp_path, qwen_tokenizer_dir, entry):
  """In process, through each door a tokenizer folder is opened by (loading, its identity, the converter's and
  the build's check), trusted: refused before transformers runs anything, the planted module never imported."""
  outside = _planted(tmp_path)
  folder = _folder(tmp_path, qwen_tokenizer_dir, {"auto_map": {"AutoTokenizer": entry}, "tokenizer_class": "Tok"})
  for read in (lambda: text_tokenizer.load(str(folder), trust_remote_code=True),
               lambda: text_tokenizer.folder_identity(str(folder), trust_remote_code=True),
               lambda: text_tokenizer.check_trusted(str(folder), trust_remote_code=True)):
    with pytest.raises(RemoteCodeError, match=rf"auto_map names '{re.escape(entry)}', which is not a module of the "
                                              r"tokenizer's folder .*code outside the folder is never run"):
      read()
  assert not (outside / "RAN").exists()
  assert "tok" not in sys.modules


def test_code_named_outside_the_folder_by_its_config_json_is_never_run(tmp_path, qwen_tokenizer_dir):
  """transformers' AutoTokenizer reads the folder's config.json too (its config class; its tokenizer class where
  tokenizer_config.json names none): an auto_map there naming code outside the folder is refused the same way."""
  outside = _planted(tmp_path)
  folder = _folder(tmp_path, qwen_tokenizer_dir, {})
  (folder / "config.json").write_text(json.dumps({"model_type": "qwen2",
                                                  "auto_map": {"AutoConfig": "../outside/tok.Tok"}}))
  with pytest.raises(RemoteCodeError, match=rf"^{re.escape(str(folder / 'config.json'))}: auto_map names "
                                            r"'\.\./outside/tok\.Tok'.*never run"):
    text_tokenizer.load(str(folder), trust_remote_code=True)
  assert not (outside / "RAN").exists()


@pytest.mark.parametrize("auto_map", [{"AutoTokenizer": ["tokenization_toy.Tok", None]},
                                      ["tokenization_toy.Tok", None]])  # transformers' legacy spelling
def test_code_of_the_folder_itself_is_still_named_for_trust(tmp_path, qwen_tokenizer_dir, auto_map):
  """The rule for code inside the folder is unchanged: named, and refused without the flag."""
  folder = _folder(tmp_path, qwen_tokenizer_dir, {"auto_map": auto_map})
  assert text_tokenizer.remote_code_files(str(folder)) == ["tokenization_toy.py"]
  with pytest.raises(RemoteCodeError, match=r"is code \(tokenization_toy\.py.*read it, then pass --trust_remote_code"):
    text_tokenizer.check_trusted(str(folder), trust_remote_code=False)
