"""Each way audio enters a model has its own encoder (tasks/encoders.py), and `QuestionEncoder(...)` builds the one
a spec and modality call for."""

import pytest
from transformers import AutoTokenizer

from s2sjax.data.spec import SpecError, load_spec
from tasks.audio.mel_kmeans import MelKmeansTokenizer
from tasks.encoders import (CodebookEncoder, QuestionEncoder, StreamEncoder, TextEncoder, UnitEncoder,
                            encoder_class)
from tasks.sample import MEL_KMEANS_CODEBOOK


@pytest.mark.parametrize("spec, modality, expected", [
  ("demo", "t2t", TextEncoder), ("demo", "s2t", UnitEncoder), ("demo", "s2s", UnitEncoder),
  ("demo_tables", "t2t", TextEncoder), ("demo_tables", "s2t", CodebookEncoder), ("qwen2.5", "t2t", TextEncoder),
  ("twist", "s2s", UnitEncoder), ("moshi", "t2t", StreamEncoder), ("moshi", "s2s", StreamEncoder),
])
def test_the_spec_audio_mode_picks_the_encoder(spec, modality, expected):
  assert encoder_class(load_spec(spec), modality) is expected


def test_question_encoder_builds_the_picked_encoder(qwen_tokenizer_dir):
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  audio = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK, False)
  text = QuestionEncoder(load_spec("demo_tables"), "t2t", tokenizer, None)
  tables = QuestionEncoder(load_spec("demo_tables"), "s2t", tokenizer, audio)
  assert type(text) is TextEncoder and text.ids is None and text.layout is None
  assert type(tables) is CodebookEncoder and tables.ids.placeholder == tokenizer.convert_tokens_to_ids("<|endoftext|>")
  with pytest.raises(SpecError, match="spec qwen2.5 is text-only"):  # a text-only spec asked for audio, by name
    QuestionEncoder(load_spec("qwen2.5"), "s2t", tokenizer, audio)
