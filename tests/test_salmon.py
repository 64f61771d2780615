"""SALMon's parts read as its scorer reads them (slp-rl/salmon salmon.py, SlamKit's modelling_metric.py): each
part's sample_<i>_<j>.wav grouped by i, sorted, the first the positive; scored by each recording's mean NLL,
positive against negative with ties half, one accuracy per part; on a layout-faithful fixture spoken by espeak-ng."""

import json
import os
import shutil

import pytest

from s2sjax.data import task_registry
from tasks.release import ReleaseError, read_questions
from tests.neighbour_releases import SALMON_CHANGES, Speech, write_salmon


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
  return Speech(str(tmp_path_factory.mktemp("clips")))


def test_every_part_is_a_task_reading_its_folder_sample_by_sample(tmp_path, speech):
  root = write_salmon(str(tmp_path / "salmon"), speech)
  for part in SALMON_CHANGES:  # the eight folders of salmon.py's "all" (salmon.py:78-87), one task each
    questions = read_questions(f"salmon_{part}", root)
    assert [q.id for q in questions] == ["0", "1", "2"]
    assert [q.uttids for q in questions] == [(f"sample_{i}_0", f"sample_{i}_1") for i in range(3)]
    assert questions[1].candidate_audio_paths == tuple(os.path.join(root, part, f"sample_1_{j}.wav") for j in (0, 1))
  assert task_registry.get("salmon_bg_domain_consistency").title == "SALMon Background Consistency (In-Domain)"


def test_samples_come_in_number_order_and_a_wrong_layout_is_one_line_naming_the_file(tmp_path, speech):
  root = write_salmon(str(tmp_path / "salmon"), speech, parts=("speaker_consistency",))
  folder = os.path.join(root, "speaker_consistency")
  for j in (0, 1):  # sample 10 sorts after 2 as a number, before it as text
    shutil.copy(os.path.join(folder, f"sample_0_{j}.wav"), os.path.join(folder, f"sample_10_{j}.wav"))
  assert [q.id for q in read_questions("salmon_speaker_consistency", root)] == ["0", "1", "2", "10"]

  def refused(match, task="salmon_speaker_consistency"):
    with pytest.raises(ReleaseError, match=match) as raised:
      read_questions(task, root)
    assert "\n" not in str(raised.value)

  os.remove(os.path.join(folder, "sample_10_1.wav"))
  refused(r"speaker_consistency: sample 10 \(sample_10_0\.wav\) has no negative: a sample is one positive and one")
  shutil.copy(os.path.join(folder, "sample_0_0.wav"), os.path.join(folder, "sample_10_1.wav"))
  shutil.copy(os.path.join(folder, "sample_0_0.wav"), os.path.join(folder, "sample_10_2.wav"))
  refused(r"sample 10 \(sample_10_0\.wav, sample_10_1\.wav, sample_10_2\.wav\) has 3 recordings")
  os.remove(os.path.join(folder, "sample_10_2.wav"))
  shutil.copy(os.path.join(folder, "sample_0_0.wav"), os.path.join(folder, "positive.wav"))
  refused(r"speaker_consistency/positive\.wav: a SALMon recording is named sample_<i>_<j>\.wav")
  refused(r"gender_consistency does not exist: a SALMon task reads that part's folder", "salmon_gender_consistency")


@pytest.mark.slow
def test_two_parts_build_and_score_as_salmon_from_their_scores_files(tmp_path, speech):
  """Two parts scored S->S under the utterance protocol by a unit LM; each part's accuracy in metrics.json against
  salmon.py's arithmetic over scores.jsonl: the mean NLL of each recording, 1 / 0.5 (tie) / 0, the mean over samples.
  One sample is made a tie (its positive recorded twice)."""
  from s2sjax.commands.eval import EvalConfig, run
  from s2sjax.data.builds import Variants
  from s2sjax.scoring.evaluator import ScoringOptions
  from tasks.preparation import prepare
  from tests.test_spoken_storycloze import unit_lm

  parts = ("speaker_consistency", "bg_alignment")
  root = write_salmon(str(tmp_path / "salmon"), speech, parts=parts)
  tied = os.path.join(root, "bg_alignment")
  shutil.copy(os.path.join(tied, "sample_2_0.wav"), os.path.join(tied, "sample_2_1.wav"))
  spec, _, ckpt = unit_lm(tmp_path)
  data, out = str(tmp_path / "data"), str(tmp_path / "out")
  tasks = tuple(f"salmon_{part}" for part in parts)
  for task in tasks:
    prepare(task, str(spec), "s2s", 1024, data, manual_dir=root, variants=Variants(protocol="utterance"))
  run(EvalConfig(tasks=tasks, modalities=("s2s",), protocols=("utterance",), checkpoints=ckpt, spec=str(spec),
                 data_dir=data, output_dir=out, row_length=1024, chunk_rows=4, scoring=ScoringOptions(batch_size=4)))

  saved = json.load(open(os.path.join(out, "metrics.json")))["runs"][0]["tasks"]
  for task in tasks:
    lines = [json.loads(line) for line in open(os.path.join(out, "unit_lm", f"{task}-s2s_utterance.scores.jsonl"))]
    assert len(lines) == 6
    likelihood = {(line["question"], line["candidate"]): -line["nll_sum"] / line["n_tokens"] for line in lines}
    decided = [1.0 if likelihood[q, 0] > likelihood[q, 1] else 0.5 if likelihood[q, 0] == likelihood[q, 1] else 0.0
               for q in ("0", "1", "2")]
    assert saved[task]["s2s_utterance"]["accuracy"] == pytest.approx(sum(decided) / 3)
    assert saved[task]["s2s_utterance"]["ties"] == (1 if task == "salmon_bg_alignment" else 0)
  assert "SALMon Speaker Consistency" in open(os.path.join(out, "table.md")).read()
