"""`s2sjax.data.builds`: the selector that names a build (for tasks.prepare and s2sjax.eval alike) and the typed metadata
a build writes and the evaluator reads."""

import dataclasses
import json

import pytest
from absl import flags

from s2sjax.data.builds import BuildMetadata, DataError, DataSelector, Variants, define_flags, from_flags, selectors
from s2sjax.data.packing import RowShape
from s2sjax.data.spec import AudioIds, load_spec


def test_a_selector_names_its_config_and_its_record():
  assert DataSelector("sstorycloze", "speech").config == "demo-s2t-auto"  # "speech" is S->T, AUTO the row length
  assert DataSelector("scmmlu", "t2t", "demo", 1024, Variants(share_prefix=False, overlong="truncate_prefix",
                                                             tokenization="joint")).config == \
    "demo-t2t-1024-noshare-truncate-joint"
  utterance = DataSelector("sstorycloze", "s2s", "twist", 2048, Variants(protocol="utterance"))
  assert utterance.config == "twist-s2s-2048-utterance" and utterance.label == "s2s_utterance"
  assert utterance.record() == {"task": "sstorycloze", "config": "twist-s2s-2048-utterance", "spec": "twist",
                                "modality": "s2s", "row_length": 2048, "share_prefix": True,
                                "reference_language_quirk": False, "overlong": "error", "protocol": "utterance",
                                "tokenization": "separate"}


def test_selectors_apply_the_protocol_to_s2s_and_the_tokenization_to_t2t_only():
  chosen = selectors(["sstorycloze", "scmmlu"], ["t2t", "s2t", "s2s"], ["s2sbench", "utterance"],
                     row_length=1024, variants=Variants(tokenization="joint"))
  assert [s.config for s in chosen if s.task == "scmmlu"] == [
    "demo-t2t-1024-joint", "demo-s2t-1024", "demo-s2s-1024", "demo-s2s-1024-utterance"]
  assert len(chosen) == 8


def test_both_commands_declare_the_same_selector_flags_once():
  values = flags.FlagValues()
  define_flags(values)
  values(["prog", "--task=scmmlu", "--modality=speech,s2s", "--protocol=utterance", "--row_length=2048",
          "--noshare_prefix"])
  assert [s.config for s in from_flags(["scmmlu"], values)] == ["demo-s2t-2048-noshare", "demo-s2s-2048-noshare-utterance"]
  defaults = flags.FlagValues()
  define_flags(defaults)
  defaults(["prog"])
  assert [s.config for s in from_flags(["sstorycloze"], defaults)] == ["demo-t2t-auto", "demo-s2t-auto"]


def _metadata() -> BuildMetadata:
  return BuildMetadata(
    task="scmmlu", modality="s2t", spec=load_spec("demo_tables"), row_shape=RowShape(1024, 64, 32, 1, max_item=300),
    variants=Variants(share_prefix=False), source="release", tokenizer={"size": 10, "vocab_sha": "ab"},
    audio_ids=AudioIds(1, 2, 3, None), report={"questions": 2}, questions=({"id": "q1", "correct": 1},),
    build=DataSelector("scmmlu", "s2t", "demo_tables", 1024, Variants(share_prefix=False)).record())


def test_build_metadata_round_trips_through_its_json_layout():
  metadata = _metadata()
  written = json.loads(json.dumps(metadata.to_json()))
  assert written["share_prefix"] is False and written["row_shape"]["max_item"] == 300  # variants at the top level
  assert written["spec"]["name"] == "demo_tables" and written["audio_ids"]["placeholder"] == 3
  assert BuildMetadata.from_json(written, "metadata.json") == metadata


def test_a_build_made_before_a_field_existed_reads_with_its_default():
  written = _metadata().to_json()
  for key in ("tokenization", "protocol", "build", "integrity", "audio_ids"):
    written.pop(key)
  old = BuildMetadata.from_json(written, "metadata.json")
  assert old.variants == Variants(share_prefix=False) and old.build is None and old.audio_ids is None


def test_metadata_without_its_core_fields_is_refused_by_file():
  written = dataclasses.replace(_metadata()).to_json()
  del written["row_shape"], written["spec"]
  with pytest.raises(DataError, match=r"data/scmmlu/metadata.json: the build's metadata lacks spec, row_shape"):
    BuildMetadata.from_json(written, "data/scmmlu/metadata.json")
