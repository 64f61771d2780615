"""tStoryCloze (TWIST's topic StoryCloze): sStoryCloze's stories, the wrong ending drawn from another story."""

from tasks.tfds_builder import S2SBenchBuilder


class Builder(S2SBenchBuilder):
  """tStoryCloze packed rows; configs are spec-modality-row_length."""

  TASK = "tstorycloze"
