r"""The log-softmax a converted checkpoint gives at every position: what a user holds against their own PyTorch stack.

  python -m s2sjax.logprobs --checkpoint=DIR --input_ids=ids.npy [--audio_codes=codes.npy] [--features=f.npy] \
      --output=out.npy [--codebook_output=codebooks.npy]

Decoders (every registered family): `--input_ids` is one sequence of token ids, `[T]` (or `[1, T]`). The output is
`[T, vocab]` fp32: row t is the next-token distribution after reading ids[0..t], as upstream's
`log_softmax(model(input_ids).logits)[0]`. A `codebook_tables` model (Baichuan-Audio) takes `--audio_codes`
`[audio positions, codebooks]`: one row per audio placeholder id in `--input_ids`, in their order (as
`OmniForCausalLM.forward(input_ids, audios_tokens)` consumes its `audios_tokens`); an `extended_vocab` model's audio
units are token ids already.

Moshi: `--input_ids` is the text stream `[T]` (-1 where it is silent) and `--audio_codes` its codebook streams
`[T, K]` (K <= n_q: Moshi's own codebooks first, then the user's; streams not given are silent, -1), time-aligned
(undelayed, as `LMModel.forward` takes its codes). The output is the text head's `[T, text_vocab]`, row t the
distribution of step t's text token, as `log_softmax(LMModel.forward(codes).text_logits)[0, 0]`; rows upstream
masks (a text id of -1) are NaN. `--codebook_output` also writes the depformer's `[T, dep_q, card]`, NaN where
`LMModel.forward`'s mask is false (codes of -1, a delayed stream's last steps).

Kimi-Audio: `--input_ids` is `[2, T]`, the audio stream over the text stream (upstream's `input_ids` and
`text_input_ids`), and `--features` `[N, 4 x Whisper d_model]` float the Whisper features of its audio message
(`whisper_input_feature`), placed at the rows between media_begin and media_end as the model places them. The
output is the text head's `[T, vocab]` (lm_head on the whole stack); `--codebook_output` writes the audio head's
`[T, vocab]` (mimo_output on the branch), each as `log_softmax` of the logits `MoonshotKimiaForCausalLM.forward`
returns (modeling_kimia.py:905-909, the names swapped back as kimia.py:114 does).

Step-Audio 2: `--input_ids` `[T]` as the wrapper lays them, and `--features` `[N, hidden]` float the adaptor rows of
its audios in order (`tasks.audio.step_audio2`), written over the placeholders after each `<audio_start>` as
`modeling_step_audio_2.py:353-357` writes them. The output is `[T, vocab]`, the full vocabulary (speech out: ids
151696 + code).

A MaxText checkpoint folder (s2sjax/scoring/checkpoints/stacks/maxtext.py) is read as MaxText wrote it, with `--maxtext_config`: the
run config it was trained with (unless MaxText wrote its config.yml beside the run).

Everything runs in fp32, on the project's own loader (`s2sjax.scoring.checkpoints.checkpoint`) and model code.
"""

from __future__ import annotations

import numpy as np
from absl import flags

from s2sjax.runtime import cli
from s2sjax.scoring import log_probs
from s2sjax.scoring.sequence_inputs import LogProbsError
from s2sjax.scoring.checkpoints.stacks import maxtext_config


def _load(path: str, flag: str) -> np.ndarray:
  try:
    return np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise LogProbsError(f"--{flag}={path}: cannot be read as a .npy array ({e})") from e


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  codes = _load(f.audio_codes, "audio_codes") if f.audio_codes else None
  features = _load(f.features, "features") if f.features else None
  result = log_probs.compute(f.checkpoint, _load(f.input_ids, "input_ids"), codes, f.maxtext_config, features)
  if f.codebook_output and result.codebooks is None:
    raise LogProbsError(f"--codebook_output is for checkpoints with an audio head (Moshi's depformer, Kimi-Audio's "
                        f"branch); {f.checkpoint} has none")
  np.save(f.output, result.text)
  print(f"wrote {f.output}: log-probs {result.text.shape} float32")
  if f.codebook_output:
    np.save(f.codebook_output, result.codebooks)
    print(f"wrote {f.codebook_output}: audio-head log-probs {result.codebooks.shape} float32")


def define_flags() -> None:
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint directory (as the converter writes it), or a MaxText "
                      "checkpoint folder (<run>/checkpoints/<step>, or a params-only one).")
  maxtext_config.define_flag()
  flags.DEFINE_string("input_ids", None, ".npy of token ids [T] (or [1, T]); Moshi: the text stream [T], -1 silent; "
                      "Kimi-Audio: [2, T], the audio stream over the text stream.")
  flags.DEFINE_string("audio_codes", None, ".npy of audio codes: [audio positions, codebooks] in placeholder order "
                      "(codebook-table models), or Moshi's codebook streams [T, K] time-aligned with --input_ids.")
  flags.DEFINE_string("features", None, "Kimi-Audio: .npy of its audio message's Whisper features [N, 4 x "
                      "d_model] float; Step-Audio 2: its audios' adaptor rows [N, hidden] float.")
  flags.DEFINE_string("output", None, ".npy to write: the log-softmax at every position, [T, vocab] float32.")
  flags.DEFINE_string("codebook_output", None, ".npy for the audio head's log-probs: Moshi's depformer "
                      "[T, dep_q, card], Kimi-Audio's [T, vocab].")


def command_line() -> None:
  """`python -m s2sjax.logprobs`."""
  define_flags()
  flags.mark_flags_as_required(["checkpoint", "input_ids", "output"])
  cli.run(main, __doc__, flag_modules=(__name__,))
