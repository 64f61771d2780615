r"""The log-softmax a converted checkpoint gives at every position: what a user holds against their own PyTorch stack.

  python -m s2sjax.logprobs --checkpoint=DIR --input_ids=ids.npy [--audio_codes=codes.npy] --output=out.npy \
      [--codebook_output=codebooks.npy]

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

Everything runs in fp32, on the project's own loader (`s2sjax.checkpoint`) and model code.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import flags

from s2sjax import checkpoint, cli
from s2sjax.model import moshi
from s2sjax.model.config import ModelConfig


class LogProbsError(ValueError):
  """Inputs that do not fit the checkpoint: named with the array, its shape and what the model expects."""


@dataclasses.dataclass(frozen=True)
class LogProbs:
  text: np.ndarray  # [T, vocab] fp32: the token head (Moshi: its text head)
  codebooks: np.ndarray | None = None  # Moshi: [T, dep_q, card] fp32, the depformer's; None for decoders


def _sequence(input_ids: np.ndarray) -> np.ndarray:
  ids = np.asarray(input_ids)
  if ids.ndim == 2 and ids.shape[0] == 1:
    ids = ids[0]
  if ids.ndim != 1 or not len(ids) or not np.issubdtype(ids.dtype, np.integer):
    raise LogProbsError(f"input_ids must be one sequence of integer ids, [T] or [1, T]; got {ids.dtype} {ids.shape}")
  return ids.astype(np.int64)


def _in_range(name: str, values: np.ndarray, size: int, what: str, silent: bool = False) -> None:
  low = -1 if silent else 0
  bad = np.flatnonzero((values < low) | (values >= size))
  if len(bad):
    raise LogProbsError(f"{name}[{bad[0]}] = {values.flat[bad[0]]} is outside {what} ({low}..{size - 1})")


def placeholder_codes(config: ModelConfig, ids: np.ndarray, audio_codes: np.ndarray | None) -> np.ndarray | None:
  """`[A, K]` codes in placeholder order -> `[T, K]` aligned with ids (-1 off the placeholders), checked against
  the model's tables."""
  placeholders = np.flatnonzero(ids == config.audio_placeholder_id) if config.audio_codebook_sizes else []
  if audio_codes is None:
    if len(placeholders):
      raise LogProbsError(f"input_ids holds {len(placeholders)} audio placeholder(s) (id {config.audio_placeholder_id})"
                          ": pass their codes as --audio_codes [audio positions, codebooks]")
    return None
  if not config.audio_codebook_sizes:
    raise LogProbsError(f"this {config.family} checkpoint has no codebook tables (its audio units are token ids): "
                        "--audio_codes does not apply")
  codes = np.asarray(audio_codes)
  tables = config.audio_codebook_sizes
  if codes.ndim != 2 or codes.shape != (len(placeholders), len(tables)):
    raise LogProbsError(f"audio_codes must be [{len(placeholders)}, {len(tables)}] (one row per audio placeholder id "
                        f"{config.audio_placeholder_id} in input_ids, one column per table); got {codes.shape}")
  for k, size in enumerate(tables):
    _in_range(f"audio_codes[:, {k}]", codes[:, k], size, f"table {k}'s rows")
  aligned = np.full((len(ids), len(tables)), -1, np.int32)
  aligned[placeholders] = codes
  return aligned


