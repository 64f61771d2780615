"""An instruct model's own prompt (the `chat` spec key): GLM-4-Voice-9B's web_demo.py turns around the prefix, the
candidate as the assistant's reply, laid token for token as the release's demo writes them."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from s2sjax.data.spec import SpecError, load_spec, spec_from_dict
from tasks.audio.precomputed import PrecomputedTokenizer
from tasks.build import QuestionEncoder
from tasks.release import Question

SPEECH_SYSTEM = ("User will provide you with a speech instruction. Do it step by step. First, think about the "
                 "instruction and respond in a interleaved manner, with 13 text token followed by 26 audio tokens. ")
TEXT_SYSTEM = SPEECH_SYSTEM.replace("speech instruction", "text instruction").rstrip()


@pytest.fixture(scope="module")
def glm_like_tokenizer(qwen_tokenizer_dir):
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  tokenizer.add_tokens(["<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_audio|>", "<|end_of_audio|>"]
                       + [f"<|audio_{k}|>" for k in range(16384)], special_tokens=True)
  return tokenizer


def question(tmp_path):
  wav = tmp_path / "7.wav"
  wav.write_bytes(b"")  # precomputed codes are read by uttid; the wav is never decoded
  return Question(id="7", language="en", uttids=("7", "7"), prefixes=("Tom went out.",) * 2, audio_paths=(str(wav),) * 2,
                  candidates=("He came back.", "Fish sang."), correct=0)


def test_spoken_prefix_sits_in_the_user_turn_and_the_candidate_is_the_reply(tmp_path, glm_like_tokenizer):
  codes = tmp_path / "codes"
  codes.mkdir()
  np.save(codes / "7.npy", np.array([[3], [16383], [5]]))
  encoder = QuestionEncoder(load_spec("glm4_voice_chat"), "s2t", glm_like_tokenizer,
                            PrecomputedTokenizer(str(codes), (16384,)))
  ids, laid_codes, _ = encoder.prefix(question(tmp_path), 0)
  assert laid_codes is None
  assert glm_like_tokenizer.decode(ids) == (f"<|system|>\n{SPEECH_SYSTEM}<|user|>\n<|begin_of_audio|><|audio_3|>"
                                            "<|audio_16383|><|audio_5|><|end_of_audio|><|assistant|>"
                                            "streaming_transcription\n")
  candidate, _ = encoder.candidate(question(tmp_path), 0)
  assert glm_like_tokenizer.decode(candidate) == "He came back."


def test_written_prefix_takes_the_text_turn_and_no_separator(tmp_path, glm_like_tokenizer):
  encoder = QuestionEncoder(load_spec("glm4_voice_chat"), "t2t", glm_like_tokenizer, None)
  ids, _, _ = encoder.prefix(question(tmp_path), 1)
  assert glm_like_tokenizer.decode(ids) == (f"<|system|>\n{TEXT_SYSTEM}<|user|>\nTom went out.<|assistant|>"
                                            "streaming_transcription\n")
  candidate, _ = encoder.candidate(question(tmp_path), 1)
  assert glm_like_tokenizer.decode(candidate) == "Fish sang."


def test_a_chat_needs_every_turn():
  fields = {"name": "x", "audio_mode": "none", "chat": {"speech": "a", "text": "b"}}
  with pytest.raises(SpecError, match="chat needs exactly the keys speech, text, reply"):
    spec_from_dict(fields)
