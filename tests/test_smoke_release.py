"""The smoke release (`s2sjax.eval --smoke`): the bundled sample's first questions of every task with text, in the
release layout, read by the same readers as the whole sample."""

import os

from tasks.release import read_questions
from tasks.sample import RELEASE_DIR
from tasks.sample.smoke import QUESTIONS, smoke_tasks, write_smoke_release


def test_the_smoke_release_holds_the_first_questions_of_each_task_with_their_recordings(tmp_path):
  assert smoke_tasks() == ["sstorycloze", "zh_sstorycloze", "scmmlu", "tstorycloze"]  # not the spoken-only ones
  out = write_smoke_release(str(tmp_path / "smoke"))
  assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]
  for task in smoke_tasks():
    smoke, whole = read_questions(task, out), read_questions(task, RELEASE_DIR)
    assert len(smoke) == QUESTIONS == 2
    for mine, theirs in zip(smoke, whole):  # the same questions, text and answer, reading their own copies
      assert (mine.uttids, mine.prefixes, mine.candidates, mine.correct) == (
        theirs.uttids, theirs.prefixes, theirs.candidates, theirs.correct)
      mine_wavs, their_wavs = mine.audio_paths + mine.candidate_audio_paths, theirs.audio_paths + theirs.candidate_audio_paths
      assert len(mine_wavs) == len(their_wavs) and all(path.startswith(out) for path in mine_wavs)
      assert all(open(a, "rb").read() == open(b, "rb").read() for a, b in zip(mine_wavs, their_wavs))
  # only the recordings the kept lines name: two stories' first parts (lines 2k and 2k+1 share one) and endings
  assert len(os.listdir(os.path.join(out, "StoryCloze", "s-story-firstspeech"))) == 4
  assert len(os.listdir(os.path.join(out, "cmmlu", "cmmlu_rewrite_options"))) == 8


def test_an_existing_smoke_release_is_kept(tmp_path):
  out = write_smoke_release(str(tmp_path / "smoke"))
  marker = os.path.join(out, "kept")
  open(marker, "w").close()
  assert write_smoke_release(out) == out and os.path.exists(marker)
