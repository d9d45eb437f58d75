"""Row -> record mappings (GSM8K, MATH, math_dataset, configurable files) and file reading."""

import json

import pytest

from jaxrl_scale.data import records
from jaxrl_scale.errors import UserError

_GSM8K_ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                "many clips in May. How many clips did Natalia sell altogether?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
              "<<48+24=72>>72 clips altogether.\n#### 72",
}

_MATH_ROW = {
    "problem": "Simplify $\\frac{1}{2}+\\frac{1}{3}$.",
    "solution": "We get $\\boxed{\\frac{1}{6}}$ wrong first; in fact "
                "$\\frac{1}{2}+\\frac{1}{3}=\\boxed{\\frac{5}{6}}$.",
    "level": "Level 1", "type": "Prealgebra",
}


def test_last_boxed():
  assert records.last_boxed("a \\boxed{1} b \\boxed{\\frac{a}{b}} c") == "\\frac{a}{b}"
  assert records.last_boxed("\\fbox{ 42 }") == "42"
  assert records.last_boxed("\\boxed {x^{2}}") == "x^{2}"
  assert records.last_boxed("no box") is None
  assert records.last_boxed("\\boxed{unclosed") is None


def test_gsm8k_raw_and_tfds_features_agree():
  raw = records.gsm8k_record(_GSM8K_ROW)
  annotation, short = _GSM8K_ROW["answer"].split("#### ")
  tfds_row = {"question": _GSM8K_ROW["question"], "answer": _GSM8K_ROW["answer"],
              "annotation": annotation, "short_answer": short}
  assert records.gsm8k_record(tfds_row) == raw
  assert raw["answer"] == "72" and raw["task"] == "math"
  assert "<<" not in raw["solution"] and "24 clips in May" in raw["solution"]
  assert raw["solution"].endswith("The answer is \\boxed{72}.")
  assert raw["id"].startswith("gsm8k-") and raw["id"] == records.gsm8k_record(_GSM8K_ROW)["id"]
  with pytest.raises(ValueError, match="####"):
    records.gsm8k_record({"question": "q", "answer": "no marker"})


def test_math_and_math_dataset():
  rec = records.math_record(_MATH_ROW)
  assert rec["answer"] == "\\frac{5}{6}" and rec["solution"] == _MATH_ROW["solution"]
  assert rec["prompt"] == _MATH_ROW["problem"]
  rec = records.math_dataset_record({"question": "Solve 3*x = 12 for x. ", "answer": "4\n"})
  assert (rec["prompt"], rec["answer"]) == ("Solve 3*x = 12 for x.", "4")
  assert records.last_boxed(rec["solution"]) == "4"


def test_map_row_formats():
  fields = records.FieldMap(prompt_field="q", answer_field="a", id_field="uid",
                            answer_format="gsm8k")
  rec = records.map_row({"q": "Q", "a": _GSM8K_ROW["answer"], "uid": 7}, fields,
                        origin="f.jsonl", row_index=3)
  assert rec["id"] == "7" and rec["answer"] == "72"
  fields = records.FieldMap(prompt_field="problem", answer_field="solution",
                            answer_format="boxed", id_prefix="math")
  rec = records.map_row(_MATH_ROW, fields, origin="f", row_index=5)
  assert rec == {**records.math_record(_MATH_ROW), "id": "math-5"}
  fields = records.FieldMap(prompt_field="p", answer_field="a", solution_field="s",
                            task="countdown")
  rec = records.map_row({"p": "1 2 -> 3:", "a": {"numbers": [1, 2], "target": 3}, "s": "1+2"},
                        fields, origin="f", row_index=1)
  assert rec["answer"] == '{"numbers": [1, 2], "target": 3}' and rec["solution"] == "1+2"
  assert rec["task"] == "countdown"


