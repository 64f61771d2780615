"""The architectures whose releases a converter of their own reads (their own parameter tree and source layout, not
a family's layouts): one `OwnConverter` each, keyed by the architecture's name (s2sjax/scoring/architectures), in
`CONVERTERS`, a `s2sjax.runtime.registry.Registry`. `--family=NAME` picks one; a release whose config.json
`architectures` names one of its `release_classes` goes to it with no flags (`for_release`), whatever family its
model_type names (Kimi-Audio's says qwen2). The scoring stage knows nothing of them: what converts a checkpoint is
this package's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from s2sjax.runtime.registry import Registry


@dataclasses.dataclass(frozen=True)
class OwnConverter:
  """`convert` ("module:function", imported when asked for) reads a release folder of the architecture:
  `convert(source, output, dtype, overwrite) -> manifest`; `verify`, when given, compares the converted checkpoint
  with the release run in PyTorch: `verify(source, ckpt_dir, length, seed) -> comparison`. `release_classes` are the
  modeling classes a release's config.json `architectures` names that `convert` reads with no --family."""

  architecture: str
  convert: str
  verify: str | None = None
  release_classes: tuple[str, ...] = ()


def _problems(new: OwnConverter, registered: Mapping[str, OwnConverter]) -> list[str]:
  return [f"release class {name} is {c.architecture}'s already" for c in registered.values()
          for name in new.release_classes if name in c.release_classes]


CONVERTERS: Registry[OwnConverter] = Registry("own converter", name_of=lambda c: c.architecture, check=_problems)
register = CONVERTERS.register
register(OwnConverter("moshi", "checkpoints_conversion.moshi_release:convert",
                      "checkpoints_conversion.moshi_release:compare_with_torch"))
register(OwnConverter("kimi_audio", "checkpoints_conversion.kimi_release:convert",
                      release_classes=("MoonshotKimiaForCausalLM",)))
register(OwnConverter("mimo_audio", "checkpoints_conversion.mimo_release:convert",
                      release_classes=("MiMoAudioForCausalLM",)))
register(OwnConverter("step_audio2", "checkpoints_conversion.step_audio2_release:convert",
                      release_classes=("StepAudio2ForCausalLM",)))


def for_release(source_config: Mapping[str, Any]) -> OwnConverter | None:
  """The converter of a release whose config.json names one of its `release_classes`, or None."""
  names = source_config.get("architectures") or ()
  return next((c for c in CONVERTERS for name in names if name in c.release_classes), None)
