"""Data and model agree, or the run is refused before scoring: the evaluator's placeholder check, the pre-flight
(`s2sjax.check`) smoke score that catches audio never reaching the model, and remote-code tokenizers (GLM-4 ships
`ChatGLM4Tokenizer` as tokenization_chatglm.py + tokenizer.model, named by tokenizer_config.json's auto_map)."""

import json
import os

import numpy as np
import pytest

from checkpoints_conversion.convert import convert
from s2sjax.scoring import preflight
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.data.builds import BuildMetadata
from s2sjax.scoring.evaluator import EvalError, check_fit
from s2sjax.data.packing import Item, RowShape, pack
from s2sjax.data.spec import AudioIds, load_spec, spec_from_dict
from s2sjax.data.task_data import TaskData
from s2sjax.data.text_tokenizer import RemoteCodeError
from tests.hf_models import SMALL_HEADS, baichuan_audio_checkpoint, chatglm_checkpoint, tiny_model

SIZES, PLACEHOLDER = (16, 8, 8), 500
SPEC = dict(load_spec("baichuan_audio").as_dict(), codebook_sizes=list(SIZES))


@pytest.fixture(scope="module")
def baichuan_ckpt(tmp_path_factory):
  root = tmp_path_factory.mktemp("baichuan")
  source, _, _ = baichuan_audio_checkpoint(tiny_model("qwen2"), str(root / "src"), SIZES, PLACEHOLDER, release=True)
  convert(source, str(root / "ckpt"))
  return str(root / "ckpt")


def _speech_data(placeholder: int) -> TaskData:
  """One spoken prefix of 40 frames laid at `placeholder`, and two text candidates, packed as the builder does."""
  rng = np.random.default_rng(3)
  prefix = np.concatenate([rng.integers(0, 400, 5), np.full(40, placeholder), rng.integers(0, 400, 2)])
  codes = np.full((len(prefix), len(SIZES)), -1)
  codes[5:45] = np.stack([rng.integers(0, n, 40) for n in SIZES], -1)
  shape = RowShape.for_length(128, num_codebooks=len(SIZES))
  rows, _ = pack([Item(prefix.astype(np.int32), (rng.integers(0, 400, 6), rng.integers(0, 400, 4)),
                       codes.astype(np.int32))], shape)
  metadata = BuildMetadata("scmmlu", "s2t", spec_from_dict(SPEC), shape,
                           tokenizer={"name_or_path": "tiny", "size": 512, "vocab_sha": "0" * 16},
                           audio_ids=AudioIds(start=None, end=None, placeholder=placeholder, unit_ids=None))
  return TaskData("scmmlu", "s2t", rows, metadata)


def test_the_evaluator_refuses_a_placeholder_the_checkpoint_does_not_read(baichuan_ckpt):
  config = checkpoint.load_config(baichuan_ckpt)
  check_fit(config, _speech_data(PLACEHOLDER))
  with pytest.raises(EvalError, match=r"data lays audio at placeholder id 501 .*'<audio_pad_baichuan>'.*"
                                      r"checkpoint's config reads codes at audio_placeholder_id 500"):
    check_fit(config, _speech_data(PLACEHOLDER + 1))


@pytest.mark.slow
def test_smoke_score_catches_audio_that_does_not_reach_the_model(baichuan_ckpt):
  config, params = checkpoint.load_config(baichuan_ckpt), checkpoint.load_params(baichuan_ckpt)
  good = {v.check: v for v in preflight.smoke_verdicts(config, params, _speech_data(PLACEHOLDER))}
  assert good["smoke score"].ok and good["audio reaches the model"].ok
  wrong = {v.check: v for v in preflight.smoke_verdicts(config, params, _speech_data(PLACEHOLDER + 1))}
  assert wrong["smoke score"].ok  # the text NLL alone looks fine ...
  assert not wrong["audio reaches the model"].ok  # ... but the codes never reached the decoder
  data = {v.check: v for v in preflight.data_verdicts(_speech_data(PLACEHOLDER + 1), config, None)}
  assert not data["check_fit"].ok and data["audio code range"].ok


def test_check_refuses_a_source_config_converted_before_its_switch_was_refused(baichuan_ckpt):
  manifest = checkpoint.load_manifest(baichuan_ckpt)
  assert preflight.config_verdict(manifest).ok
  alibi = dict(manifest, source_config=dict(manifest["source_config"], position_embedding_type="alibi"))
  verdict = preflight.config_verdict(alibi)
  assert not verdict.ok and "position_embedding_type='alibi'" in verdict.detail


