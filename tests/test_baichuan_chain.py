"""Baichuan-Audio's S→T path end to end, wav to per-candidate NLL, against what upstream's own code computed.

The oracle `baichuan_llm` is a miniature release: its `OmniForCausalLM.forward` log-probs were computed on ids
that open like an S→T item (bos, six text ids, the audio start, 16 placeholders carrying wave 0's codes, the audio
end, then four text ids), and feeding the mels instead of the codes gave the same log-probs. So: wave 0 as a wav
-> the JAX tokenizer reading the release folder -> a row laid by the builder with the baichuan_audio templates
(the six text ids as the instruction) -> the release converted as a user converts it -> the scoring step's NLL
of those four ids equals upstream's at their positions. Upstream is the judge of every link at once.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

ORACLES = Path(__file__).resolve().parents[1].parent / "shared" / "upstream-oracles"
RELEASE = ORACLES / "baichuan_llm"
pytestmark = pytest.mark.skipif(not RELEASE.is_dir(), reason="../shared/upstream-oracles is absent")

INSTRUCTION = slice(1, 7)  # the oracle's six text ids after bos
AUDIO = slice(8, 24)  # its 16 placeholders (wave 0's codes); 7 and 24 are the audio start and end
CANDIDATE = slice(25, 29)  # the four text ids the scored candidate is


def word_tokenizer(vocab_size: int, specials: dict[int, str]):
  """A tokenizer whose word `w<i>` is id i, with bos `<s>` = 1 in front and the release's multimodal tokens."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size) if i not in specials},
           **{name: i for i, name in specials.items()}}
  core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
  tokenizer.add_special_tokens({"additional_special_tokens": list(specials.values())})
  return tokenizer


@pytest.mark.slow
def test_wav_to_candidate_nll_equals_upstream_omni_forward(tmp_path):
  import jax.numpy as jnp

  from checkpoints_conversion import convert
  from s2sjax.scoring.checkpoints import checkpoint
  from s2sjax.data.packing import RowShape
  from s2sjax.scoring.scorer import Scorer, collect
  from s2sjax.data.spec import load_spec, spec_from_dict
  from tasks.audio.baichuan import BaichuanAudioTokenizer
  from tasks.build import QuestionEncoder, build_rows
  from tasks.release import Question

  config = json.loads((RELEASE / "config.json").read_text())
  ids = np.load(RELEASE / "inputs" / "input_ids.npy")[0]
  upstream = np.load(RELEASE / "outputs" / "logprobs.npy")
  sizes = config["audio_config"]["vq_config"]["codebook_sizes"]
  specials = {config["audio_config"][f"audio_{k}_token_id"]: f"<audio_{k}_baichuan>" for k in ("start", "end", "pad")}
  tokenizer = word_tokenizer(config["vocab_size"], specials)
  words = lambda span: " ".join(f"w{i}" for i in ids[span])
  fields = dict(load_spec("baichuan_audio").as_dict(), codebook_sizes=sizes,
                speech_instruction={"en": words(INSTRUCTION), "zh": words(INSTRUCTION)})
  spec = spec_from_dict(fields)

  wav = tmp_path / "0.wav"
  soundfile.write(wav, np.load(ORACLES / "baichuan_audio_tokenizer" / "inputs" / "wave0.npy"), 16000, subtype="FLOAT")
  question = Question(id="0", language="en", uttids=("0", "0"), prefixes=("",) * 2, audio_paths=(str(wav),) * 2,
                      candidates=(words(CANDIDATE), words(slice(90, 93))), correct=0)
  audio_tokenizer = BaichuanAudioTokenizer(str(RELEASE))  # the release folder serves the tokenizer and the model
  shape = RowShape.for_length(64, num_codebooks=len(sizes))
  rows, _, _ = build_rows([question], QuestionEncoder(spec, "s2t", tokenizer, audio_tokenizer), shape)
  prefix = rows["tokens"][0][(rows["segment_ids"][0] == 1) & (rows["branch_ids"][0] == 0)]
  np.testing.assert_array_equal(prefix, ids[: CANDIDATE.start])  # the builder lays upstream's ids
  np.testing.assert_array_equal(rows["audio_codes"][0][AUDIO], np.load(RELEASE / "inputs" / "audios_tokens.npy")[:16])

  converted = str(tmp_path / "converted")
  convert.convert(str(RELEASE), converted)
  model_config = checkpoint.load_config(converted)
  params = checkpoint.load_params(converted)
  scorer = Scorer(model_config, shape, batch_size=1, dtype=jnp.float32)
  scores = collect(rows, *scorer.score(params, rows, progress=False))
  expected = -upstream[np.arange(CANDIDATE.start - 1, CANDIDATE.stop - 1), ids[CANDIDATE]].sum()
  assert scores.n_tokens[0, 0] == 4
  print(f"candidate NLL {scores.nll_sum[0, 0]:.6f}, upstream {expected:.6f}")
  assert abs(scores.nll_sum[0, 0] - expected) <= 1e-4, (scores.nll_sum[0, 0], expected)
