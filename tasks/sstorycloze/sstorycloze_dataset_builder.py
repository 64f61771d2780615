"""sStoryCloze (S2SBench): 1,871 English stories, spoken first half, right vs wrong text ending."""

from tasks.tfds_builder import S2SBenchBuilder


class Builder(S2SBenchBuilder):
  """sStoryCloze packed rows; configs are spec-modality-row_length."""

  TASK = "sstorycloze"