TOKENS = ["<pad>", "<|endoftext|>", "<|begin_of_audio|>", "<|end_of_audio|>"] + [chr(c) for c in range(97, 123)]
# A tokenizer shipped as code, the way GLM-4's is: a PreTrainedTokenizer subclass reading tokenizer.model.
TOKENIZER_CODE = '''
import os
from transformers import PreTrainedTokenizer


class ToyGlmTokenizer(PreTrainedTokenizer):
  vocab_files_names = {"vocab_file": "tokenizer.model"}

  def __init__(self, vocab_file, **kwargs):
    with open(vocab_file) as f:
      self.tokens = f.read().split("\\n")
    self.ids = {t: i for i, t in enumerate(self.tokens)}
    super().__init__(**kwargs)

  @property
  def vocab_size(self):
    return len(self.tokens)

  def get_vocab(self):
    return dict(self.ids)

  def _tokenize(self, text):
    return [c for c in text if c in self.ids]

  def _convert_token_to_id(self, token):
    return self.ids[token]

  def _convert_id_to_token(self, index):
    return self.tokens[index]

  def save_vocabulary(self, save_directory, filename_prefix=None):
    path = os.path.join(save_directory, "tokenizer.model")
    with open(path, "w") as f:
      f.write("\\n".join(self.tokens))
    return (path,)
'''


def _remote_code_tokenizer(directory):
  with open(os.path.join(directory, "tokenization_toyglm.py"), "w") as f:
    f.write(TOKENIZER_CODE)
  with open(os.path.join(directory, "tokenizer.model"), "w") as f:
    f.write("\n".join(TOKENS))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "ToyGlmTokenizer", "eos_token": "<|endoftext|>", "pad_token": "<pad>",
               "auto_map": {"AutoTokenizer": ["tokenization_toyglm.ToyGlmTokenizer", None]}}, f)


def test_remote_code_tokenizer_needs_the_flag_and_travels_with_the_checkpoint(tmp_path):
  from transformers import AutoTokenizer

  source = chatglm_checkpoint(tiny_model("glm", num_key_value_heads=SMALL_HEADS), str(tmp_path / "glm"),
                              multi_query=False)
  _remote_code_tokenizer(source)
  with pytest.raises(RemoteCodeError, match=r"tokenizer is code \(tokenization_toyglm\.py.*pass "
                                            r"--trust_remote_code"):
    convert(source, str(tmp_path / "refused"))
  assert not os.path.exists(tmp_path / "refused")
  manifest = convert(source, str(tmp_path / "ckpt"), trust_remote_code=True)
  assert manifest["trust_remote_code"] is True
  assert manifest["tokenizer"]["remote_code"] == ["tokenization_toyglm.py"]
  assert manifest["tokenizer"]["class"] == "ToyGlmTokenizer" and manifest["tokenizer"]["size"] == len(TOKENS)
  assert sorted(os.listdir(tmp_path / "ckpt" / "tokenizer")) == [
    "tokenization_toyglm.py", "tokenizer.model", "tokenizer_config.json"]
  copied = checkpoint.load_tokenizer(str(tmp_path / "ckpt"), trust_remote_code=True)
  original = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
  assert copied("hello")["input_ids"] == original("hello")["input_ids"] == [11, 8, 15, 15, 18]
  assert copied.get_vocab()["<|begin_of_audio|>"] == 2
  verdicts = {v.check: v for v in preflight.run(checkpoint.open(str(tmp_path / "ckpt")), trust_remote_code=True, spec="glm4_voice")}
  assert verdicts["config"].ok and verdicts["tokenizer"].ok
  assert not verdicts["spec tokens"].ok and "'<|audio_0|>' is not in the tokenizer" in verdicts["spec tokens"].detail
  untrusted = {v.check: v for v in preflight.run(checkpoint.open(str(tmp_path / "ckpt")))}
  assert not untrusted["tokenizer"].ok and "--trust_remote_code" in untrusted["tokenizer"].detail


@pytest.mark.slow
def test_the_pre_flight_without_flags_checks_the_embedded_default_and_says_what_it_left_unchecked():
  import subprocess
  import sys

  from s2sjax.runtime import cache
  from s2sjax.scoring import default_model

  done = subprocess.run([sys.executable, "-m", "s2sjax.check"], capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout + done.stderr[-3000:]
  converted = os.path.join(cache.cache_dir(), default_model.CHECKPOINT_NAME)
  assert done.stdout.startswith(f"checked {converted} (the embedded default)")
  assert "data: not checked (give --data_dir/--task/--modality)" in done.stdout
  # the demo spec's units: past SmolLM2's 49,152 tokens, given untrained rows for the default alone
  unit_ids = next(line for line in done.stdout.splitlines() if "unit ids" in line)
  assert unit_ids.startswith("ok") and "49152..49407 (256 ids) against 49408 embedding rows (256 of them untrained" \
                                       in unit_ids
  assert len([line for line in done.stdout.splitlines() if line.startswith("ok  ")]) == 4
  assert "ok    stored parameters  every parameter file there and whole" in done.stdout
  assert done.stdout.strip().splitlines()[-1] == "all checks passed"
