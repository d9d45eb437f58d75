"""TFDS builders: prepared as array_record and read back by random access, no TensorFlow."""

import importlib.util
import json
import os
import sys
import types
from unittest import mock

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from jaxrl_scale.data import records  # noqa: E402
from jaxrl_scale.data import tasks  # noqa: E402
from jaxrl_scale.data import tfds_builders  # noqa: E402
from jaxrl_scale.errors import UserError  # noqa: E402

tfds.display_progress_bar(False)

_HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None


def _small_arithmetic(name="t_d3", **kw):
  return tfds_builders.ArithmeticConfig(name=name, digits=3, num_train=40, num_test=10, **kw)


def test_builtin_prepares_array_record_and_reads_back(tmp_path):
  data_dir = str(tmp_path)
  train = tfds_builders.builtin("arithmetic", _small_arithmetic(), data_dir=data_dir)
  test = tfds_builders.builtin("arithmetic", _small_arithmetic(), data_dir=data_dir,
                               split="test")
  prepared = tmp_path / "jaxrl_arithmetic" / "t_d3" / "1.0.0"
  assert sorted(p.name for p in prepared.glob("*.array_record*")) == [
      "jaxrl_arithmetic-test.array_record-00000-of-00001",
      "jaxrl_arithmetic-train.array_record-00000-of-00001"]
  # The data path must not need TensorFlow (not a dependency of jaxrl_scale).
  assert _HAS_TENSORFLOW or "tensorflow" not in sys.modules
  expected = tasks.arithmetic(50, 0, digits=3)
  by_id = lambda rs: sorted(rs, key=lambda r: r["id"])  # noqa: E731
  assert by_id(train[:]) == expected[:40]
  assert by_id(test.get_many(list(range(len(test))))) == expected[40:]
  assert train[3] == train.get_many([3])[0]


def test_named_configs_and_countdown(tmp_path):
  assert list(tfds_builders.JaxrlArithmetic.builder_configs) == ["d1", "d2", "d3", "d4", "add2"]
  assert list(tfds_builders.JaxrlCountdown.builder_configs) == ["n3", "n4"]
  d1 = tfds_builders.builtin("arithmetic", "d1", data_dir=str(tmp_path))
  assert len(d1) == 200 and all(len(r["prompt"]) == 4 for r in d1[:])
  builder = tfds.builder("jaxrl_arithmetic/d1", data_dir=str(tmp_path))  # registered by name
  assert builder.is_prepared() and builder.info.splits["test"].num_examples == 50
  config = tfds_builders.CountdownConfig(name="t_n4", count=4, max_number=20, max_target=200,
                                         num_train=30, num_test=0)
  cd = tfds_builders.builtin("countdown", config, data_dir=str(tmp_path))
  assert sorted(cd[:], key=lambda r: r["id"]) == tasks.countdown(
      30, 0, count=4, max_number=20, max_target=200)
  with pytest.raises(UserError, match=r"jaxrl_countdown: no split 'test'"):
    tfds_builders.builtin("countdown", config, data_dir=str(tmp_path), split="test")
  with pytest.raises(UserError, match=r"no config 'd7'"):
    tfds_builders.builtin("arithmetic", "d7", data_dir=str(tmp_path))


