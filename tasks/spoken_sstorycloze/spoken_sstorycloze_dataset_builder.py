"""SpokenStoryCloze sSC (slp-rl/SpokenStoryCloze): whole spoken stories with their right and wrong endings."""

from tasks.tfds_builder import S2SBenchBuilder


class Builder(S2SBenchBuilder):
  """SpokenStoryCloze sSC packed rows (S->S, the utterance protocol); configs are spec-modality-row_length."""

  TASK = "spoken_sstorycloze"
