r"""The pre-flight's checks of a checkpoint (and its data), one `Verdict` each (`run`); which checks and why is
the command's docstring (`python -m s2sjax.check`, s2sjax/commands/check.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from s2sjax.scoring import architectures, default_model
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.checkpoints.stacks import maxtext
from s2sjax.data import modalities, text_tokenizer
from s2sjax.scoring.evaluator import EvalError, check_fit
from s2sjax.model.config import ConfigError
from s2sjax.scoring.scorer import ScoringError
from s2sjax.data.spec import AudioIds, Spec, SpecError, id_ranges, load_spec, resolve_audio_ids
from s2sjax.data.task_data import TaskData

# Where a source config.json states a spec's special ids (Baichuan-Audio's audio_config).
SOURCE_IDS = {"start": "audio_start_token_id", "end": "audio_end_token_id", "placeholder": "audio_pad_token_id"}


@dataclasses.dataclass(frozen=True)
class Verdict:
  check: str
  ok: bool
  detail: str


def config_verdict(manifest: dict, architecture: architectures.Architecture | None = None) -> Verdict:
  """The source config.json read again by the checkpoint's architecture (by default, the one its manifest's
  `source_model_type` names: a registered architecture's own, else the shared decoder's families)."""
  architecture = architecture or architectures.for_family(manifest.get("source_model_type"))
  source = manifest.get("source_config")
  if source is None or architecture.parse_config is None:
    return Verdict("config", True, "no source config.json in the manifest (saved by training) or no reader of one for "
                                   f"{architecture.name}: nothing to re-read")
  try:
    config = architecture.parse_config(source)
  except ConfigError as e:
    return Verdict("config", False, f"the source config.json is refused: {e}")
  return Verdict("config", True, f"{config.family}, model_type {source.get('model_type', architecture.name)}: "
                                 "every switch supported")


def tokenizer_verdict(reader, text_rows: int, trust_remote_code: bool):
  try:
    tokenizer = reader.load_tokenizer(trust_remote_code)
  except ValueError as e:  # transformers' refusal of untrusted remote code, among others
    hint = "" if trust_remote_code else " (if it is remote code you have read, pass --trust_remote_code)"
    return None, Verdict("tokenizer", False, f"does not load: {e}{hint}")
  if tokenizer is None:
    return None, Verdict("tokenizer", False, "the checkpoint has no tokenizer/: convert it from a folder with one")
  fits = len(tokenizer) <= text_rows
  return tokenizer, Verdict("tokenizer", fits, f"{type(tokenizer).__name__}, {len(tokenizer)} tokens, embedding "
                                               f"{text_rows} rows" + ("" if fits else ": ids would clamp"))


def spec_verdicts(spec: Spec, tokenizer, config, source_config: dict, added: int = 0) -> list[Verdict]:
  """The spec's special tokens in the tokenizer and the source config, then how its ids and streams meet the model
  (its architecture's `spec_checks`); `added`: the untrained rows the embedded default is given for its units."""
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
  for check, ok, detail in architectures.for_config(config).spec_checks(config, spec, ids):
    note = f" ({added} of them untrained rows the embedded default is given for spec {spec.name})" if added else ""
    verdicts.append(Verdict(check, ok, detail + (note if check == "unit ids" else "")))
  return verdicts or [Verdict("spec tokens", True, f"spec {spec.name} names no special tokens")]


def data_verdicts(td: TaskData, config, tokenizer) -> list[Verdict]:
  verdicts = []
  built = td.metadata.tokenizer
  if tokenizer is not None and built is not None:  # None: a unit LM's data, no text tokenizer
    mine = text_tokenizer.identity(tokenizer)
    verdicts.append(Verdict("data tokenizer", mine["vocab_sha"] == built["vocab_sha"],
                            f"built with {built['name_or_path']} ({built['size']} tokens, {built['vocab_sha']}); "
                            f"checkpoint's {mine['size']} tokens, {mine['vocab_sha']}"))
    if td.metadata.audio_ids:
      resolved = resolve_audio_ids(td.metadata.spec, tokenizer)
      same = resolved == td.metadata.audio_ids
      verdicts.append(Verdict("data special ids", same, (
        f"data and the checkpoint's tokenizer agree: {_ids_text(resolved)}" if same else
        f"data {_ids_text(td.metadata.audio_ids)}, checkpoint's tokenizer {_ids_text(resolved)}")))
  name = "audio code range" if modalities.get(td.modality).speaks else "id range"
  check_ids = architectures.for_config(config).check_ids
  try:
    if check_ids is not None:  # without one, the smoke score's own check
      check_ids(td.rows, config)
      verdicts.append(Verdict(name, True, f"every id and code of {td.num_rows} rows within the model's tables"))
  except ScoringError as e:
    verdicts.append(Verdict(name, False, str(e)))
  try:
    check_fit(config, td)
    verdicts.append(Verdict("check_fit", True, f"{td.task}/{td.modality} fits the model"))
  except EvalError as e:
    verdicts.append(Verdict("check_fit", False, str(e)))
  return verdicts


def _ids_text(audio_ids: AudioIds) -> str:
  return ", ".join(f"{role} {id_ranges(value) if isinstance(value, list) else value}"
                   for role, value in dataclasses.asdict(audio_ids).items())


def smoke_verdicts(config, params, td: TaskData) -> list[Verdict]:
  rows = {name: array[:1] for name, array in td.rows.items()}
  scorer = architectures.for_config(config).scorer(config, td.shape, batch_size=1)
  try:
    nll, n = scorer.score(params, rows, progress=False)
  except ValueError as e:
    return [Verdict("smoke score", False, str(e))]
  used = n[0] > 0
  finite = bool(used.any() and np.isfinite(nll[0][used]).all())
  verdicts = [Verdict("smoke score", finite, f"row 0: {int(used.sum())} candidates, NLL sums {nll[0][used].round(3)}")]
  if modalities.get(td.modality).prefix == modalities.SPEECH:
    silent = td.metadata.spec.input_format.blank_audio(rows, td.metadata)
    if silent is None:
      verdicts.append(Verdict("audio reaches the model", False, "the speech rows carry no audio codes or unit ids"))
    else:
      other, _ = scorer.score(params, silent, progress=False)
      change = float(np.abs(other[0][used] - nll[0][used]).max())
      verdicts.append(Verdict("audio reaches the model", change > 1e-6,
                              f"NLL change with the audio blanked: {change:.3g}" + (
                                "" if change > 1e-6 else ": the codes never reach the model (wrong placeholder id?)")))
  return verdicts


def stored_verdict(reader) -> Verdict:
  """The parameters' files there and whole (`verify_stored`: sizes against the manifest, or a MaxText folder's
  shard indexes), read without loading the parameters."""
  try:
    reader.verify_stored()
  except (checkpoint.CheckpointError, maxtext.MaxTextError) as e:
    return Verdict("stored parameters", False, str(e))
  return Verdict("stored parameters", True, "every parameter file there and whole")


def run(reader, trust_remote_code: bool = False, spec: str | None = None, data: TaskData | None = None,
        smoke: bool = True) -> list[Verdict]:
  """Every check of an opened checkpoint (`checkpoint.open`) and data, on the model the evaluator scores: fitted
  to the spec as it is."""
  config = reader.config
  architecture = architectures.for_config(config)
  manifest = reader.manifest()
  verdicts = [config_verdict(manifest, architecture), stored_verdict(reader)]
  tokenizer, verdict = tokenizer_verdict(reader, architecture.text_rows(config), trust_remote_code)
  verdicts.append(verdict)
  if spec is not None:
    loaded = load_spec(spec)
  elif data is not None:
    loaded = data.metadata.spec
  else:
    loaded = None
  fitted = default_model.fitted_config(config, loaded, manifest) if loaded is not None else config
  if tokenizer is not None and loaded is not None:
    added = architecture.text_rows(fitted) - architecture.text_rows(config)
    verdicts += spec_verdicts(loaded, tokenizer, fitted, manifest.get("source_config"), added)
  if data is not None:
    verdicts += data_verdicts(data, fitted, tokenizer)
    if smoke:
      params = reader.load_params()
      verdicts += smoke_verdicts(*default_model.fit_to_spec(config, params, loaded, manifest), data)
  return verdicts


def not_checked(reader, spec: str | None, data: TaskData | None) -> list[str]:
  """What a run with these arguments leaves unchecked, and what would check it; and what the checkpoint's own
  files cannot confirm (`unverified`: a MaxText folder without the config.yml of its run)."""
  missing = ["spec: not checked (give --spec)"] if spec is None and data is None else []
  if data is None:
    missing.append("data: not checked (give --data_dir/--task/--modality)")
  return missing + [f"not verified: {what}" for what in reader.unverified]


def table(verdicts: list[Verdict]) -> str:
  width = max(len(v.check) for v in verdicts)
  return "\n".join(f"{'ok  ' if v.ok else 'FAIL'}  {v.check:<{width}}  {v.detail}" for v in verdicts)
