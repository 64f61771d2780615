r"""The log-softmax a converted checkpoint gives at every position of one sequence, through its architecture's
`log_probs` (`compute`); what each input is for decoders, Moshi and Kimi-Audio, and what the output holds, is the
command's docstring (`python -m s2sjax.logprobs`, s2sjax/commands/logprobs.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from s2sjax.scoring import architectures
from s2sjax.scoring.checkpoints import checkpoint
from s2sjax.scoring.sequence_inputs import LogProbsError
from s2sjax.scoring.checkpoints.stacks import maxtext_config


@dataclasses.dataclass(frozen=True)
class LogProbs:
  text: np.ndarray  # [T, vocab] fp32: the token head (Moshi: its text head)
  # the audio head's, fp32: Moshi's depformer [T, dep_q, card], Kimi-Audio's [T, vocab]; None for decoders
  codebooks: np.ndarray | None = None


def compute(ckpt_dir: str, input_ids: np.ndarray, audio_codes: np.ndarray | None = None,
            maxtext_run_config: str | None = None, features: np.ndarray | None = None) -> LogProbs:
  """The checkpoint's log-probs on one sequence, loaded in fp32 (module docstring); `maxtext_run_config`: a MaxText
  checkpoint's run config (--maxtext_config); `features`: a float feature track (Kimi-Audio's)."""
  reader = checkpoint.open(ckpt_dir, maxtext_config.from_flag(maxtext_run_config))
  config, params = reader.config, reader.load_params(dtype=np.float32)
  architecture = architectures.for_config(config)
  if architecture.log_probs is None:
    raise LogProbsError(f"{ckpt_dir}: the {architecture.name} architecture declares no log_probs")
  return LogProbs(*architecture.log_probs(config, params, input_ids, audio_codes, features))
