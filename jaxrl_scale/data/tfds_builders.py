"""Prompt datasets through tensorflow-datasets, read back by random access without TensorFlow.

Builders defined here (registered with TFDS when this module is imported):
  jaxrl_arithmetic/{d1,d2,d3,d4}   built-in arithmetic, splits train and test (disjoint)
  jaxrl_countdown/{n3,n4}          built-in countdown, splits train and test (disjoint)
  jaxrl_code/{fn,easy,io}          built-in code task, splits train and test (disjoint)
  jaxrl_code_problems/<file_hash>  a local JSONL / Parquet file of code problems (DeepCoder,
                                   LiveCodeBench, APPS/TACO layouts; data/code_problems.py)
  jaxrl_local_prompts/<file_hash>  a local JSONL / Parquet file with configurable fields

Every builder is prepared with file_format="array_record" and read with
`builder.as_data_source()`: random access needs array_record and importlib_resources but
not TensorFlow. Outside datasets (`gsm8k`, `math_dataset/<module>`, or any TFDS text
dataset with a FieldMap) go through `tfds.builder(name, data_dir=...)` the same way; they
need a network once, to prepare. Known limit: TFDS's `math_dataset` preparation calls
tf.io.gfile (its builder and its tar.gz extractor), so preparing it needs TensorFlow
installed; reading an array_record preparation of it does not.

Records follow the contract of `jaxrl_scale.data.tasks`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow_datasets as tfds

from jaxrl_scale.data import code_problems
from jaxrl_scale.data import records as records_lib
from jaxrl_scale.data import tasks
from jaxrl_scale.errors import UserError

FILE_FORMAT = "array_record"


def _features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({k: tfds.features.Text() for k in tasks.RECORD_KEYS})


def _examples(records: list[dict[str, str]]):
  for record in records:
    yield record["id"], record


def _task_splits(task: str, params: dict[str, Any], num_train: int, num_test: int, seed: int):
  # One stream for both splits: records are distinct within a stream, so test never
  # repeats a train problem, and the train split does not depend on num_test.
  generated = tasks.generate(task, num_train + num_test, seed, **params)
  splits = {"train": _examples(generated[:num_train])}
  if num_test:
    splits["test"] = _examples(generated[num_train:])
  return splits


# Split sizes of the named configs (others: 5000 train / 500 test). d1 has only 300
# distinct problems.
_SIZES = {
    "d1": {"num_train": 200, "num_test": 50},
    "d3": {"num_train": 20000, "num_test": 1000},
    "d4": {"num_train": 20000, "num_test": 1000},
    "n4": {"num_train": 20000, "num_test": 1000},
}


@dataclasses.dataclass(eq=False)
class ArithmeticConfig(tfds.core.BuilderConfig):
  """Parameters of `tasks.arithmetic` and the split sizes."""

  digits: int = 2
  ops: str = "+-*"
  style: str = "compact"
  num_train: int = 5000
  num_test: int = 500
  seed: int = 0


class JaxrlArithmetic(tfds.core.GeneratorBasedBuilder):
  """Multi-digit arithmetic problems (jaxrl_scale.data.tasks.arithmetic)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [
      ArithmeticConfig(name=name, **params, **_SIZES.get(name, {}))
      for name, params in tasks.PRESETS["arithmetic"].items()
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=_features(),
                                 description="Multi-digit arithmetic (jaxrl_scale built-in).")

  def _split_generators(self, dl_manager):
    del dl_manager  # generated, nothing to download
    c = self.builder_config
    return _task_splits("arithmetic", {"digits": c.digits, "ops": c.ops, "style": c.style},
                        c.num_train, c.num_test, c.seed)

  def _generate_examples(self, examples):
    yield from examples


@dataclasses.dataclass(eq=False)
class CountdownConfig(tfds.core.BuilderConfig):
  """Parameters of `tasks.countdown` and the split sizes."""

  count: int = 3
  max_number: int = 10
  max_target: int = 100
  style: str = "compact"
  num_train: int = 5000
  num_test: int = 500
  seed: int = 0


