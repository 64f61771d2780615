"""Tasks, model families, spec presets and audio tokenizers are records of one registry type: a plugin module
(tests/plugins/toy_registries.py, named in S2SJAX_PLUGINS) adds one of each with the same `register` call and every
lookup finds it by name; an unknown name lists the known ones; a record that would give a lookup two answers is
refused, and nothing changes."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from s2sjax.data import task_registry, spec
from s2sjax.model import families
from s2sjax.runtime import plugins
from s2sjax.model.config import ConfigError
from s2sjax.runtime.registry import Registry, RegistryError
from s2sjax.data.spec import Spec, SpecError, SpecFile
from tasks import audio
from tasks.audio.base import load_audio
from tasks.audio.mel_kmeans import MelKmeansTokenizer
from tasks.sample import MEL_KMEANS_CODEBOOK, RELEASE_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGIN = "tests.plugins.toy_registries"
REGISTRIES = {"task": task_registry.TASKS, "family": families.FAMILIES, "spec": spec.SPECS,
              "audio tokenizer": audio.TOKENIZERS}


def _with_plugin(*command: str) -> subprocess.CompletedProcess:
  """A fresh process that sees the plugin only through $S2SJAX_PLUGINS, as a user's command line does (the
  plugin's records stay out of this test session's registries)."""
  done = subprocess.run([sys.executable, *command], cwd=ROOT, env={**os.environ, plugins.ENV: PLUGIN},
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


LOOKUPS = """
import json
from s2sjax.data import task_registry, spec
from s2sjax.model import families
from s2sjax.runtime.registry import Registry
from tasks import audio

