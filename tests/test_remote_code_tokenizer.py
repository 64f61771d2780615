"""Issue 13: a tiny GLM-4 checkpoint in THUDM's ChatGLM layout with a remote-code tokenizer folder converts, builds
data and evaluates end to end with --trust_remote_code, and each of the three steps refuses it without the flag,
saying to pass it.

The tokenizer folder is written here the way GLM-4's ships: `tokenizer_config.json` whose `auto_map` names
`tokenization_chatglm.ChatGLM4Tokenizer`, the code file, and its vocabulary `tokenizer.model`. The interface restated
from GLM-4's `tokenization_chatglm.py` (read, not copied; glm-4-9b-chat's, as copied in
zhaoyukoon/damoxing_fenci_gongji@dd7b137 `glm-4-9b-chat/tokenization_chatglm.py`, which adds one debug print):
  * line 11-12: `class ChatGLM4Tokenizer(PreTrainedTokenizer)` with `vocab_files_names = {"vocab_file":
    "tokenizer.model"}`; line 15: `__init__(vocab_file, ...)` reads the ranks from it before `super().__init__`;
  * line 56: `vocab_size` is the size of those ranks; lines 59-63: `get_vocab()` is the ranks plus
    `added_tokens_encoder` — the special tokens ([gMASK], <sop>, and in GLM-4-Voice <|begin_of_audio|>,
    <|end_of_audio|>, <|audio_0|>..) are added tokens of tokenizer_config.json, with ids past the ranks;
  * line 85: `_tokenize(text)` gives the pieces (tiktoken BPE there), line 92 `_convert_token_to_id`, line 96
    `_convert_id_to_token`;
  * line 100: `save_vocabulary` copies `tokenizer.model` into the save folder;
  * lines 128-129 and 143-166: `build_inputs_with_special_tokens` puts `[gMASK] <sop>` before a single sequence,
    so `tokenizer(text)` (special tokens on) opens with them and `add_special_tokens=False` does not.
The toy here is character-level over printable ASCII (no tiktoken) and keeps every one of those behaviours.

The ids the reference scores are written out from those rules and s2sjax/data/spec.py's templates, not taken from the
builder or the tokenizer; the reference is a naive transformers forward of the same Glm weights.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
import yaml

from checkpoints_conversion.convert import convert
from s2sjax.data import task_registry
from s2sjax.commands.eval import EvalConfig, run
from s2sjax.scoring.evaluator import EvalError, ScoringOptions
from s2sjax.data.text_tokenizer import RemoteCodeError
from tasks.preparation import prepare
from tasks.sample import RELEASE_DIR
from tests.hf_models import chatglm_checkpoint, tiny_model

ALPHABET = [chr(c) for c in range(32, 127)]  # tokenizer.model: one piece per line, rank = line number
SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|begin_of_audio|>",
           "<|end_of_audio|>"]
UNITS = 64  # <|audio_0|> .. <|audio_63|>: the spec's codebook size
SPECIAL_ID = {token: len(ALPHABET) + i for i, token in enumerate(SPECIAL)}
AUDIO_0 = len(ALPHABET) + len(SPECIAL)
VOCAB = AUDIO_0 + UNITS  # 167 tokens, within the tiny model's 512 rows
GMASK, SOP, BOA, EOA = (SPECIAL_ID[t] for t in ("[gMASK]", "<sop>", "<|begin_of_audio|>", "<|end_of_audio|>"))
INSTRUCTION = "Below is a segment of alternating speech and text content: "  # S2SBench's s2t_infer_ppl.py
ROW = 512
MODALITIES = ("t2t", "s2t", "t2s", "s2s")

TOKENIZER_CODE = '''"""A character-level stand-in for GLM-4's ChatGLM4Tokenizer (same interface, no tiktoken)."""
import os

from transformers import PreTrainedTokenizer


