r"""A ZeroSpeech 2021 submission folder (sLM21: lexical and syntactic) from an s2sjax output directory that holds
sWUGGY's and sBLIMP's scores, for zerospeech-benchmarks 0.9.4 (`zrc benchmarks:run sLM21 DIR -t lexical syntactic
-s dev`) to validate and score as it is (s2sjax/results/zerospeech.py; docs/data.md, "sLM21").

  python -m s2sjax.zerospeech --output_dir=OUT --submission_dir=DIR [--checkpoint=NAME] \
      [--modality=s2s_utterance] [--splits=dev]
"""

from __future__ import annotations

from absl import flags

from s2sjax.results import zerospeech
from s2sjax.runtime import cli


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  for path in zerospeech.write_submission(f.output_dir, f.submission_dir, f.checkpoint, f.modality, tuple(f.splits)):
    print(f"wrote {path}")


def define_flags() -> None:
  flags.DEFINE_string("output_dir", None, "s2sjax.eval's output directory holding the swuggy and sblimp scores.")
  flags.DEFINE_string("submission_dir", None, "The submission folder to write (meta.yaml, lexical/, syntactic/).")
  flags.DEFINE_string("checkpoint", None, "The run's folder in --output_dir (default: the only one).")
  flags.DEFINE_string("modality", "s2s_utterance", "Which scores to submit: s2s_utterance (each recording whole), "
                      "or t2t (the gold files' texts, named by their recordings).")
  flags.DEFINE_list("splits", ["dev"], f"Which sets: {', '.join(zerospeech.SPLITS)} (test: the swuggy_test and "
                    "sblimp_test tasks).")


def command_line() -> None:
  """`python -m s2sjax.zerospeech`."""
  define_flags()
  flags.mark_flags_as_required(["output_dir", "submission_dir"])
  cli.run(main, __doc__, flag_modules=(__name__,))


if __name__ == "__main__":
  command_line()
