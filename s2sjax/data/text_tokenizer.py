"""Text tokenizers from local folders, and the one rule for tokenizers shipped as code.

GLM-4-Voice's tokenizer is a Python class in its folder (`tokenization_chatglm.py`, named by tokenizer_config.json's
`auto_map`): transformers runs that code only with `trust_remote_code`, and so does every s2sjax command. Asked to
load one without it, each refuses with the same words, naming the folder and the flag, before anything is written.
"""

from __future__ import annotations

import functools
import json
import os
from s2sjax.runtime.errors import UserError


class RemoteCodeError(UserError, ValueError):
  """A tokenizer shipped as code, loaded without --trust_remote_code."""


def remote_code_files(directory: str) -> list[str]:
  """The Python files a tokenizer's tokenizer_config.json `auto_map` names ("tokenization_chatglm.ChatGLM4Tokenizer"
  -> tokenization_chatglm.py); empty for tokenizers transformers ships."""
  path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    auto_map = json.load(f).get("auto_map") or {}
  classes = auto_map.get("AutoTokenizer") or []
  classes = [classes] if isinstance(classes, str) else classes
  # An entry may name another repository ("org/repo--module.Class"): only this folder's files count.
  return sorted({f"{c.split('--')[-1].rsplit('.', 1)[0]}.py" for c in classes if c})


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
