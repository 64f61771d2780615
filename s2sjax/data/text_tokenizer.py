"""Text tokenizers from local folders, what tells two of them apart, and the one rule for tokenizers shipped as code.

GLM-4-Voice's tokenizer is a Python class in its folder (`tokenization_chatglm.py`, named by tokenizer_config.json's
`auto_map`): transformers runs that code only with `trust_remote_code`, and so does every s2sjax command. Asked to
load one without it, each refuses with the same words, naming the folder and the flag, before anything is written.
Code an `auto_map` names outside the folder (a path, another repository) is refused with or without the flag.

Data is built with one tokenizer and scored by a checkpoint holding one: `identity` is what the two are compared
by (a hash of the vocabulary). `folder_identity` remembers a folder's identity in the project's cache by the hash of
its files, so a command that only compares need not import transformers and read the tokenizer again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re

from s2sjax.runtime import cache
from s2sjax.runtime.errors import UserError
from s2sjax.runtime.output_dir import OutputError, write_atomic

IDENTITIES = "tokenizer-identities"  # in the project's cache: <hash of a folder's files>.json


class RemoteCodeError(UserError, ValueError):
  """A tokenizer shipped as code, loaded without --trust_remote_code."""


class TokenizerConfigError(UserError, ValueError):
  """A tokenizer_config.json that is not one JSON object of settings, or whose `auto_map` is malformed."""


# A class a tokenizer folder ships as code, as transformers finds it there: `module.Class`, the module a file of the
# folder (transformers' dynamic_module_utils.get_class_from_dynamic_module splits the reference at its one dot, and
# reads "org/repo--module.Class" from another repository).
IN_FOLDER_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


def tokenizer_settings(directory: str) -> dict:
  """The folder's tokenizer_config.json as a mapping ({} without one); one that is not a JSON object is refused
  naming the file (transformers would fail on it with an AttributeError)."""
  path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      settings = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise TokenizerConfigError(f"{path} is not JSON ({e}): a tokenizer's settings are one JSON object") from None
  if not isinstance(settings, dict):
    raise TokenizerConfigError(f"{path} holds a JSON {type(settings).__name__}, not an object: a tokenizer's "
                               "settings are one JSON object of names and values")
  return settings


def remote_code_files(directory: str) -> list[str]:
  """The Python files a tokenizer's tokenizer_config.json `auto_map` names ("tokenization_chatglm.ChatGLM4Tokenizer"
  -> tokenization_chatglm.py; transformers' legacy spelling, a list [slow, fast], too); empty for tokenizers
  transformers ships. Any class an `auto_map` there or in the folder's config.json names (transformers reads that
  one's too: the config class, a tokenizer the settings name none of) anywhere but in a file of this folder (a path,
  another repository) is refused: such code is never run, trusted or not."""
  path = os.path.join(directory, "tokenizer_config.json")
  auto_map = tokenizer_settings(directory).get("auto_map") or {}
  if not isinstance(auto_map, (dict, list)):
    raise TokenizerConfigError(f"{path}: auto_map is a {type(auto_map).__name__}, not an object of class names")
  entries = list(auto_map.items()) if isinstance(auto_map, dict) else [("AutoTokenizer", auto_map)]
  tokenizer = _classes(path, "AutoTokenizer", dict(entries).get("AutoTokenizer"))
  _in_folder(path, directory, [c for key, v in entries for c in _classes(path, key, v)])
  model_path = os.path.join(directory, "config.json")
  model_map = json_object(model_path).get("auto_map")
  if isinstance(model_map, dict):  # the model's own file, read for its classes only
    _in_folder(model_path, directory, [c for key, v in model_map.items() for c in _classes(model_path, key, v)])
    tokenizer = tokenizer or _classes(model_path, "AutoTokenizer", model_map.get("AutoTokenizer"))
  return sorted({f"{entry.split('.')[0]}.py" for entry in tokenizer if entry})


def _classes(path: str, key: str, value) -> list[str]:
  """The class references of one `auto_map` entry: "module.Class", or a list of them and nulls."""
  classes = [value] if isinstance(value, str) else [] if value is None else value
  if not isinstance(classes, list) or not all(c is None or isinstance(c, str) for c in classes):
    raise TokenizerConfigError(f"{path}: auto_map.{key} is {json.dumps(value)}, not class names (\"module.Class\", "
                               "or a list of them and null)")
  return [c for c in classes if c]


def _in_folder(path: str, directory: str, classes: list[str]) -> None:
  for entry in classes:
    if not IN_FOLDER_CLASS.fullmatch(entry):
      raise RemoteCodeError(f"{path}: auto_map names {entry!r}, which is not a module of the tokenizer's folder "
                            f"{directory} (module.Class): code outside the folder is never run, with "
                            "--trust_remote_code or without")


def json_object(path: str) -> dict:
  """The JSON object in `path`; {} when there is none: a model folder's config.json, read beside its tokenizer for
  what it says of the tokenizer's model, is the model's to read and refuse."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, ValueError):
    return {}
  return value if isinstance(value, dict) else {}


