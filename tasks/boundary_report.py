r"""Counts the Chinese items whose tokens differ at the prefix/candidate boundary between S2SBench's rule and ours.

  python -m tasks.boundary_report --tokenizer_dir=DIR --xstorycloze_zh=TSV[,TSV] --cmmlu_dir=DIR

S2SBench's reference tokenizes `first + last` as one string and scores the tokens after the boundary; tasks.build
tokenizes the prefix and the candidate separately. In Chinese (no separator) a BPE merge can straddle the
boundary, so the two rules score different tokens. An item differs when tokenize(first + last) is not
tokenize(first) + tokenize(last). Reads the public sources through tasks.importer (the replica's statements).
"""

from __future__ import annotations

import json

from absl import flags

from s2sjax.runtime import cli

from tasks import importer


def differs(tokenizer, first: str, last: str) -> bool:
  encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
  return encode(first + last) != encode(first) + encode(last)


def count(tokenizer, questions: list[tuple[str, list[str]]]) -> dict:
  """questions: (first, candidates) -> candidate lines and questions with at least one differing candidate."""
  flags_per_question = [[differs(tokenizer, first, last) for last in candidates] for first, candidates in questions]
  return {"questions": len(questions), "candidates": sum(len(f) for f in flags_per_question),
          "candidates_differing": sum(sum(f) for f in flags_per_question),
          "questions_differing": sum(any(f) for f in flags_per_question)}


def report(tokenizer, xstorycloze_zh: list[str], cmmlu_dir: str | None) -> dict:
  result = {}
  if xstorycloze_zh:
    stories = [s for path in xstorycloze_zh for s in importer.read_stories(path, "\t")]
    result["zh_sstorycloze"] = count(tokenizer, [("".join(s["sentences"]), [s["right"], s["wrong"]]) for s in stories])
  if cmmlu_dir:
    kept, _, _ = importer.read_cmmlu(cmmlu_dir)
    result["scmmlu"] = count(tokenizer, [(q["first"], [q[o] for o in importer.OPTIONS]) for q in kept])
  return result


def main(argv):
  del argv
  from transformers import AutoTokenizer

  tokenizer = AutoTokenizer.from_pretrained(FLAGS.tokenizer_dir)
  print(json.dumps(report(tokenizer, FLAGS.xstorycloze_zh, FLAGS.cmmlu_dir), indent=2))


FLAGS = flags.FLAGS

if __name__ == "__main__":
  flags.DEFINE_string("tokenizer_dir", None, "Text tokenizer (e.g. Qwen2.5's).")
  flags.DEFINE_list("xstorycloze_zh", [], "XStoryCloze zh TSV files.")
  flags.DEFINE_string("cmmlu_dir", None, "CMMLU data/test directory.")
  flags.mark_flags_as_required(["tokenizer_dir"])
  cli.run(main)