def test_local_file_builder_matches_direct_read(tmp_path):
  path = tmp_path / "prompts.jsonl"
  rows = [{"problem": f"P{i}", "solution": f"so \\boxed{{{i}}}", "uid": f"u{i}"} for i in range(8)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  fields = records.FieldMap(prompt_field="problem", answer_field="solution", id_field="uid",
                            answer_format="boxed")
  view = tfds_builders.local_file(str(path), fields, data_dir=str(tmp_path / "tfds"))
  assert sorted(view[:], key=lambda r: r["id"]) == records.read_local(str(path), fields)
  assert view.origin == str(path)
  # Editing the file prepares it afresh under a new config name, never stale records.
  name = tfds_builders.local_file_config(str(path), fields).name
  path.write_text(path.read_text() + json.dumps({"problem": "P8", "solution": "\\boxed{8}",
                                                  "uid": "u8"}) + "\n")
  os.utime(path, ns=(1, 1))
  assert tfds_builders.local_file_config(str(path), fields).name != name
  assert len(tfds_builders.local_file(str(path), fields, data_dir=str(tmp_path / "tfds"))) == 9


def test_local_file_errors_surface_as_user_errors(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
  with pytest.raises(UserError, match=r"bad.jsonl: row 2: no field 'answer'"):
    tfds_builders.local_file(str(path), records.FieldMap(), data_dir=str(tmp_path / "tfds"))
  with pytest.raises(UserError, match=r"nope.jsonl: no such file"):
    tfds_builders.local_file(str(tmp_path / "nope.jsonl"), records.FieldMap(),
                             data_dir=str(tmp_path))


def _fake_downloads(result):
  return mock.patch.object(tfds.download.DownloadManager, "download_and_extract",
                           lambda self, urls: result(urls))


def test_gsm8k_through_the_real_tfds_builder(tmp_path):
  rows = [{"question": f"Tom has {i} apples and buys {i}. How many now?",
           "answer": f"{i}+{i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"} for i in range(1, 6)]
  files = {}
  for split in ("train", "test", "train_socratic", "test_socratic"):
    files[split] = tmp_path / f"{split}.jsonl"
    files[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
  with _fake_downloads(lambda urls: {k: str(files[k]) for k in urls}):
    view = tfds_builders.tfds_dataset("gsm8k", data_dir=str(tmp_path / "tfds"))
  got = sorted(view[:], key=lambda r: int(r["answer"]))
  assert got == [records.gsm8k_record(r) for r in rows]
  assert got[0]["solution"] == "1+1 = 2\nThe answer is \\boxed{2}."
  # Prepared once: reading again needs no download.
  with _fake_downloads(lambda urls: pytest.fail("downloaded twice")):
    assert len(tfds_builders.tfds_dataset("gsm8k", data_dir=str(tmp_path / "tfds"),
                                          split="test")) == 5


def test_math_dataset_through_the_real_tfds_builder(tmp_path):
  root = tmp_path / "extracted"
  for category, offset in (("train-easy", 0), ("interpolate", 100)):
    folder = root / "mathematics_dataset-v1.0" / category
    folder.mkdir(parents=True)
    (folder / "arithmetic__mul.txt").write_text(
        "".join(f"What is {i} times 3?\n{3 * i}\n" for i in range(offset + 1, offset + 4)))
  data_dir = str(tmp_path / "tfds")
  name = "math_dataset/arithmetic__mul"
  with _fake_downloads(lambda url: str(root)):
    # TFDS's math_dataset builder calls tf.io.gfile: preparing it needs TensorFlow.
    if not _HAS_TENSORFLOW:
      with pytest.raises(UserError, match=r"tfds:math_dataset/arithmetic__mul: preparing this "
                                          r"dataset needs tensorflow"):
        tfds_builders.tfds_dataset(name, data_dir=data_dir)
    # With TensorFlow's one call stood in for, the same loading code prepares and reads it.
    from tensorflow_datasets.datasets.math_dataset import math_dataset_dataset_builder as mdb
    gfile = types.SimpleNamespace(exists=os.path.exists)
    with mock.patch.object(mdb, "tf", types.SimpleNamespace(io=types.SimpleNamespace(
        gfile=gfile))):
      view = tfds_builders.tfds_dataset(name, data_dir=data_dir)
  assert sorted((r["prompt"], r["answer"]) for r in view[:]) == [
      (f"What is {i} times 3?", str(3 * i)) for i in (1, 2, 3)]
  test = tfds_builders.tfds_dataset(name, data_dir=data_dir, split="test")
  assert {r["answer"] for r in test[:]} == {"303", "306", "309"}


def test_tfds_dataset_errors(tmp_path):
  with pytest.raises(UserError, match=r"tfds:no_such_dataset_xyz: "):
    tfds_builders.tfds_dataset("no_such_dataset_xyz", data_dir=str(tmp_path),
                               fields=records.FieldMap())
  with pytest.raises(UserError, match=r"tfds:mnist: not a known dataset .* give prompt_field"):
    tfds_builders.tfds_dataset("mnist", data_dir=str(tmp_path))
  with _fake_downloads(lambda urls: (_ for _ in ()).throw(OSError("network is unreachable"))):
    with pytest.raises(UserError, match=r"tfds:gsm8k: download_and_prepare .* failed "
                                        r"\(network is unreachable\)"):
      tfds_builders.tfds_dataset("gsm8k", data_dir=str(tmp_path))

  def extraction_without_tensorflow(urls):
    try:
      raise ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    except ModuleNotFoundError as e:  # what TFDS's extractor raises without TensorFlow
      raise RuntimeError("Error while extracting math.tar.gz") from e

  with _fake_downloads(extraction_without_tensorflow):
    with pytest.raises(UserError, match=r"tfds:math_dataset/algebra__linear_1d: preparing "
                                        r"this dataset needs tensorflow"):
      tfds_builders.tfds_dataset("math_dataset/algebra__linear_1d", data_dir=str(tmp_path))


def test_any_tfds_dataset_through_a_field_map(tmp_path):
  # Our own registered builder stands in for an arbitrary catalog dataset.
  tfds_builders.builtin("arithmetic", "d1", data_dir=str(tmp_path))
  fields = records.FieldMap(prompt_field="prompt", answer_field="solution", task="arithmetic")
  view = tfds_builders.tfds_dataset("jaxrl_arithmetic/d1", data_dir=str(tmp_path),
                                    split="test", fields=fields)
  assert len(view) == 50
  assert view[7] == {"id": "jaxrl_arithmetic_d1-7", "task": "arithmetic",
                     "prompt": view[7]["prompt"], "answer": view[7]["answer"],
                     "solution": "The answer is \\boxed{%s}." % view[7]["answer"]}
  bad = records.FieldMap(prompt_field="question")
  with pytest.raises(UserError, match=r"tfds:jaxrl_arithmetic/d1 train: row 0: no field "
                                      r"'question'"):
    tfds_builders.tfds_dataset("jaxrl_arithmetic/d1", data_dir=str(tmp_path), fields=bad)[0]
