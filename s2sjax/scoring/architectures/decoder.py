"""The shared decoder as an architecture: every family of `s2sjax.model.families`, scoring token rows
(`s2sjax.scoring.scorer.Scorer`), audio taken the ways its family accepts (codebook tables, units in the vocabulary)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from s2sjax.model import families
from s2sjax.data import modalities
from s2sjax.scoring.architectures.architecture import DECODER, Architecture, FitError, register
from s2sjax.model import decoder
from s2sjax.model.config import ModelConfig
from s2sjax.data.rows import TOKEN_ROWS
from s2sjax.scoring.scorer import Scorer, ScoringError, check_ids
from s2sjax.scoring.sequence_inputs import LogProbsError, check_range, no_features, sequence
from s2sjax.data.spec import AudioIds, Spec, id_ranges


def scorer(config: ModelConfig, shape, mesh=None, batch_size: int = 8, dtype=jnp.float32,
           attention: str = "xla") -> Scorer:
  return Scorer(config, shape, mesh=mesh, batch_size=batch_size, dtype=dtype, attention=attention)


def check_fit(config: ModelConfig, data) -> None:
  """No item reads positions past the checkpoint's (`check_positions`), and spoken data is laid as the checkpoint's
  family takes audio: its audio input, its units within the embedding, its codebook tables and the placeholder id it
  reads codes at."""
  check_positions(config, data)
  spec = data.metadata.spec
  if not modalities.get(data.modality).speaks:
    return
  accepted = families.get(config.family).audio_inputs
  if spec.audio_mode not in accepted:
    raise FitError(f"spec {spec.name} feeds audio as {spec.audio_mode}; the {config.family} family takes "
                   f"{', '.join(accepted) or 'no audio'}")
  units = data.metadata.audio_ids.unit_ids if data.metadata.audio_ids else None
  if units and max(units) >= config.vocab_size:  # the rows' own ids say whether any unit past the table is laid
    try:
      check_ids(data.rows, config)
    except ScoringError as e:
      raise FitError(
        f"{data.task}/{data.modality}: {e}; spec {spec.name}'s units {id_ranges(units)} lie past the checkpoint's "
        f"embedding of {config.vocab_size} rows, so its audio would be read from rows it never learned: convert a "
        "checkpoint whose embedding holds them, or build the data with a spec whose units it has (only the "
        "embedded default model is given untrained rows for them)") from None
  if spec.audio_mode == "codebook_tables":
    sizes = spec.codebook_sizes
    if len(config.audio_codebook_sizes) != len(sizes) or any(m < d for m, d in zip(config.audio_codebook_sizes, sizes)):
      raise FitError(
        f"spec {spec.name} needs {len(sizes)} audio codebook tables of sizes {sizes}; the checkpoint has "
        f"{config.audio_codebook_sizes or 'none'} (convert it with its audio tables, or use a spec that fits)"
      )
    # Codes reach the model only at the checkpoint's placeholder id: at any other id every S->T NLL would be the
    # model reading N copies of one text token, and the run would finish normally.
    placeholder = data.metadata.audio_ids.placeholder if data.metadata.audio_ids else None
    if placeholder != config.audio_placeholder_id:
      raise FitError(
        f"{data.task}/{data.modality}: the data lays audio at placeholder id {placeholder} (spec {spec.name}'s "
        f"{spec.placeholder_token!r} in the data's tokenizer), the checkpoint's config reads codes at "
        f"audio_placeholder_id {config.audio_placeholder_id}: rebuild the data with the checkpoint's tokenizer "
        "(--tokenizer_dir=CHECKPOINT/tokenizer) or use the spec whose placeholder is that id"
      )


def check_positions(config: ModelConfig, data) -> None:
  """Refuses rows that score a token predicted at a position the checkpoint was not trained to (its config's
  max_positions; 0: unknown, nothing to hold them to), naming the first such question: a build refuses such items
  (tasks/build.py), but data built elsewhere, or for another model, may hold them, and its scores would mean nothing
  (a learned position table would be read past its end)."""
  if not config.max_positions:
    return
  rows = data.rows
  # the position each target is predicted at
  read_at = np.take_along_axis(rows["positions"], np.maximum(rows["target_pos"], 0), axis=1)
  past = (rows["target_slot"] >= 0) & (read_at >= config.max_positions)
  if not past.any():
    return
  r, t = np.argwhere(past)[0]
  slot = rows["target_slot"][r, t]
  reads = int(read_at[r][rows["target_slot"][r] == slot].max()) + 1
  where = (int(rows["slot_item"][r, slot]), int(rows["slot_candidate"][r, slot]))
  slots = data.questions.slots
  question = next((f"question {data.questions.ids[q]} candidate {c}" for q, c in np.ndindex(*slots.shape[:2])
                   if tuple(slots[q, c]) == where), f"item {where[0]}")
  raise FitError(
    f"{data.task}/{data.modality}: {question} reads {reads} positions (its prefix and candidate), past the "
    f"{config.max_positions} the checkpoint was trained to; {int(past.any(axis=1).sum())} row(s) hold such items: "
    f"rebuild the data with python -m tasks.prepare --max_item_tokens={config.max_positions}, which refuses them by "
    "name (--skip_bad leaves them out)")


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
    check_range(f"audio_codes[:, {k}]", codes[:, k], size, f"table {k}'s rows")
  aligned = np.full((len(ids), len(tables)), -1, np.int32)
  aligned[placeholders] = codes
  return aligned


def decoder_inputs(config: ModelConfig, input_ids: np.ndarray,
                   audio_codes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
  """(ids [T], codes [T, K] aligned with them or None), checked against the decoder; a LogProbsError names what
  does not fit."""
  ids = sequence(input_ids)
  check_range("input_ids", ids, config.vocab_size, "the embedding's rows")
  if config.position_embedding == "learned" and len(ids) > config.max_positions:
    raise LogProbsError(f"input_ids has {len(ids)} positions, the model's position table {config.max_positions}")
  return ids, placeholder_codes(config, ids, audio_codes)


def log_probs(config: ModelConfig, params, input_ids: np.ndarray, audio_codes: np.ndarray | None = None,
              features: np.ndarray | None = None) -> tuple[np.ndarray, None]:
  """`[T, vocab]` fp32 log-softmax of a decoder at every position of one sequence (`s2sjax.logprobs`'s docstring),
  and no codebook heads."""
  no_features(features, f"a {config.family} decoder")
  ids, codes = decoder_inputs(config, input_ids, audio_codes)
  out = decoder.sequence_log_probs(config, params, ids[None].astype(np.int32), None if codes is None else codes[None])
  return np.asarray(out, np.float32)[0], None


def spec_checks(config: ModelConfig, spec: Spec, ids: AudioIds) -> list[tuple[str, bool, str]]:
  """The pre-flight's verdicts on a spec's ids: its placeholder is the one the checkpoint reads codes at, its units
  lie within the embedding."""
  verdicts = []
  if ids.placeholder is not None:
    verdicts.append(("placeholder id", ids.placeholder == config.audio_placeholder_id,
                     f"spec {spec.name}'s {spec.placeholder_token!r} -> {ids.placeholder} in the tokenizer; checkpoint "
                     f"audio_placeholder_id = {config.audio_placeholder_id}"))
  if ids.unit_ids:
    verdicts.append(("unit ids", max(ids.unit_ids) < config.vocab_size,
                     f"units {id_ranges(ids.unit_ids)} against {config.vocab_size} embedding rows"))
  return verdicts


DECODER_ARCHITECTURE = register(Architecture(
  DECODER, ModelConfig, TOKEN_ROWS, decoder.abstract_params, decoder.param_logical_axes, scorer,
  text_rows=lambda config: config.vocab_size, check_fit=check_fit, check_ids=check_ids,
  parse_config=families.from_hf_config, spec_checks=spec_checks, log_probs=log_probs, planned=lambda config: config))