def check_trusted(directory: str, trust_remote_code: bool, whose: str | None = None) -> list[str]:
  """The folder's tokenizer code files; refused unless trusted. `whose` names the tokenizer in the message
  (default: the folder)."""
  code = remote_code_files(directory)
  if code and not trust_remote_code:
    raise RemoteCodeError(f"{whose or f'the text tokenizer in {directory}'} is code ({', '.join(code)}, named by its "
                          "tokenizer_config.json auto_map): read it, then pass --trust_remote_code")
  return code


def load(directory: str, trust_remote_code: bool = False, whose: str | None = None):
  """transformers' AutoTokenizer from a local folder, its code run only when trusted. Loaded once a process while
  the folder's files stay as they are (a build of every task and modality reads one folder a dozen times, ~0.5 s
  each for Qwen2.5's); callers share it and never change it."""
  check_trusted(directory, trust_remote_code, whose)
  return _load_unchanged(directory, trust_remote_code, _files_state(directory))


def _files_state(directory: str) -> tuple:
  """Name, size and modification time of each file in the folder: another tokenizer written there differs. A folder
  that cannot be listed has none, and transformers' own error says what is missing."""
  try:
    with os.scandir(directory) as entries:
      return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file()))
  except OSError:
    return ()


@functools.lru_cache(maxsize=8)
def _load_unchanged(directory: str, trust_remote_code: bool, files_state: tuple):
  from transformers import AutoTokenizer

  del files_state  # the cache key only
  return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)


def identity(tokenizer) -> dict:
  """What tells two text tokenizers apart: a hash of the vocabulary in id order (plus its size and class)."""
  vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
  digest = hashlib.sha256("\n".join(token for token, _ in vocab).encode()).hexdigest()[:16]
  return {"class": type(tokenizer).__name__, "name_or_path": os.path.basename(str(tokenizer.name_or_path)),
          "size": len(tokenizer), "vocab_sha": digest}


def folder_identity(directory: str, trust_remote_code: bool = False, whose: str | None = None) -> dict:
  """`identity(load(directory))`, remembered in the project's cache under a hash of the folder's files and of the
  versions of transformers and tokenizers that read them: the same files read by the same code give the same
  vocabulary. Asked again, nothing is imported or read but the files (an evaluation's start: importing transformers,
  which imports torch, and reading Qwen2.5's tokenizer take ~4 s on a 2-core CPU). A remembered identity that cannot
  be read is worked out again; one that cannot be written only costs the next command that time."""
  check_trusted(directory, trust_remote_code, whose)
  try:
    path = os.path.join(cache.cache_dir(), IDENTITIES, f"{_contents_hash(directory)}.json")
  except OSError:  # a folder that cannot be read: transformers' own error says what is missing
    path = None
  known = _read_identity(path) if path else None
  if known is None:
    read = identity(load(directory, trust_remote_code, whose))
    known = {key: read[key] for key in ("class", "size", "vocab_sha")}
    if path is not None:
      try:
        write_atomic(path, json.dumps(known).encode())
      except OutputError:
        pass
  return {**known, "name_or_path": os.path.basename(os.path.normpath(directory))}


def _read_identity(path: str) -> dict | None:
  try:
    with open(path) as f:
      known = json.load(f)
  except (OSError, ValueError):
    return None
  return known if isinstance(known, dict) and set(known) == {"class", "size", "vocab_sha"} else None


def _contents_hash(directory: str) -> str:
  """sha256 of the folder's files (names and bytes, in name order) and of the libraries' versions that read them."""
  digest = hashlib.sha256()
  for library in ("transformers", "tokenizers"):
    digest.update(f"{library}=={importlib.metadata.version(library)}\0".encode())
  with os.scandir(directory) as entries:
    files = sorted(e.name for e in entries if e.is_file())
  for name in files:
    with open(os.path.join(directory, name), "rb") as f:
      digest.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
  return digest.hexdigest()
