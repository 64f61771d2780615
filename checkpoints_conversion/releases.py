"""Releases a converter of their own reads, found with no --family by the modeling class their config.json names
(`architectures`): models of an architecture of their own (s2sjax/architectures) whose config.json `model_type`
names a family nonetheless (Kimi-Audio's `KimiAudioConfig` inherits Qwen2's `qwen2`). One record per modeling class
in `RELEASES`, a `s2sjax.registry.Registry`; a plugin registers its own the same way."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from s2sjax.registry import Registry


@dataclasses.dataclass(frozen=True)
class Release:
  name: str  # the modeling class config.json's `architectures` lists
  converter: str  # "module:function" (source, output, dtype, overwrite) -> manifest, imported when asked for


RELEASES: Registry[Release] = Registry("release")
RELEASES.register(Release("MoonshotKimiaForCausalLM", "checkpoints_conversion.kimi_release:convert"))


def converter_for(source_config: Mapping[str, Any]) -> str | None:
  """The converter of a release whose config.json names a registered modeling class, or None."""
  names = source_config.get("architectures") or ()
  return next((RELEASES.get(name).converter for name in names if name in RELEASES.names()), None)