def decoder_inputs(config: ModelConfig, input_ids: np.ndarray,
                   audio_codes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
  """(ids [T], codes [T, K] aligned with them or None), checked against the decoder; a LogProbsError names what
  does not fit."""
  ids = _sequence(input_ids)
  _in_range("input_ids", ids, config.vocab_size, "the embedding's rows")
  if config.position_embedding == "learned" and len(ids) > config.max_positions:
    raise LogProbsError(f"input_ids has {len(ids)} positions, the model's position table {config.max_positions}")
  return ids, placeholder_codes(config, ids, audio_codes)


def decoder_log_probs(config: ModelConfig, params, input_ids: np.ndarray,
                      audio_codes: np.ndarray | None = None) -> np.ndarray:
  """`[T, vocab]` fp32 log-softmax of a decoder at every position of one sequence (module docstring)."""
  from s2sjax.model.decoder import sequence_log_probs

  ids, codes = decoder_inputs(config, input_ids, audio_codes)
  out = sequence_log_probs(config, params, ids[None].astype(np.int32), None if codes is None else codes[None])
  return np.asarray(out, np.float32)[0]


def moshi_log_probs(config: moshi.MoshiConfig, params, input_ids: np.ndarray,
                    audio_codes: np.ndarray | None = None) -> LogProbs:
  """Moshi's text head `[T, text_vocab]` and depformer `[T, dep_q, card]` log-softmax (module docstring)."""
  text = _sequence(input_ids)
  _in_range("input_ids", text, config.text_card, "the text stream's ids", silent=True)
  streams = np.full((1 + config.n_q, len(text)), -1, np.int64)
  streams[0] = text
  if audio_codes is not None:
    codes = np.asarray(audio_codes)
    if codes.ndim != 2 or codes.shape[0] != len(text) or not 0 < codes.shape[1] <= config.n_q:
      raise LogProbsError(f"audio_codes must be [T={len(text)}, K] time-aligned with input_ids, K <= n_q="
                          f"{config.n_q} codebook streams; got {codes.shape}")
    _in_range("audio_codes", codes, config.card, "the codebooks", silent=True)
    streams[1 : 1 + codes.shape[1]] = codes.T
  text_lp, _, audio_lp, _ = moshi.stream_log_probs(config, params, streams[None])
  codebooks = None if audio_lp is None else np.moveaxis(np.asarray(audio_lp, np.float32)[0], 0, 1)
  return LogProbs(np.asarray(text_lp, np.float32)[0], codebooks)


def compute(ckpt_dir: str, input_ids: np.ndarray, audio_codes: np.ndarray | None = None) -> LogProbs:
  """The checkpoint's log-probs on one sequence, loaded in fp32 (module docstring)."""
  config = checkpoint.load_config(ckpt_dir)
  params = checkpoint.load_params(ckpt_dir, dtype=np.float32)
  if isinstance(config, moshi.MoshiConfig):
    return moshi_log_probs(config, params, input_ids, audio_codes)
  return LogProbs(decoder_log_probs(config, params, input_ids, audio_codes))


def _load(path: str, flag: str) -> np.ndarray:
  try:
    return np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise LogProbsError(f"--{flag}={path}: cannot be read as a .npy array ({e})") from e


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  if f.codebook_output and not isinstance(checkpoint.load_config(f.checkpoint), moshi.MoshiConfig):
    raise LogProbsError("--codebook_output is for Moshi checkpoints (a depformer's codebook heads)")
  codes = _load(f.audio_codes, "audio_codes") if f.audio_codes else None
  result = compute(f.checkpoint, _load(f.input_ids, "input_ids"), codes)
  np.save(f.output, result.text)
  print(f"wrote {f.output}: log-probs {result.text.shape} float32")
  if f.codebook_output:
    np.save(f.codebook_output, result.codebooks)
    print(f"wrote {f.codebook_output}: codebook log-probs {result.codebooks.shape} float32")


def define_flags() -> None:
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint directory (as the converter writes it).")
  flags.DEFINE_string("input_ids", None, ".npy of token ids [T] (or [1, T]); Moshi: the text stream [T], -1 silent.")
  flags.DEFINE_string("audio_codes", None, ".npy of audio codes: [audio positions, codebooks] in placeholder order "
                      "(codebook-table models), or Moshi's codebook streams [T, K] time-aligned with --input_ids.")
  flags.DEFINE_string("output", None, ".npy to write: the log-softmax at every position, [T, vocab] float32.")
  flags.DEFINE_string("codebook_output", None, "Moshi only: .npy for the depformer's [T, dep_q, card] log-probs.")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["checkpoint", "input_ids", "output"])
  cli.run(main)
