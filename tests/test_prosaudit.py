"""ZeroSpeech's ProsAudit read and scored as zerospeech-benchmarks 0.9.4 scores it (tasks/lm/prosody.py): pairs by
position in gold.csv, each recording's log-probability, ties half, the mean over voices per (type, id), then per
type (lexical, protosyntax) with n, mean and std; on a layout-faithful fixture spoken by espeak-ng."""

import json
import os
import shutil
import statistics

import pytest

from tasks.release import ReleaseError, read_questions
from tests.neighbour_releases import Speech, write_gold, write_prosaudit


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
  return Speech(str(tmp_path_factory.mktemp("clips")))


@pytest.fixture
def release(tmp_path, speech):
  rows = write_prosaudit(str(tmp_path / "prosaudit"), speech)
  return str(tmp_path / "prosaudit"), rows


def test_pairs_come_in_the_toolkits_groupby_order_labelled_by_their_correct_row(release):
  root, rows = release
  questions = read_questions("prosaudit_dev", root)
  # groupby(['type', 'id']) sorts: lexical before protosyntax, ids as numbers (2 before 10), voices in file order
  assert [(q.labels["type"], q.labels["id"], q.labels["voice"]) for q in questions] == [
    ("lexical", "3", "en_f"), ("lexical", "3", "en_m"), ("lexical", "7", "en_f"), ("lexical", "7", "en_m"),
    ("protosyntax", "2", "en_f"), ("protosyntax", "2", "en_m"), ("protosyntax", "10", "en_f"),
    ("protosyntax", "10", "en_m")]
  by_name = {row["filename"]: row for row in rows}
  for q in questions:
    right, wrong = (by_name[u] for u in q.uttids)
    assert (right["correct"], wrong["correct"]) == (1, 0) and right["id"] == wrong["id"] == q.labels["id"]
    assert q.correct == 0 and q.labels["type_id"] == f"{right['type']}/{right['id']}"
    assert q.candidate_audio_paths[1] == os.path.join(root, "english/dev", f"{wrong['filename']}.wav")


def test_pairs_are_made_by_position_not_by_id(release):
  """The k-th correct==1 row with the k-th correct==0 row (prosody.py:73-77): with the incorrect rows of ids 10
  and 2 swapped, each correct row pairs with whatever incorrect row stands at its position."""
  root, rows = release
  correct = [r for r in rows if r["correct"] == 1]
  incorrect = [r for r in rows if r["correct"] == 0]
  incorrect[0], incorrect[2] = incorrect[2], incorrect[0]
  write_gold(os.path.join(root, "english/dev/gold.csv"), correct + incorrect)
  pairs = {q.uttids[0]: q.uttids[1] for q in read_questions("prosaudit_dev", root)}
  assert pairs == {r["filename"]: w["filename"] for r, w in zip(correct, incorrect)}
  assert pairs[correct[0]["filename"]] == incorrect[0]["filename"] and incorrect[0]["id"] == "2" != correct[0]["id"]


def test_a_wrong_layout_is_one_line_naming_the_file(release):
  root, rows = release
  gold, folder = os.path.join(root, "english/dev/gold.csv"), os.path.join(root, "english/dev")

  def refused(match):
    with pytest.raises(ReleaseError, match=match) as raised:
      read_questions("prosaudit_dev", root)
    assert "\n" not in str(raised.value)

  write_gold(gold, rows, columns=("filename", "correct", "id", "voice", "subtype", "transcription"))
  refused(r"gold\.csv lacks the column\(s\) type: ProsAudit's gold\.csv holds filename, correct, id")
  write_gold(gold, rows[:-1])  # the last incorrect row gone, and its recording with it
  os.remove(os.path.join(folder, f"{rows[-1]['filename']}.wav"))
  refused(rf"gold\.csv: 8 correct==1 rows against 7 correct==0 rows, so {rows[-2]['filename']} \(line 16\) is unpaired")
  shutil.copy(os.path.join(folder, f"{rows[0]['filename']}.wav"), os.path.join(folder, "stray.wav"))
  refused(r"english/dev/stray\.wav is not in .*gold\.csv: every recording of the subset is scored")
  os.remove(os.path.join(folder, "stray.wav"))
  write_gold(gold, rows)  # the row is back, its recording is not
  refused(rf"gold\.csv:17: {rows[-1]['filename']}\.wav is not in .*english/dev")
  with open(gold, "wb") as f:
    f.write(b"filename,correct\n\xff\xfe,1\n")
  refused(r"gold\.csv is not a UTF-8 CSV file \('utf-8' codec can't decode byte 0xff")
  with pytest.raises(ReleaseError, match=r"english/test/gold\.csv does not exist \(is --manual_dir the ProsAudit"):
    read_questions("prosaudit_test", root)


@pytest.mark.slow
def test_prosaudit_builds_and_scores_as_the_toolkit_from_its_scores_file(release, tmp_path):
  """Built and scored S->S under the utterance protocol by a unit LM; metrics.json against zrc's arithmetic over
  scores.jsonl: score = minus the summed NLL, a pair 1 / 0.5 (tie) / 0, the mean per (type, id), then per type n,
  mean and std (ddof 1), the accuracy the mean over (type, id). One pair is made a tie (the same recording twice)."""
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.builds import Variants
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare
  from tests.test_spoken_storycloze import unit_lm

  root, rows = release
  folder = os.path.join(root, "english/dev")
  shutil.copy(os.path.join(folder, f"{rows[0]['filename']}.wav"), os.path.join(folder, f"{rows[1]['filename']}.wav"))
  spec, _, ckpt = unit_lm(tmp_path)
  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  prepare("prosaudit_dev", str(spec), "s2s", 1024, data, manual_dir=root, variants=Variants(protocol="utterance"))
  run(EvalConfig(tasks=("prosaudit_dev",), modalities=("s2s",), protocols=("utterance",), checkpoints=ckpt,
                 spec=str(spec), data_dir=data, output_dir=out, row_length=1024, chunk_rows=4,
                 scoring=ScoringOptions(batch_size=4)))

  lines = [json.loads(line) for line in open(os.path.join(out, "unit_lm", "prosaudit_dev-s2s_utterance.scores.jsonl"))]
  assert len(lines) == 16 and all(line["labels"]["type"] in ("lexical", "protosyntax") for line in lines)
  score = {(line["question"], line["candidate"]): -line["nll_sum"] for line in lines}
  labels = {line["question"]: line["labels"] for line in lines}
  pair = {q: 1.0 if score[q, 0] > score[q, 1] else 0.5 if score[q, 0] == score[q, 1] else 0.0 for q in labels}
  assert pair[rows[0]["filename"]] == 0.5  # the tie
  groups = {}
  for q, value in pair.items():
    groups.setdefault((labels[q]["type"], labels[q]["id"]), []).append(value)
  means = {key: sum(v) / len(v) for key, v in groups.items()}
  metrics = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]["prosaudit_dev"]["s2s_utterance"]
  assert metrics["accuracy"] == pytest.approx(sum(means.values()) / 4) and metrics["ties"] == 1
  assert list(metrics["by_type"]) == ["lexical", "protosyntax"]
  for kind in ("lexical", "protosyntax"):
    values = [m for (t, _), m in means.items() if t == kind]
    assert metrics["by_type"][kind] == pytest.approx(
      {"n": 2, "accuracy": sum(values) / 2, "std": statistics.stdev(values)})