class JaxrlCountdown(tfds.core.GeneratorBasedBuilder):
  """Countdown number puzzles, solvable by construction (jaxrl_scale.data.tasks.countdown)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [
      CountdownConfig(name=name, **params, **_SIZES.get(name, {}))
      for name, params in tasks.PRESETS["countdown"].items()
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=_features(),
                                 description="Countdown puzzles (jaxrl_scale built-in).")

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    params = {"count": c.count, "max_number": c.max_number, "max_target": c.max_target,
              "style": c.style}
    return _task_splits("countdown", params, c.num_train, c.num_test, c.seed)

  def _generate_examples(self, examples):
    yield from examples


@dataclasses.dataclass(eq=False)
class CodeConfig(tfds.core.BuilderConfig):
  """Parameters of `code_task.code` and the split sizes."""

  templates: str = "linear,square,mod,floor,abs,max"
  style: str = "compact"
  num_tests: int = 4
  num_train: int = 1000
  num_test: int = 200
  seed: int = 0


class JaxrlCode(tfds.core.GeneratorBasedBuilder):
  """Small integer functions to write in Python, judged by tests (data/code_task.py)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [CodeConfig(name=name, **params)
                     for name, params in tasks.PRESETS["code"].items()]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=_features(),
                                 description="Code problems (jaxrl_scale built-in).")

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    params = {"templates": c.templates, "style": c.style, "num_tests": c.num_tests}
    return _task_splits("code", params, c.num_train, c.num_test, c.seed)

  def _generate_examples(self, examples):
    yield from examples


@dataclasses.dataclass(eq=False)
class CodeFileConfig(tfds.core.BuilderConfig):
  """A local file of code problems and the task its records get."""

  path: str = ""
  task: str = "code"


class JaxrlCodeProblems(tfds.core.GeneratorBasedBuilder):
  """Code problems from a local JSONL / Parquet file (pass config=code_file_config(...))."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=_features(),
                                 description="Code problems from a local file (jaxrl_scale).")

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    if c is None or not c.path:
      raise UserError("jaxrl_code_problems needs config=code_file_config(path, task)")
    return {"train": _examples(code_problems.read_local(c.path, task=c.task))}

  def _generate_examples(self, examples):
    yield from examples


def code_file(path: str, *, task: str = "code", data_dir: str | None = None) -> RecordView:
  """Records of a local code-problem file, prepared into `data_dir` through TFDS.

  The config name hashes the path, size, mtime and task, so a changed file prepares afresh.
  """
  if not os.path.isfile(path):
    raise UserError(f"{path}: no such file")
  path = os.path.abspath(path)
  stat = os.stat(path)
  key = json.dumps([path, stat.st_size, stat.st_mtime_ns, task])
  stem = re.sub(r"[^a-z0-9_]", "_", os.path.splitext(os.path.basename(path))[0].lower())
  config = CodeFileConfig(name=f"{stem[:40]}_{hashlib.sha256(key.encode()).hexdigest()[:12]}",
                          path=path, task=task, description=f"Code problems from {path}")
  builder = prepare(JaxrlCodeProblems(config=config, data_dir=data_dir))
  return RecordView(data_source(builder, "train"), _identity, path)


@dataclasses.dataclass(eq=False)
class LocalFileConfig(tfds.core.BuilderConfig):
  """A local JSONL / Parquet file and how its rows map onto records."""

  path: str = ""
  fields: records_lib.FieldMap = dataclasses.field(default_factory=records_lib.FieldMap)


def local_file_config(path: str, fields: records_lib.FieldMap) -> LocalFileConfig:
  """A config whose name changes with the file's path, size, mtime and the field map.

  A changed file therefore prepares afresh instead of serving stale records.
  """
  if not os.path.isfile(path):
    raise UserError(f"{path}: no such file")
  path = os.path.abspath(path)
  stat = os.stat(path)
  key = json.dumps([path, stat.st_size, stat.st_mtime_ns, dataclasses.asdict(fields)])
  stem = re.sub(r"[^a-z0-9_]", "_", os.path.splitext(os.path.basename(path))[0].lower())
  name = f"{stem[:40]}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"
  return LocalFileConfig(name=name, path=path, fields=fields,
                         description=f"Prompts from {path}")


class JaxrlLocalPrompts(tfds.core.GeneratorBasedBuilder):
  """Prompts from a local JSONL / Parquet file (pass config=local_file_config(...))."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=_features(),
                                 description="Prompts from a local file (jaxrl_scale).")

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    if c is None or not c.path:
      raise UserError("jaxrl_local_prompts needs config=local_file_config(path, fields)")
    return {"train": _examples(records_lib.read_local(c.path, c.fields))}

  def _generate_examples(self, examples):
    yield from examples


