"""sCMMLU (S2SBench): 4,743 Chinese statements, spoken first half, four text completions."""

from tasks.tfds_builder import S2SBenchBuilder


class Builder(S2SBenchBuilder):
  """sCMMLU packed rows; configs are spec-modality-row_length."""

  TASK = "scmmlu"