class ChatGLM4Tokenizer(PreTrainedTokenizer):
  vocab_files_names = {"vocab_file": "tokenizer.model"}
  model_input_names = ["input_ids", "attention_mask", "position_ids"]

  def __init__(self, vocab_file, **kwargs):
    self.vocab_file = vocab_file
    with open(vocab_file, encoding="utf-8") as f:
      self.pieces = [line[:-1] for line in f]
    self.ranks = {piece: rank for rank, piece in enumerate(self.pieces)}
    super().__init__(**kwargs)

  @property
  def vocab_size(self):
    return len(self.pieces)

  def get_vocab(self):
    vocab = dict(self.ranks)
    vocab.update(self.added_tokens_encoder)
    return vocab

  def _tokenize(self, text, **kwargs):
    return list(text)

  def _convert_token_to_id(self, token):
    return self.ranks[token]

  def _convert_id_to_token(self, index):
    return self.pieces[index]

  def convert_tokens_to_string(self, tokens):
    return "".join(tokens)

  def save_vocabulary(self, save_directory, filename_prefix=None):
    path = os.path.join(save_directory, self.vocab_files_names["vocab_file"])
    with open(self.vocab_file, "rb") as source, open(path, "wb") as target:
      target.write(source.read())
    return (path,)

  def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
    prefix = self.convert_tokens_to_ids(["[gMASK]", "<sop>"])
    return prefix + token_ids_0 + ([] if token_ids_1 is None else token_ids_1)