# ----------------------------------------------------------------------------------------
# Reading prepared datasets.


class RecordView(collections.abc.Sequence):
  """Random-access records over a TFDS data source: decodes bytes, maps rows to records."""

  def __init__(self, source: collections.abc.Sequence, mapper: Callable[[dict, int], dict],
               origin: str):
    self._source = source
    self._mapper = mapper
    self.origin = origin

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    return self._map(self._source[index], index)

  def get_many(self, indices: list[int]) -> list[dict[str, str]]:
    """Records at `indices`, read in one batch (several times faster than one by one)."""
    return [self._map(raw, i) for raw, i in zip(self._source.__getitems__(indices), indices)]

  def _map(self, raw: Mapping[str, Any], index: int) -> dict[str, str]:
    row = {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in raw.items()}
    return self._mapper(row, index)


def prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """Prepares `builder` as array_record unless its data_dir already holds it."""
  if not builder.is_prepared():
    builder.download_and_prepare(file_format=FILE_FORMAT)
  return builder


def data_source(builder: tfds.core.DatasetBuilder, split: str) -> collections.abc.Sequence:
  """The random-access data source of a prepared split; UserError for a wrong split/format."""
  known = list(builder.info.splits.keys())
  if split not in known:
    raise UserError(f"{builder.name}: no split {split!r} in {builder.data_dir} "
                    f"(splits: {', '.join(known)})")
  try:
    return builder.as_data_source(split=split)
  except (NotImplementedError, ValueError) as e:
    raise UserError(f"{builder.data_dir}: prepared as {builder.info.file_format}, but random "
                    "access needs array_record; delete it and prepare again "
                    f"({str(e).splitlines()[0]})") from None


def _identity(row: dict, index: int) -> dict:
  del index
  return {k: row[k] for k in tasks.RECORD_KEYS}


def builtin(task: str, config: str | tfds.core.BuilderConfig | None = None, *,
            data_dir: str | None = None, split: str = "train") -> RecordView:
  """Records of a built-in task, prepared into `data_dir` on first use.

  Args:
    task: "arithmetic", "countdown" or "code".
    config: a config name ("d3", "n4", "io"), an ArithmeticConfig / CountdownConfig /
      CodeConfig with a name of your own, or None for the builder's first config.
    data_dir: TFDS data directory; None is TFDS's default (~/tensorflow_datasets).
    split: "train" or "test".
  """
  builders = {"arithmetic": JaxrlArithmetic, "countdown": JaxrlCountdown, "code": JaxrlCode}
  if task not in builders:
    raise UserError(f"unknown built-in task {task!r}; known: {sorted(builders)}")
  cls = builders[task]
  if isinstance(config, str) and config not in cls.builder_configs:
    raise UserError(f"{cls.name}: no config {config!r} (configs: "
                    f"{', '.join(cls.builder_configs)})")
  builder = prepare(cls(config=config, data_dir=data_dir))
  origin = f"{cls.name}/{builder.builder_config.name}"
  return RecordView(data_source(builder, split), _identity, origin)


