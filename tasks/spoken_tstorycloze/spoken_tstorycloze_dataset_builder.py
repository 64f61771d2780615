"""SpokenStoryCloze tSC (slp-rl/SpokenStoryCloze): whole spoken stories with their right ending and one of another story."""

from tasks.tfds_builder import S2SBenchBuilder


class Builder(S2SBenchBuilder):
  """SpokenStoryCloze tSC packed rows (S->S, the utterance protocol); configs are spec-modality-row_length."""

  TASK = "spoken_tstorycloze"
