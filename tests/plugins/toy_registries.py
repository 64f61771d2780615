"""One record for each registry, from one plugin module (S2SJAX_PLUGINS), each added by that registry's own
`register` (s2sjax.runtime.registry.Registry): a task, two spec presets (a YAML file beside this module, and a `Spec`
built here), an audio tokenizer type and a model family."""

import os

from s2sjax.data import task_registry, spec
from s2sjax.model import families
from tasks import audio

TASK = task_registry.register(task_registry.Task(
  "toy_registry_cloze", "ToyRegistryCloze", "en", "story_pairs", "Toy/toy_cloze.jsonl", "Toy/toy_cloze_wav",
  "Toy/toy_cloze_last_wav", decision="pair", candidates=2,
  sizes=task_registry.PlannerSizes(questions=4, prefix_tokens=40, candidate_tokens=10, seconds=6.0)))

UNITS = spec.register(spec.SpecFile("toy_units", os.path.join(os.path.dirname(__file__), "toy_units.yaml")))
TEXT = spec.register(spec.Spec(name="toy_text", audio_mode="none", audio_tokenizer={}, codebook_sizes=()))

# The weight-free mel k-means reader under a name of the plugin's own (the toy_units preset names it).
TOKENIZER = audio.register(audio.AudioTokenizerType(
  "toy_mel", "tasks.audio.mel_kmeans:MelKmeansTokenizer", "a k-means codebook .npy (`bundled`: the sample's)",
  50.0, "the mel k-means units, registered by a plugin"))

# Llama's own config parser and key rules, read from checkpoints whose config.json says another model_type.
_LLAMA = families.get("llama").layout(families.HF)
FAMILY = families.register(families.Family(
  "toy_registry_llama", (families.Layout(families.HF, ("toy_registry_lm",), _LLAMA.parse_config, _LLAMA.rules),)))