units = spec.load_spec("toy_units")
print(json.dumps({
  "registers": [m.register.__func__ is Registry.register for m in (task_registry, families, spec, audio)],
  "task": task_registry.get("toy_registry_cloze").title,
  "units": [units.name, units.codebook_sizes[0], audio.TOKENIZERS.get(units.audio_tokenizer["type"]).loader],
  "text": spec.load_spec("toy_text").audio_mode,
  "family": [families.get("toy_registry_llama").name, families.layout_for_model_type("toy_registry_lm").model_types],
  "listed": [task_registry.names()[-1], families.names()[-1], spec.SPECS.names()[-2:], audio.TOKENIZERS.names()[-1]],
  "builder_presets": spec.available_specs(),
}))
"""


def test_a_plugin_adds_a_record_to_every_registry_with_the_same_register_call():
  found = json.loads(_with_plugin("-c", LOOKUPS).stdout)
  assert found["registers"] == [True] * 4
  assert found["task"] == "ToyRegistryCloze"
  assert found["units"] == ["toy_units", 256, "tasks.audio.mel_kmeans:MelKmeansTokenizer"]
  assert found["text"] == "none"
  assert found["family"] == ["toy_registry_llama", ["toy_registry_lm"]]
  assert found["listed"] == ["toy_registry_cloze", "toy_registry_llama", ["toy_units", "toy_text"], "toy_mel"]
  assert found["builder_presets"] == spec.available_specs()  # the default builder configs stay the package's


@pytest.mark.slow
def test_a_plugin_preset_is_found_by_spec_name_on_the_command_line_with_its_tokenizer(tmp_path):
  """`--spec=toy_units` names the plugin's preset, whose `audio_tokenizer.type` is the plugin's tokenizer type:
  its codes are the mel k-means codes the built-in reader makes of the same recording."""
  recordings = tmp_path / "wavs"
  recordings.mkdir()
  shutil.copy(os.path.join(RELEASE_DIR, "StoryCloze", "s-story-firstspeech", "0.wav"), recordings / "story.wav")
  _with_plugin("-m", "tasks.audio.tokenize", "--spec=toy_units", f"--input={recordings}",
               f"--output={tmp_path / 'codes'}")
  reader = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK)
  expected = reader.encode(load_audio(str(recordings / "story.wav"), reader.sample_rate), "story")
  np.testing.assert_array_equal(np.load(tmp_path / "codes" / "story.npy"), expected)
  assert json.loads((tmp_path / "codes" / "tokenize.json").read_text())["tokenizer"]["type"] == "mel_kmeans"


@pytest.mark.parametrize("lookup, error, message", [
  (lambda: task_registry.get("nope"), KeyError, r"unknown task 'nope'; tasks: sstorycloze, zh_sstorycloze, scmmlu"),
  (lambda: families.get("nope"), ConfigError, r"unknown model family 'nope'; registered: qwen2, llama, glm4, opt"),
  (lambda: spec.load_spec("nope"), SpecError, r"no spec 'nope': presets are baichuan_audio, demo, demo_tables, "),
  (lambda: audio.TOKENIZERS.get("nope"), KeyError, r"unknown audio tokenizer 'nope'; audio tokenizers: "
                                                   r"precomputed, mel_kmeans, glm4_voice"),
])
def test_an_unknown_name_lists_the_known_ones(lookup, error, message, monkeypatch):
  monkeypatch.delenv(plugins.ENV, raising=False)
  with pytest.raises(error, match=message):
    lookup()


def _spec_file(tmp_path, name="demo") -> SpecFile:
  path = tmp_path / f"{name}.yaml"
  path.write_text(f"name: {name}\naudio_mode: none\n")
  return SpecFile(name, str(path))


@pytest.mark.parametrize("kind, record, message", [
  ("task", lambda _: task_registry.Task(
    "scmmlu", "Mine", "zh", "multiple_choice", "a.jsonl", "a", "b", decision="pair", candidates=4,
    sizes=task_registry.PlannerSizes(1, 1, 1, 1.0)), r"cannot register task 'scmmlu': a task named 'scmmlu' is "
                                                  r"registered already"),
  ("spec", _spec_file, r"cannot register spec 'demo': a spec named 'demo' is registered already"),
  ("spec", lambda _: Spec(name="my-spec", audio_mode="none", audio_tokenizer={}, codebook_sizes=()),
   r"a preset's name is letters, digits, '_' and '.'"),
  ("spec", lambda tmp_path: SpecFile("mine", str(tmp_path / "absent.yaml")), r"absent.yaml does not exist"),
  ("audio tokenizer", lambda _: audio.AudioTokenizerType("mimi", "x:Y", "", None, ""),
   r"cannot register audio tokenizer 'mimi': an audio tokenizer named 'mimi' is registered already"),
  ("family", lambda _: families.Family("mine", (families.Layout(families.HF, ("llama",), None, None),)),
   r"cannot register family 'mine': model_type 'llama' is read by llama/hf already"),
])
def test_a_clash_is_refused_and_nothing_changes(kind, record, message, tmp_path):
  registry = REGISTRIES[kind]
  before = registry.names()
  with pytest.raises(RegistryError, match=message):
    registry.register(record(tmp_path))
  assert registry.names() == before


def test_a_registry_takes_its_own_clash_rule_and_the_same_record_twice_is_one():
  """The hook the families' rules plug into: `check(record, registered)` lists what else would be ambiguous."""
  taken = lambda new, known: [f"{new[1]} is {name}'s" for name, (_, hex_) in known.items() if hex_ == new[1]]
  colours = Registry("colour", name_of=lambda pair: pair[0], check=taken)
  colours.register(("red", "#f00"))
  colours.register(("red", "#f00"))  # a module imported twice
  with pytest.raises(RegistryError, match=r"cannot register colour 'crimson': #f00 is red's"):
    colours.register(("crimson", "#f00"))
  colours.register(("green", "#0f0"))
  with pytest.raises(RegistryError, match=r"a colour named 'red' is registered already; #0f0 is green's"):
    colours.register(("red", "#0f0"))
  assert colours.names() == ["red", "green"] and colours.get("green") == ("green", "#0f0")