'''


def _tokenizer_folder(directory: str) -> None:
  """GLM-4-Voice's tokenizer files: the code, its vocabulary, and tokenizer_config.json naming the class by auto_map,
  with the special and audio tokens as added tokens after the ranks."""
  with open(os.path.join(directory, "tokenization_chatglm.py"), "w") as f:
    f.write(TOKENIZER_CODE)
  with open(os.path.join(directory, "tokenizer.model"), "w", encoding="utf-8") as f:
    f.writelines(piece + "\n" for piece in ALPHABET)
  added = SPECIAL + [f"<|audio_{k}|>" for k in range(UNITS)]
  entry = lambda token: {"content": token, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                         "single_word": False}
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "ChatGLM4Tokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "padding_side": "left", "clean_up_tokenization_spaces": False,
               "added_tokens_decoder": {str(len(ALPHABET) + i): entry(t) for i, t in enumerate(added)},
               "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLM4Tokenizer", None]}}, f)


STORIES = [("Tom left his bike out in the rain.", "It rusted.", "It grew wings."),
           ("Ann baked bread for her friends.", "They ate it all.", "The oven sang."),
           ("The dog waited at the door.", "Its owner came home.", "The door flew away.")]


def _release(root: str) -> str:
  """sStoryCloze in the release layout: lines 2k (right ending) and 2k+1 (wrong), a wav per prefix and ending
  (the precomputed audio tokenizer reads codes, not these)."""
  record = task_registry.get("sstorycloze")
  wav = os.path.join(RELEASE_DIR, record.release_audio_dir, "0.wav")
  for folder in (record.release_audio_dir, record.release_candidate_audio_dir):
    os.makedirs(os.path.join(root, folder))
  lines = [{"uttid": 2 * k + c, "first": first, "last": endings[c]}
           for k, (first, *endings) in enumerate(STORIES) for c in range(2)]
  with open(os.path.join(root, record.release_jsonl), "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  for line in lines:
    for folder in (record.release_audio_dir, record.release_candidate_audio_dir):
      shutil.copy(wav, os.path.join(root, folder, f"{line['uttid']}.wav"))
  return root


def _codes(directory: str) -> dict[str, np.ndarray]:
  """Precomputed GLM-4-Voice-style codes [T, 1]: `<uttid>.npy` per prefix (a story's two lines share theirs) and
  `candidates/<uttid>.npy` per spoken ending."""
  rng = np.random.default_rng(13)
  os.makedirs(os.path.join(directory, "candidates"))
  codes = {}
  for k in range(len(STORIES)):
    prefix = rng.integers(0, UNITS, (int(rng.integers(15, 40)), 1))
    for uttid in (2 * k, 2 * k + 1):
      codes[str(uttid)] = prefix
      codes[f"candidates/{uttid}"] = rng.integers(0, UNITS, (int(rng.integers(5, 20)), 1))
  for name, value in codes.items():
    np.save(os.path.join(directory, f"{name}.npy"), value)
  return codes


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
  root = tmp_path_factory.mktemp("remote_code")
  model = tiny_model("glm")
  assert model.config.vocab_size >= VOCAB
  source = chatglm_checkpoint(model, str(root / "glm-4-voice-tiny"), multi_query=True)
  _tokenizer_folder(source)
  spec = str(root / "glm4_voice_tiny.yaml")
  with open(spec, "w") as f:  # glm4_voice's spec with the tiny codebook
    yaml.safe_dump({"name": "glm4_voice_tiny", "audio_mode": "extended_vocab",
                    "audio_tokenizer": {"type": "precomputed"}, "codebook_sizes": [UNITS],
                    "unit_token": "<|audio_{}|>", "start_token": "<|begin_of_audio|>",
                    "end_token": "<|end_of_audio|>"}, f)
  codes_dir = str(root / "codes")
  return {"root": root, "model": model, "source": source, "spec": spec, "release": _release(str(root / "release")),
          "codes_dir": codes_dir, "codes": _codes(codes_dir)}


def _text(s: str) -> list[int]:
  return [ALPHABET.index(ch) for ch in s]


def _units(codes: np.ndarray) -> list[int]:
  return [AUDIO_0 + int(k) for k in codes[:, 0]]


def _expected(codes: dict, modality: str) -> dict[str, tuple[list[int], list[int]]]:
  """Per candidate uttid: (the ids before the scored ones, the scored ids), by s2sjax/data/spec.py's templates with
  GLM-4's `[gMASK] <sop>` wherever the tokenizer adds its special tokens (prefixes, never candidates)."""
  out = {}
  for k, (first, *endings) in enumerate(STORIES):
    for c, last in enumerate(endings):
      uttid = str(2 * k + c)
      prefix_audio, spoken = _units(codes[uttid]), _units(codes[f"candidates/{uttid}"])
      out[uttid] = {
        "t2t": ([GMASK, SOP] + _text(first), _text(" " + last)),
        "s2t": ([GMASK, SOP] + _text(INSTRUCTION) + [BOA] + prefix_audio + [EOA], _text(last)),
        "t2s": ([GMASK, SOP] + _text(INSTRUCTION + first) + [BOA], spoken),
        "s2s": ([GMASK, SOP] + _text(INSTRUCTION) + [BOA] + prefix_audio, spoken),
      }[modality]
  return out


def _naive_nll(model, prefix: list[int], scored: list[int]) -> float:
  with torch.no_grad():
    log_probs = torch.log_softmax(model(torch.tensor([prefix + scored])).logits[0].float(), -1)
  return -sum(float(log_probs[len(prefix) - 1 + j, t]) for j, t in enumerate(scored))


def _eval_config(glm, ckpt: str, output: str, trust: bool, modalities=MODALITIES) -> EvalConfig:
  return EvalConfig(tasks=("sstorycloze",), modalities=modalities, checkpoints=ckpt, spec=glm["spec"],
                    data_dir=str(glm["root"] / "data"), output_dir=str(glm["root"] / output), row_length=ROW,
                    scoring=ScoringOptions(batch_size=8), trust_remote_code=trust)


@pytest.mark.slow
def test_remote_code_glm4_converts_builds_and_evaluates_with_the_flag(glm):
  from transformers import AutoTokenizer

  ckpt = str(glm["root"] / "ckpt")
  manifest = convert(glm["source"], ckpt, trust_remote_code=True)
  assert manifest["source_model_type"] == "chatglm" and manifest["trust_remote_code"] is True
  assert manifest["tokenizer"]["class"] == "ChatGLM4Tokenizer" and manifest["tokenizer"]["size"] == VOCAB
  assert manifest["tokenizer"]["remote_code"] == ["tokenization_chatglm.py"]
  assert sorted(os.listdir(os.path.join(ckpt, "tokenizer"))) == [
    "tokenization_chatglm.py", "tokenizer.model", "tokenizer_config.json"]
  tokenizer_dir = os.path.join(ckpt, "tokenizer")  # the copy beside the checkpoint, as the README builds with
  tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
  assert tokenizer("Hi")["input_ids"] == [GMASK, SOP] + _text("Hi")  # the remote code's own special tokens ran

  for modality in MODALITIES:
    metadata = prepare("sstorycloze", glm["spec"], modality, ROW, str(glm["root"] / "data"),
                       manual_dir=glm["release"], tokenizer_dir=tokenizer_dir, audio_tokenizer_dir=glm["codes_dir"],
                       trust_remote_code=True)
    assert metadata.tokenizer["class"] == "ChatGLM4Tokenizer" and metadata.tokenizer["size"] == VOCAB
    assert metadata.report["questions"] == len(STORIES)
    if modality != "t2t":
      assert metadata.audio_ids.start == BOA and metadata.audio_ids.end == EOA
      assert metadata.audio_ids.unit_ids == list(range(AUDIO_0, AUDIO_0 + UNITS))

  run(_eval_config(glm, ckpt, "out", trust=True))
  for modality in MODALITIES:
    with open(glm["root"] / "out" / "ckpt" / f"sstorycloze-{modality}.scores.jsonl") as f:
      lines = [json.loads(line) for line in f]
    expected = _expected(glm["codes"], modality)
    assert sorted(line["uttid"] for line in lines) == sorted(expected), modality
    for line in lines:
      prefix, scored = expected[line["uttid"]]
      assert line["n_tokens"] == len(scored), (modality, line["uttid"])
      reference = _naive_nll(glm["model"], prefix, scored)
      assert abs(line["nll_sum"] - reference) / len(scored) <= 1e-4, (modality, line["uttid"], line["nll_sum"],
                                                                      reference)


def test_convert_refuses_remote_code_without_the_flag(glm):
  with pytest.raises(RemoteCodeError, match=r"'s tokenizer is code \(tokenization_chatglm\.py, named by its "
                                            r"tokenizer_config\.json auto_map\): read it, then pass --trust_remote_code"):
    convert(glm["source"], str(glm["root"] / "refused"))
  assert not os.path.exists(glm["root"] / "refused")


def test_prepare_refuses_remote_code_without_the_flag(glm):
  with pytest.raises(RemoteCodeError, match=r"the text tokenizer in .* is code \(tokenization_chatglm\.py.*read it, "
                                            r"then pass --trust_remote_code"):
    prepare("sstorycloze", glm["spec"], "s2t", ROW, str(glm["root"] / "refused_data"), manual_dir=glm["release"],
            tokenizer_dir=glm["source"], audio_tokenizer_dir=glm["codes_dir"])
  assert not os.path.exists(glm["root"] / "refused_data")  # refused before TFDS wrote anything


def test_eval_refuses_a_checkpoint_converted_with_remote_code_without_the_flag(glm):
  ckpt = str(glm["root"] / "ckpt_for_refusal")
  convert(glm["source"], ckpt, trust_remote_code=True)
  # the data is there (built with the flag): only the checkpoint's tokenizer stands in the way
  prepare("sstorycloze", glm["spec"], "t2t", ROW, str(glm["root"] / "data"), manual_dir=glm["release"],
          tokenizer_dir=os.path.join(ckpt, "tokenizer"), trust_remote_code=True)
  with pytest.raises(EvalError, match=r"tokenizer is remote code \(converted with --trust_remote_code\): read it, "
                                      r"then pass --trust_remote_code"):
    run(_eval_config(glm, ckpt, "refused_out", trust=False, modalities=("t2t",)))
  assert not os.path.exists(glm["root"] / "refused_out" / "ckpt_for_refusal")