@pytest.mark.parametrize("row,fields,match", [
    ({"prompt": "x"}, {}, r"f.jsonl: row 4: no field 'answer' \(fields: prompt\)"),
    ({"prompt": "x", "answer": None}, {}, r"row 4: field 'answer' is null"),
    ({"prompt": " ", "answer": "1"}, {}, r"row 4: field 'prompt' is empty"),
    ({"prompt": "x", "answer": "1"}, {"answer_format": "gsm8k"}, r"row 4: .*'####'"),
    ({"prompt": "x", "answer": "1"}, {"answer_format": "boxed"}, r"row 4: .*boxed"),
    ({"prompt": "x", "answer": ""}, {}, r"row 4: field 'answer' gives an empty answer"),
    (["not", "a", "dict"], {}, r"row 4: expected an object"),
])
def test_map_row_errors(row, fields, match):
  with pytest.raises(UserError, match=match) as e:
    records.map_row(row, records.FieldMap(**fields), origin="f.jsonl", row_index=4)
  assert "\n" not in str(e.value)


def test_bad_answer_format():
  with pytest.raises(UserError, match="answer_format"):
    records.FieldMap(answer_format="xml")


def test_read_local_jsonl_and_parquet_agree(tmp_path):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  rows = [{"question": f"What is {i}+1?", "final": i + 1, "key": f"k{i}"} for i in range(6)]
  jsonl = tmp_path / "train.jsonl"
  jsonl.write_text("\n".join(json.dumps(r) for r in rows[:3]) + "\n\n" +
                   "\n".join(json.dumps(r) for r in rows[3:]) + "\n")
  parquet = tmp_path / "train.parquet"
  pq.write_table(pa.Table.from_pylist(rows), parquet)
  fields = records.FieldMap(prompt_field="question", answer_field="final", id_field="key")
  from_jsonl = records.read_local(str(jsonl), fields)
  assert from_jsonl == records.read_local(str(parquet), fields)
  assert from_jsonl[4] == {"id": "k4", "task": "math", "prompt": "What is 4+1?", "answer": "5",
                           "solution": "The answer is \\boxed{5}."}
  # Without an id field, ids are "{stem}-{row}": a JSONL row is its line (blank lines count).
  ids = [r["id"] for r in records.read_local(str(jsonl), records.FieldMap(
      prompt_field="question", answer_field="final"))]
  assert ids == ["train-1", "train-2", "train-3", "train-5", "train-6", "train-7"]


def test_read_local_errors(tmp_path):
  fields = records.FieldMap()
  with pytest.raises(UserError, match=r"missing.jsonl: no such file"):
    records.read_local(str(tmp_path / "missing.jsonl"), fields)
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n')
  with pytest.raises(UserError, match=r"bad.jsonl: row 2: invalid JSON"):
    records.read_local(str(bad), fields)
  bad.write_text('{"prompt": "a", "answer": "1"}\n[1, 2]\n')
  with pytest.raises(UserError, match=r"bad.jsonl: row 2: expected a JSON object"):
    records.read_local(str(bad), fields)
  bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "solution": "2"}\n')
  with pytest.raises(UserError, match=r"bad.jsonl: row 2: no field 'answer' \(fields: prompt, "
                     r"solution\)$"):
    records.read_local(str(bad), fields)
  bad.write_text('{"prompt": "a", "answer": "1", "id": 1}\n{"prompt": "b", "answer": "2", '
                 '"id": 1}\n')
  with pytest.raises(UserError, match=r"row 2: field 'id' repeats id '1' of row 1"):
    records.read_local(str(bad), records.FieldMap(id_field="id"))
  bad.write_bytes(b'{"prompt": "\xff"}\n')
  with pytest.raises(UserError, match=r"bad.jsonl: not UTF-8"):
    records.read_local(str(bad), fields)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(UserError, match=r"empty.jsonl: no rows"):
    records.read_local(str(empty), fields)
  other = tmp_path / "data.csv"
  other.write_text("a,b\n")
  with pytest.raises(UserError, match=r"data.csv: unknown file type '.csv'"):
    records.read_local(str(other), fields)
  broken = tmp_path / "broken.parquet"
  broken.write_bytes(b"PAR1 not really")
  with pytest.raises(UserError, match=r"broken.parquet: not a readable Parquet file"):
    records.read_local(str(broken), fields)
