"""tasks/: the three benchmarks build in both modalities, rows round-trip to their source lines, bad input fails
clearly (or is left out and listed with --skip_bad)."""

import json
import os
import shutil

import numpy as np
import pytest
from transformers import AutoTokenizer

from s2sjax.data import task_registry
from s2sjax.data.packing import Item, PackingError, RowShape
from tasks.audio.base import AudioError, load_audio
from tasks.audio.mel_kmeans import MelKmeansTokenizer
from tasks.build import QuestionEncoder, build_rows
from tasks.preparation import prepare
from tasks.release import Problems, Question, ReleaseError, read_questions
from tasks.sample import MEL_KMEANS_CODEBOOK, RELEASE_DIR
from tasks.sample.smoke import smoke_tasks
from s2sjax.data.spec import Spec, SpecError, available_specs, load_spec, resolve_audio_ids
from s2sjax.data.task_data import load_rows


def _slot_targets(rows, item, candidate):
  """Target ids of one (item, candidate) slot, wherever the packer put it."""
  r, s = np.argwhere((rows["slot_item"] == item) & (rows["slot_candidate"] == candidate))[0]
  return rows["target_ids"][r][rows["target_slot"][r] == s]


def _source_lines(task):
  with open(os.path.join(RELEASE_DIR, task_registry.get(task).release_jsonl), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("task, modality", [(task, modality) for task in smoke_tasks() for modality in ("t2t", "s2t")]
                         + [("sstorycloze", "t2s"), ("scmmlu", "s2s")])
def test_bundled_sample_builds_and_round_trips(tmp_path_factory, task, modality, qwen_tokenizer_dir):
  data_dir = str(tmp_path_factory.getbasetemp() / "data")
  metadata = prepare(task, "demo", modality, 1024, data_dir, tokenizer_dir=qwen_tokenizer_dir)
  rows, stored = load_rows(data_dir, task, f"demo-{modality}-1024")
  assert stored.report == metadata.report and metadata.report["questions"] == 24
  assert metadata.report["rows"] >= 1 and metadata.tokenizer["size"] > 150_000
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  lines = {str(line["uttid"]): line for line in _source_lines(task)}
  separator = " " if (modality == "t2t" and task_registry.get(task).language == "en") else ""
  # the demo spec's units: mel k-means units of each recording, de-duplicated, as ids 49152 + k
  units = lambda folder, name: 49152 + MelKmeansTokenizer(MEL_KMEANS_CODEBOOK, True).encode(
    load_audio(os.path.join(RELEASE_DIR, folder, f"{name}.wav"), 16000), name)[:, 0]
  record = task_registry.get(task)
  for question in metadata.questions:
    for c, (item, j) in enumerate(question["slots"]):
      if modality.endswith("2t"):
        assert tokenizer.decode(_slot_targets(rows, item, j)) == separator + question["candidates"][c]
      elif question is metadata.questions[0]:  # the spoken candidate's own units, exactly
        name = question["uttids"][c] if task != "scmmlu" else f"{question['uttids'][c]}_{'ABCD'[c]}"
        np.testing.assert_array_equal(_slot_targets(rows, item, j), units(record.release_candidate_audio_dir, name))
    # stories: 2k is right, 2k+1 wrong, and each candidate is its own line's ending
    if task_registry.get(task).release_format == "story_pairs":
      right, wrong = (lines[u] for u in question["uttids"])
      assert question["correct"] == 0 and question["candidates"] == [right["last"], wrong["last"]]
      assert int(question["uttids"][1].split("_")[0]) == int(question["uttids"][0].split("_")[0]) + 1
    else:
      line = lines[question["id"]]
      assert question["candidates"] == [line[o] for o in "ABCD"] and "ABCD"[question["correct"]] == line["answer"]
  if modality.startswith("s"):  # the prefix carries exactly the recording's units, after the instruction
    question = metadata.questions[3]
    item = question["slots"][0][0]
    r, s = np.argwhere(rows["slot_item"] == item)[0]
    segment = rows["segment_ids"][r][rows["target_pos"][r][rows["target_slot"][r] == s][0]]
    prefix = rows["tokens"][r][(rows["segment_ids"][r] == segment) & (rows["branch_ids"][r] == 0)]
    expected = units(record.release_audio_dir, question["uttids"][0])
    np.testing.assert_array_equal(prefix[-len(expected):], expected)
    assert metadata.audio_tokenizer["fingerprint"] == MelKmeansTokenizer(MEL_KMEANS_CODEBOOK, True).fingerprint()


def _encoder(qwen_tokenizer_dir, modality="t2t", spec="demo", quirk=False):
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  settings = load_spec(spec).audio_tokenizer
  audio = MelKmeansTokenizer(MEL_KMEANS_CODEBOOK, settings["dedup"]) if modality != "t2t" else None
  return QuestionEncoder(load_spec(spec), modality, tokenizer, audio, "zh" if quirk else None), tokenizer


def test_tokenization_boundary_rule(qwen_tokenizer_dir):
  """Prefix and candidate are tokenized apart; the candidate keeps its leading space; nothing straddles."""
  encoder, tokenizer = _encoder(qwen_tokenizer_dir)
  question = read_questions("sstorycloze", RELEASE_DIR)[0]
  prefix, _, _ = encoder.prefix(question, 0)
  candidate, _ = encoder.candidate(question, 0)
  assert tokenizer.decode(candidate) == " " + question.candidates[0]
  assert tokenizer.decode(np.concatenate([prefix, candidate])) == question.prefixes[0] + " " + question.candidates[0]
  quirky, _ = _encoder(qwen_tokenizer_dir, quirk=True)  # S2SBench's code: zh rules everywhere, so no space
  assert tokenizer.decode(quirky.candidate(question, 0)[0]) == question.candidates[0]
  speech, _ = _encoder(qwen_tokenizer_dir, "s2t", quirk=True)
  ids, codes, seconds = speech.prefix(question, 0)
  instruction = tokenizer("下面是一段语音和文本交错的内容：")["input_ids"]
  assert ids[: len(instruction)].tolist() == instruction and codes is None and seconds > 1
  assert (ids[len(instruction):] >= 49152).all() and (ids[len(instruction):] < 49152 + 256).all()


def _write_release(root, stories=None, cmmlu=None, wav_from=None):
  """A release-layout fixture with real speech copied from the bundled sample."""
  wav_from = wav_from or os.path.join(RELEASE_DIR, task_registry.get("sstorycloze").release_audio_dir, "0.wav")
  for task, lines in (("sstorycloze", stories), ("scmmlu", cmmlu)):
    if lines is None:
      continue
    record = task_registry.get(task)
    os.makedirs(os.path.join(root, record.release_audio_dir), exist_ok=True)
    with open(os.path.join(root, record.release_jsonl), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    for line in lines:
      shutil.copy(wav_from, os.path.join(root, record.release_audio_dir, f"{line['uttid']}.wav"))
  return root


def _stories(n=3):
  return [{"uttid": f"{k}_x", "first": "Tom went out.", "last": "He came back." if k % 2 == 0 else "Fish sang."}
          for k in range(2 * n)]


def _cmmlu(n=3):
  return [{"uttid": k, "first": "水的沸点是", "A": "一百度。", "B": "十度。", "C": "零度。", "D": "五度。", "answer": "A"}
          for k in range(n)]


@pytest.mark.slow
def test_release_fixture_builds_every_task_in_both_modalities(tmp_path, qwen_tokenizer_dir):
  root = _write_release(str(tmp_path), _stories(), _cmmlu())
  for task in ("sstorycloze", "scmmlu"):
    for modality in ("t2t", "s2t"):
      metadata = prepare(task, "demo", modality, 1024, str(tmp_path / "data"), manual_dir=root,
                         tokenizer_dir=qwen_tokenizer_dir)
      assert metadata.report["questions"] == 3 and metadata.source == root


@pytest.mark.parametrize("lines,message", [
  (_stories()[:-1], r"odd number of story lines \(5\)"),
  (_stories()[:2] + _stories()[3:], r"uttid 3_x: has no partner 2"),
  (_stories() + [dict(_stories()[0])], r"duplicate uttid 0_x"),
  ([dict(_stories()[0], last="  ")] + _stories()[1:], r"uttid 0_x: empty text in \['last'\]"),
  ([dict(_stories()[0], uttid="abc")] + _stories()[1:], r"uttid 'abc' does not start with an integer"),
])
def test_broken_story_files_name_the_problem(tmp_path, lines, message):
  root = _write_release(str(tmp_path), stories=lines)
  with pytest.raises(ReleaseError, match=message):
    read_questions("sstorycloze", root)


def test_answer_outside_a_to_d(tmp_path):
  root = _write_release(str(tmp_path), cmmlu=[dict(_cmmlu()[0], answer="E")] + _cmmlu()[1:])
  with pytest.raises(ReleaseError, match=r"uttid 0: answer 'E' is not one of A, B, C, D"):
    read_questions("scmmlu", root)


def test_missing_unreadable_and_overlong_audio(tmp_path, qwen_tokenizer_dir):
  root = _write_release(str(tmp_path), stories=_stories(4))
  audio_dir = os.path.join(root, task_registry.get("sstorycloze").release_audio_dir)
  os.remove(os.path.join(audio_dir, "2_x.wav"))
  with open(os.path.join(audio_dir, "4_x.wav"), "wb") as f:
    f.write(b"RIFF not really a wav")
  long_wave = np.tile(load_audio(os.path.join(audio_dir, "0_x.wav"), 16000), 8)
  import soundfile

  soundfile.write(os.path.join(audio_dir, "6_x.wav"), long_wave, 16000)
  encoder, _ = _encoder(qwen_tokenizer_dir, "s2t", spec="demo_tables")
  questions = read_questions("sstorycloze", root)
  shape = RowShape.for_length(1024, 1)
  with pytest.raises(AudioError, match=r"audio file .*2_x\.wav does not exist"):
    build_rows(questions, encoder, shape)
  with pytest.raises(AudioError, match=r"audio file .*4_x\.wav cannot be read"):
    build_rows(questions[2:], encoder, shape)
  with pytest.raises(ValueError, match=r"question 6_x: \d+ prefix \+ \d+ candidate tokens laid exceed the row length 1024"):
    build_rows(questions[3:], encoder, shape)
  rows, table, report = build_rows(questions, encoder, shape, skip_bad=True)
  assert list(table.ids) == ["0_x"] and report["skipped"] == 3
  assert [s["where"] for s in report["skipped_questions"]] == ["question 2_x", "question 4_x", "question 6_x"]
  # or keep the long one, its spoken prefix cut from the left to fit, and say so
  rows, table, report = build_rows([questions[0], questions[3]], encoder, shape, overlong="truncate_prefix")
  assert list(table.ids) == ["0_x", "6_x"] and report["truncated_items"] == 1
  assert report["truncated_prefix_tokens"] > 500 and report["skipped"] == 0


def test_skip_bad_lists_release_problems_too(tmp_path, qwen_tokenizer_dir):
  root = _write_release(str(tmp_path), stories=_stories()[:-1])  # 5_x missing: story 4_x is broken
  metadata = prepare("sstorycloze", "demo", "text", 1024, str(tmp_path / "data"), manual_dir=root,
                     tokenizer_dir=qwen_tokenizer_dir, skip_bad=True)
  report = metadata.report
  assert report["questions"] == 2 and report["skipped"] == 1  # the line left out, not the file-level note
  assert report["skipped_questions"] == [
    {"where": "sStory_s2t.jsonl:5 uttid 4_x", "why": "has no partner 5 (wrong ending 2k+1): broken pair"}]
  assert report["file_problems"] == [
    {"where": "sStory_s2t.jsonl", "why": "odd number of story lines (5): every story needs 2k and 2k+1"}]


def test_a_shared_story_number_leaves_out_every_line_that_shares_it(tmp_path):
  """0_x and 0_y both claim story 0: which one pairs with 1_x cannot be told, so neither is built, nor is 1_x."""
  root = _write_release(str(tmp_path), stories=_stories()[:1] + [dict(_stories()[0], uttid="0_y")] + _stories()[1:])
  problems = Problems()
  questions = read_questions("sstorycloze", root, problems=problems)
  assert [q.id for q in questions] == ["2_x", "4_x"]
  assert problems.entries == [
    ("sStory_s2t.jsonl:1 uttid 0_x", "its number 0 is shared by uttids ['0_x', '0_y']: all left out"),
    ("sStory_s2t.jsonl:2 uttid 0_y", "its number 0 is shared by uttids ['0_x', '0_y']: all left out"),
    ("sStory_s2t.jsonl:3 uttid 1_x", "has no partner 0 (right ending 2k): broken pair"),
  ]
  assert problems.file_entries == [("sStory_s2t.jsonl", "odd number of story lines (7): every story needs 2k and 2k+1")]
  root = _write_release(str(tmp_path / "same_uttid"), cmmlu=_cmmlu() + [dict(_cmmlu()[1], answer="B")])
  problems = Problems()  # the same uttid twice: every copy is left out, not the first kept
  assert [q.id for q in read_questions("scmmlu", root, problems=problems)] == ["0", "2"]
  assert [where for where, _ in problems.entries] == ["cmmlu_rewrite_4.jsonl:2 uttid 1",
                                                      "cmmlu_rewrite_4.jsonl:4 uttid 1"]
  assert all("duplicate uttid 1 (lines [2, 4]): every copy left out" == why for _, why in problems.entries)


def test_lines_that_are_not_objects_or_not_text_are_named_by_file_and_line(tmp_path):
  root = _write_release(str(tmp_path), stories=_stories(4))
  jsonl = os.path.join(root, task_registry.get("sstorycloze").release_jsonl)
  lines = open(jsonl, encoding="utf-8").read().splitlines()
  lines[1] = "5"
  lines[2] = json.dumps(dict(_stories()[2], first=None))
  lines[3] = json.dumps(dict(_stories()[3], last=3))
  lines[4] = json.dumps(dict(_stories()[4], uttid=None))
  with open(jsonl, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with pytest.raises(ReleaseError, match=r"has 6 problem\(s\)") as raised:
    read_questions("sstorycloze", root)
  expected = [
    ("sStory_s2t.jsonl:2", "not a JSON object (got int)"),
    ("sStory_s2t.jsonl:3 uttid 2_x", 'not text: {"first": null}'),
    ("sStory_s2t.jsonl:4 uttid 3_x", 'not text: {"last": 3}'),
    ("sStory_s2t.jsonl:5", "uttid null is neither an integer nor a string"),
  ]
  assert all(f"{where}: {why}" in str(raised.value) for where, why in expected)
  problems = Problems()  # skip_bad: the same problems, listed, and only the intact story built
  assert [q.id for q in read_questions("sstorycloze", root, problems=problems)] == ["6_x"]
  assert problems.entries[:4] == expected
  assert [why for _, why in problems.entries[4:]] == ["has no partner 1 (wrong ending 2k+1): broken pair",
                                                      "has no partner 4 (right ending 2k): broken pair"]


def test_every_preset_loads_and_special_tokens_are_checked(qwen_tokenizer_dir):
  assert set(available_specs()) >= {"demo", "qwen2.5", "baichuan_audio", "glm4_voice", "twist", "sims"}
  assert load_spec("baichuan_audio").codebook_sizes == (8192, 4096, 2048, 1024, 1024, 1024, 1024, 1024)
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  with pytest.raises(SpecError, match=r"unit token '<\|audio_0\|>' is not in the tokenizer's vocabulary"):
    resolve_audio_ids(load_spec("glm4_voice"), tokenizer)
  tokenizer.add_tokens([f"<|audio_{k}|>" for k in range(16384)] + ["<|begin_of_audio|>", "<|end_of_audio|>"])
  ids = resolve_audio_ids(load_spec("glm4_voice"), tokenizer)
  assert ids.unit_ids[5] == tokenizer.convert_tokens_to_ids("<|audio_5|>") and ids.start is not None
  with pytest.raises(SpecError, match="no spec 'nope'"):
    load_spec("nope")


def test_extended_vocab_rows_carry_the_unit_tokens(tmp_path, qwen_tokenizer_dir):
  """GLM-4-Voice style: precomputed single-codebook units become <|audio_k|> tokens between begin/end of audio."""
  from tasks.audio.precomputed import PrecomputedTokenizer

  root = _write_release(str(tmp_path / "release"), cmmlu=_cmmlu(2))
  codes_dir = tmp_path / "codes"
  codes_dir.mkdir()
  rng = np.random.default_rng(0)
  codes = {str(k): rng.integers(0, 16384, (30 + k, 1)) for k in range(2)}
  for uttid, c in codes.items():
    np.save(codes_dir / f"{uttid}.npy", c)
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  tokenizer.add_tokens([f"<|audio_{k}|>" for k in range(16384)] + ["<|begin_of_audio|>", "<|end_of_audio|>"])
  encoder = QuestionEncoder(load_spec("glm4_voice"), "s2t", tokenizer, PrecomputedTokenizer(str(codes_dir), (16384,)))
  questions = read_questions("scmmlu", root)
  rows, table, report = build_rows(questions, encoder, RowShape.for_length(1024))
  assert rows["audio_codes"].shape[-1] == 0  # extended vocab: the units are ordinary tokens
  for question in questions:
    ids, _, _ = encoder.prefix(question, 0)
    begin, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<|begin_of_audio|>", "<|end_of_audio|>"))
    units = ids[list(ids).index(begin) + 1 : list(ids).index(end)]
    assert tokenizer.convert_ids_to_tokens(units.tolist()) == [f"<|audio_{k}|>" for k in codes[question.id][:, 0]]
  assert report["questions"] == 2 and report["audio_seconds"] == 0.0


def _question(qid, prefix, candidates):
  return Question(id=qid, language="en", uttids=(qid,) * len(candidates), prefixes=(prefix,) * len(candidates),
                  audio_paths=("",) * len(candidates), candidates=tuple(candidates), correct=0)


def test_questions_the_packer_cannot_fit_are_named_or_skipped(qwen_tokenizer_dir):
  """The packer's rules are checked per question, where skip_bad can leave the question out: more candidate tokens
  than a row's targets, and (with truncate_prefix) a candidate too long for the row once the prefix is gone."""
  encoder, _ = _encoder(qwen_tokenizer_dir)
  good = _question("good", "Tom went out.", ["He came back.", "Fish sang."])
  wordy = _question("wordy", "Tom went out.", ["He came back " + "and sat down " * 6 + "at last.", "Fish sang."])
  narrow = RowShape(length=1024, max_targets=16, max_slots=4)
  with pytest.raises(PackingError, match=r"question wordy: .*exceeds? a row's 16 targets"):
    build_rows([good, wordy], encoder, narrow)
  rows, table, report = build_rows([good, wordy], encoder, narrow, skip_bad=True)
  assert list(table.ids) == ["good"] and report["skipped"] == 1
  assert report["skipped_questions"][0]["where"] == "question wordy"
  short = RowShape(length=16, max_targets=64, max_slots=4)
  alone = r"question wordy: its longest candidate \(\d+ tokens laid\) leaves no room for a prefix token in a row of 16"
  with pytest.raises(PackingError, match=alone):
    build_rows([good, wordy], encoder, short, overlong="truncate_prefix")
  rows, table, report = build_rows([good, wordy], encoder, short, skip_bad=True, overlong="truncate_prefix")
  assert list(table.ids) == ["good"]
  assert [s["where"] for s in report["skipped_questions"]] == ["question wordy"]
  assert report["rows"] == 1 and (rows["slot_item"] >= 0).sum() == 2


def test_units_are_tokenizer_ids_or_past_its_end_never_both(qwen_tokenizer_dir):
  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  spec = lambda offset: Spec(name="units", audio_mode="extended_vocab", audio_tokenizer={"type": "precomputed"},
                             codebook_sizes=(500,), unit_offset=offset)
  size = len(tokenizer)
  with pytest.raises(SpecError, match=rf"spec units: units {size - 499}..{size} straddle the end of the tokenizer's "
                                      rf"{size} tokens: some would be text tokens"):
    resolve_audio_ids(spec(size - 499), tokenizer)
  assert resolve_audio_ids(spec(size - 500), tokenizer).unit_ids[-1] == size - 1  # rows the tokenizer has
  assert resolve_audio_ids(spec(size), tokenizer).unit_ids[0] == size  # rows the model added past the text ones


def test_joint_tokenization_scores_what_s2sbench_s_reference_scores(qwen_tokenizer_dir):
  """`--tokenization=joint`: first + last tokenized as one string, the ids past tokenize(first) scored (S2SBench's
  reference rule); on the bundled sample's sCMMLU 3 of 96 candidates merge a token across the boundary."""
  from tasks.boundary_report import differs

  tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
  separate = QuestionEncoder(load_spec("demo"), "t2t", tokenizer, None)
  joint = QuestionEncoder(load_spec("demo"), "t2t", tokenizer, None, tokenization="joint")
  merged = 0
  for question in read_questions("scmmlu", RELEASE_DIR):
    for c, candidate in enumerate(question.candidates):
      whole = tokenizer(question.prefixes[c] + candidate)["input_ids"]
      first = tokenizer(question.prefixes[c])["input_ids"]
      prefix, scored = joint.prefix(question, c)[0], joint.candidate(question, c)[0]
      assert prefix.tolist() + scored.tolist() == whole and scored.tolist() == whole[len(first):]
      straddles = differs(tokenizer, question.prefixes[c], candidate)
      assert (scored.tolist() != separate.candidate(question, c)[0].tolist()) == straddles
      merged += straddles
  assert merged == 3
  with pytest.raises(ValueError, match=r"applies to t2t, not s2t"):
    QuestionEncoder(load_spec("demo"), "s2t", tokenizer, MelKmeansTokenizer(MEL_KMEANS_CODEBOOK), tokenization="joint")


@pytest.mark.slow
def test_a_build_without_a_row_length_chooses_it_and_the_evaluator_finds_it(tmp_path, qwen_tokenizer_dir):
  from s2sjax.data.packing import auto_row_length
  from s2sjax.data.task_data import load_task_data

  data_dir = str(tmp_path / "data")
  metadata = prepare("sstorycloze", "demo", "t2t", None, data_dir, tokenizer_dir=qwen_tokenizer_dir)
  encoder, _ = _encoder(qwen_tokenizer_dir)
  items = []
  for question in read_questions("sstorycloze", RELEASE_DIR):  # the items, laid independently of the build
    items.append(Item(encoder.prefix(question, 0)[0], tuple(encoder.candidate(question, c)[0] for c in range(2))))
  length = auto_row_length(items, True, 0.5)
  assert metadata.report["row_length"] == length == metadata.row_shape.length == 1024
  data = load_task_data(data_dir, "sstorycloze", "t2t", "demo", None)  # no length to repeat: the -auto build
  # the target table cut to the fullest row's targets (packing.fit), within the half row the packer could use
  used = int((data.rows["target_slot"] >= 0).sum(1).max())
  assert data.rows["tokens"].shape[1] == length and used <= data.shape.max_targets < used + 32 <= length // 2 + 32
  assert data.rows["target_ids"].shape[1] == data.shape.max_targets
  spoken = prepare("sstorycloze", "demo", "s2s", None, data_dir, tokenizer_dir=qwen_tokenizer_dir)
  # spoken candidates may fill a whole row with targets, and the fullest row uses more than text's half
  assert spoken.row_shape.length >= length and length // 2 < spoken.row_shape.max_targets <= spoken.row_shape.length