def local_file(path: str, fields: records_lib.FieldMap, *, data_dir: str | None = None
               ) -> RecordView:
  """Records of a local JSONL / Parquet file, prepared into `data_dir` through TFDS."""
  builder = prepare(JaxrlLocalPrompts(config=local_file_config(path, fields), data_dir=data_dir))
  return RecordView(data_source(builder, "train"), _identity, path)


# TFDS dataset name (before any '/config') -> row mapper of its features.
KNOWN_DATASETS: dict[str, Callable[[Mapping[str, str]], dict[str, str]]] = {
    "gsm8k": records_lib.gsm8k_record,
    "math_dataset": records_lib.math_dataset_record,
}


# Builders that live in TFDS's lazily imported legacy packages.
_LEGACY_MODULES = {"gsm8k": "tensorflow_datasets.text.gsm8k.gsm8k"}


def _raise_prepare_error(name: str, builder: tfds.core.DatasetBuilder, error: Exception):
  """Turns a failed download_and_prepare into a one-line UserError, or re-raises it."""
  chain, e = [], error
  while e is not None and len(chain) < 20:
    chain.append(e)
    e = e.__cause__ or e.__context__
  # TFDS wraps errors (an extraction failure raises ExtractError from the real cause).
  missing = next((c for c in chain if isinstance(c, ModuleNotFoundError)), None)
  if missing is not None:
    raise UserError(f"tfds:{name}: preparing this dataset needs {missing.name} "
                    f"(pip install {missing.name}); reading it afterwards does not") from None
  if any(isinstance(c, (OSError, tfds.download.DownloadError)) for c in chain):
    raise UserError(f"tfds:{name}: download_and_prepare into {builder.data_dir} failed "
                    f"({str(error).splitlines()[0]}); prepare it where a network is "
                    "available and copy the data_dir") from None
  raise error


def tfds_dataset(name: str, *, data_dir: str | None = None, split: str = "train",
                 fields: records_lib.FieldMap | None = None) -> RecordView:
  """Records of a TFDS catalog dataset, downloaded and prepared on first use.

  Args:
    name: "gsm8k", "math_dataset/<module>" (e.g. "math_dataset/arithmetic__mul"), or any
      TFDS dataset with text features, mapped by `fields`.
    data_dir: TFDS data directory; None is TFDS's default.
    split: the split to read.
    fields: field names for datasets not in KNOWN_DATASETS.
  """
  base = name.split("/")[0].split(":")[0]
  if base in KNOWN_DATASETS and fields is None:
    known = KNOWN_DATASETS[base]

    def mapper(row, index):
      try:
        return known(row)
      except (KeyError, ValueError) as e:
        raise UserError(f"tfds:{name} {split}[{index}]: {e}") from None
  elif fields is not None:
    fields = dataclasses.replace(fields, id_prefix=re.sub(r"[^A-Za-z0-9_]", "_", name))

    def mapper(row, index):
      return records_lib.map_row(row, fields, origin=f"tfds:{name} {split}", row_index=index)
  else:
    raise UserError(f"tfds:{name}: not a known dataset ({', '.join(KNOWN_DATASETS)}); "
                    "give prompt_field and answer_field")
  if base in _LEGACY_MODULES:
    # `import tensorflow_datasets` imports its legacy builder packages lazily, so
    # tfds.builder("gsm8k") does not find the class until its module is imported.
    importlib.import_module(_LEGACY_MODULES[base])
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # DatasetNotFoundError, bad config names: all user input
    raise UserError(f"tfds:{name}: {str(e).splitlines()[0]}") from None
  if not builder.is_prepared():
    try:
      builder.download_and_prepare(file_format=FILE_FORMAT)
    except Exception as e:  # pylint: disable=broad-except
      _raise_prepare_error(name, builder, e)
  return RecordView(data_source(builder, split), mapper, f"tfds:{name}")
