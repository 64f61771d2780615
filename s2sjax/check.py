r"""A pre-flight a user runs before a long pod job: does this checkpoint (and this data) score what they think?

  python -m s2sjax.check --checkpoint=DIR [--trust_remote_code] [--spec=NAME_OR_YAML]
      [--data_dir=DIR --task=TASK --modality=t2t|s2t|t2s|s2s|text|speech --row_length=N]

Prints one verdict per check and exits non-zero when any fails:

- config: the source config.json the checkpoint was converted from is parsed again, so a switch the decoder does
  not implement (ALiBi, sparse layers, ...) is refused by name even in a checkpoint converted before it was;
- tokenizer: the checkpoint's tokenizer loads (remote code only with --trust_remote_code) and fits the embedding;
- spec: every special token of the spec resolves in that tokenizer and equals the id the source config states;
- data: built for this tokenizer, with the same special ids, audio codes within the model's tables, and
  `evaluator.check_fit`;
- smoke: one row scored: its NLL is finite, and scoring it again with the audio codes zeroed (or every audio unit
  set to unit 0) changes it, so the audio really reaches the model.

The model checked is the one `s2sjax.eval` scores: the checkpoint fitted to the spec (`default_model.fit_to_spec`;
the demo spec's units are untrained vocabulary rows of the embedded default), its config hash verified.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
from absl import flags

from s2sjax import checkpoint, cli, default_model, families, modalities
from s2sjax.errors import UserError
from s2sjax.evaluator import EvalError, check_fit
from s2sjax.model.config import ConfigError, ModelConfig
from s2sjax.scoring import Scorer
from s2sjax.spec import AudioIds, Spec, SpecError, load_spec, resolve_audio_ids
from s2sjax.stacks import maxtext_config
from s2sjax.task_data import TaskData, load_task_data, tokenizer_identity

# Where a source config.json states a spec's special ids (Baichuan-Audio's audio_config).
SOURCE_IDS = {"start": "audio_start_token_id", "end": "audio_end_token_id", "placeholder": "audio_pad_token_id"}


@dataclasses.dataclass(frozen=True)
class Verdict:
  check: str
  ok: bool
  detail: str


class UsageError(UserError, ValueError):
  """Flags that do not name what to check."""


def config_verdict(manifest: dict) -> Verdict:
  source = manifest.get("source_config")
  if source is None:
    return Verdict("config", True, "no source config.json in the manifest (saved by training): nothing to re-read")
  try:
    config = families.layout_for_model_type(source.get("model_type")).parse_config(source)
  except ConfigError as e:
    return Verdict("config", False, f"the source config.json is refused: {e}")
  return Verdict("config", True, f"{config.family}, model_type {source.get('model_type')}: every switch supported")


def tokenizer_verdict(ckpt_dir: str, config: ModelConfig, trust_remote_code: bool):
  try:
    tokenizer = checkpoint.load_tokenizer(ckpt_dir, trust_remote_code)
  except ValueError as e:  # transformers' refusal of untrusted remote code, among others
    hint = "" if trust_remote_code else " (if it is remote code you have read, pass --trust_remote_code)"
    return None, Verdict("tokenizer", False, f"does not load: {e}{hint}")
  if tokenizer is None:
    return None, Verdict("tokenizer", False, "the checkpoint has no tokenizer/: convert it from a folder with one")
  fits = len(tokenizer) <= config.vocab_size
  return tokenizer, Verdict("tokenizer", fits, f"{type(tokenizer).__name__}, {len(tokenizer)} tokens, embedding "
                                               f"{config.vocab_size} rows" + ("" if fits else ": ids would clamp"))


def spec_verdicts(spec: Spec, tokenizer, config: ModelConfig, source_config: dict) -> list[Verdict]:
  try:
    ids = resolve_audio_ids(spec, tokenizer)
  except SpecError as e:
    return [Verdict("spec tokens", False, str(e))]
  verdicts = []
  stated = (source_config or {}).get("audio_config") or {}
  for role, key in SOURCE_IDS.items():
    ours = getattr(ids, role)
    if ours is not None and stated.get(key) is not None:
      verdicts.append(Verdict(f"spec {role} id", ours == stated[key],
                              f"spec {spec.name}'s {role} token -> {ours} in the tokenizer; config.json audio_config."
                              f"{key} = {stated[key]}"))
  if spec.audio_mode == "codebook_tables":
    verdicts.append(Verdict("placeholder id", ids.placeholder == config.audio_placeholder_id,
                            f"spec {spec.name}'s {spec.placeholder_token!r} -> {ids.placeholder} in the tokenizer; "
                            f"checkpoint audio_placeholder_id = {config.audio_placeholder_id}"))
  if spec.audio_mode == "extended_vocab":
    top = max(ids.unit_ids)
    fitted = default_model.fitted_config(config, spec)
    added = fitted.vocab_size - config.vocab_size
    verdicts.append(Verdict("unit ids", top < fitted.vocab_size,
                            f"units {id_ranges(ids.unit_ids)} against {fitted.vocab_size} embedding rows"
                            + (f" ({config.vocab_size} of the checkpoint and {added} untrained rows the evaluator "
                               f"adds for spec {spec.name})" if added else "")))
  return verdicts or [Verdict("spec tokens", True, f"spec {spec.name} names no special tokens")]


def data_verdicts(td: TaskData, config: ModelConfig, tokenizer) -> list[Verdict]:
  verdicts = []
  built = td.metadata.tokenizer
  if tokenizer is not None and built is not None:  # None: a unit LM's data, no text tokenizer
    mine = tokenizer_identity(tokenizer)
    verdicts.append(Verdict("data tokenizer", mine["vocab_sha"] == built["vocab_sha"],
                            f"built with {built['name_or_path']} ({built['size']} tokens, {built['vocab_sha']}); "
                            f"checkpoint's {mine['size']} tokens, {mine['vocab_sha']}"))
    if td.metadata.audio_ids:
      resolved = resolve_audio_ids(td.metadata.spec, tokenizer)
      same = resolved == td.metadata.audio_ids
      verdicts.append(Verdict("data special ids", same, (
        f"data and the checkpoint's tokenizer agree: {_ids_text(resolved)}" if same else
        f"data {_ids_text(td.metadata.audio_ids)}, checkpoint's tokenizer {_ids_text(resolved)}")))
  codes = td.rows["audio_codes"]
  if codes.shape[-1]:
    top = codes.reshape(-1, codes.shape[-1]).max(axis=0)
    tables = config.audio_codebook_sizes
    ok = len(tables) == len(top) and all(int(t) < n for t, n in zip(top, tables))
    verdicts.append(Verdict("audio code range", ok, f"largest code per codebook {top.tolist()}, tables {tables}"))
  try:
    check_fit(config, td)
    verdicts.append(Verdict("check_fit", True, f"{td.task}/{td.modality} fits the model"))
  except EvalError as e:
    verdicts.append(Verdict("check_fit", False, str(e)))
  return verdicts


def id_ranges(ids) -> str:
  """A list of ids as runs: `49152..49407` (256 ids), `3, 7..9`."""
  ids = sorted(ids)
  runs, start = [], 0
  for i in range(1, len(ids) + 1):
    if i == len(ids) or ids[i] != ids[i - 1] + 1:
      runs.append(str(ids[start]) if start == i - 1 else f"{ids[start]}..{ids[i - 1]}")
      start = i
  return ", ".join(runs) + (f" ({len(ids)} ids)" if len(ids) > 2 else "")


def _ids_text(audio_ids: AudioIds) -> str:
  return ", ".join(f"{role} {id_ranges(value) if isinstance(value, list) else value}"
                   for role, value in dataclasses.asdict(audio_ids).items())


def _without_audio(td: TaskData, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
  """The rows with their audio made uninformative: codes zeroed, or every audio unit replaced by unit 0."""
  if rows["audio_codes"].shape[-1]:
    return dict(rows, audio_codes=np.where(rows["audio_codes"] >= 0, 0, -1).astype(rows["audio_codes"].dtype))
  units = td.metadata.audio_ids.unit_ids if td.metadata.audio_ids else None
  if not units:
    return None
  tokens = rows["tokens"]
  return dict(rows, tokens=np.where(np.isin(tokens, units), units[0], tokens).astype(tokens.dtype))


def smoke_verdicts(config: ModelConfig, params, td: TaskData) -> list[Verdict]:
  rows = {name: array[:1] for name, array in td.rows.items()}
  scorer = Scorer(config, td.shape, batch_size=1)
  try:
    nll, n = scorer.score(params, rows, progress=False)
  except ValueError as e:
    return [Verdict("smoke score", False, str(e))]
  used = n[0] > 0
  finite = bool(used.any() and np.isfinite(nll[0][used]).all())
  verdicts = [Verdict("smoke score", finite, f"row 0: {int(used.sum())} candidates, NLL sums {nll[0][used].round(3)}")]
  if modalities.get(td.modality).prefix == modalities.SPEECH:
    silent = _without_audio(td, rows)
    if silent is None:
      verdicts.append(Verdict("audio reaches the model", False, "the speech rows carry no audio codes or unit ids"))
    else:
      other, _ = scorer.score(params, silent, progress=False)
      change = float(np.abs(other[0][used] - nll[0][used]).max())
      verdicts.append(Verdict("audio reaches the model", change > 1e-6,
                              f"NLL change with the audio blanked: {change:.3g}" + (
                                "" if change > 1e-6 else ": the codes never reach the decoder (wrong placeholder id?)")))
  return verdicts


def run(ckpt_dir: str, trust_remote_code: bool = False, spec: str | None = None, data: TaskData | None = None,
        smoke: bool = True, accept_config_change: bool = False) -> list[Verdict]:
  """Every check of a checkpoint (and data), on the model the evaluator scores: fitted to the spec as it is."""
  config = checkpoint.load_config(ckpt_dir, accept_config_change)
  manifest = checkpoint.load_manifest(ckpt_dir)
  verdicts = [config_verdict(manifest)]
  tokenizer, verdict = tokenizer_verdict(ckpt_dir, config, trust_remote_code)
  verdicts.append(verdict)
  if spec is not None:
    loaded = load_spec(spec)
  elif data is not None:
    loaded = data.metadata.spec
  else:
    loaded = None
  fitted = default_model.fitted_config(config, loaded) if loaded is not None else config
  if tokenizer is not None and loaded is not None:
    verdicts += spec_verdicts(loaded, tokenizer, config, manifest.get("source_config"))
  if data is not None:
    verdicts += data_verdicts(data, fitted, tokenizer)
    if smoke:
      params = checkpoint.load_params(ckpt_dir, accept_changed_config=accept_config_change)
      verdicts += smoke_verdicts(*default_model.fit_to_spec(config, params, loaded), data)
  return verdicts


def table(verdicts: list[Verdict]) -> str:
  width = max(len(v.check) for v in verdicts)
  return "\n".join(f"{'ok  ' if v.ok else 'FAIL'}  {v.check:<{width}}  {v.detail}" for v in verdicts)


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  local = lambda path: path and os.path.expanduser(path)  # "--flag=~/x" reaches us unexpanded
  data = None
  if f.data_dir:
    if not (f.task and f.spec):
      raise UsageError("--data_dir needs --task and --spec (and --modality, --row_length) to name the built data")
    data = load_task_data(local(f.data_dir), f.task, modalities.get(f.modality).name, f.spec, f.row_length,
                          verify=f.verify_data)
  with maxtext_config.given(f.maxtext_config):  # a MaxText checkpoint's run config (s2sjax/stacks)
    verdicts = run(local(f.checkpoint), f.trust_remote_code, f.spec, data, accept_config_change=f.accept_config_change)
  print(table(verdicts))
  failed = sum(not v.ok for v in verdicts)
  print(f"{failed} check(s) failed" if failed else "all checks passed")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  flags.DEFINE_string("checkpoint", None, "s2sjax checkpoint directory (as written by the converter).")
  flags.DEFINE_bool("trust_remote_code", False, "Run a tokenizer shipped as code (recorded in the manifest).")
  flags.DEFINE_string("spec", None, "Spec preset name or YAML path whose special tokens are checked.")
  flags.DEFINE_string("data_dir", None, "Built data to check against the checkpoint (with --task, --spec).")
  flags.DEFINE_string("task", None, "Task of the built data.")
  flags.DEFINE_enum("modality", "s2t", [*modalities.NAMES, "text", "speech"],
                    "Modality of the built data: t2t, s2t, t2s, s2s, or text (t2t), speech (s2t), as eval takes.")
  flags.DEFINE_integer("row_length", None, "Row length of the built data (default: the -auto build).")
  flags.DEFINE_bool("verify_data", True, "Hold the built data to its checksums (--noverify_data skips it).")
  flags.DEFINE_bool("accept_config_change", False, "Check a checkpoint whose model_config.json was edited.")
  maxtext_config.define_flag()
  flags.mark_flags_as_required(["checkpoint"])
  cli.run(main)
