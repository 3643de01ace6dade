"""pyarrow's errors while reading or writing data name the file and the column, and the row where it can be known
(issue 39): a damaged column chunk, a value with no Python equivalent, rows whose column mixes types, a truncated
file (named from its footer alone, for validation)."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from npu_rl.data.io import DataError, parquet_problem, read_parquet, read_rows, write_parquet


def damaged_column(path: str, column: str, rows: int = 100) -> str:
    """A parquet file whose footer is whole but whose ``column`` chunk has bytes overwritten in its page header."""
    table = pa.table({"prompt": ["What is 1 + 1?"] * rows, "answer": [str(i) for i in range(rows)],
                      "score": [0.5] * rows})
    pq.write_table(table, path)
    chunk = next(pq.ParquetFile(path).metadata.row_group(0).column(i) for i in range(3)
                 if pq.ParquetFile(path).metadata.row_group(0).column(i).path_in_schema == column)
    data = bytearray(open(path, "rb").read())
    start = chunk.data_page_offset + 20
    data[start:start + 30] = b"\xff" * 30
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_a_damaged_column_chunk_is_named_with_its_rows(tmp_path):
    path = damaged_column(str(tmp_path / "train.parquet"), "answer")
    assert parquet_problem(path) is None  # the footer reads: validation cannot see it
    with pytest.raises(DataError, match=rf"{path}: cannot read as parquet: column 'answer' \(row group 0, rows "
                                        r"0-99\): OSError"):
        read_rows(path)


def test_a_value_without_a_python_equivalent_names_column_and_row(tmp_path):
    path = str(tmp_path / "dates.parquet")
    pq.write_table(pa.table({"prompt": ["a", "b", "c"],
                             "when": pa.array([0, 1, 3_000_000], type=pa.date32())}), path)  # day 3e6: year 10183
    with pytest.raises(DataError, match=rf"{path}: column 'when', row 2: cannot be read as a Python value: "
                                        "OverflowError"):
        read_parquet(path)


def test_a_truncated_file_is_named_from_its_footer(tmp_path):
    good = write_parquet([{"prompt": "a", "answer": "1"}] * 4, str(tmp_path / "good.parquet"))
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(open(good, "rb").read()[:-30])
    assert parquet_problem(good) is None
    assert parquet_problem(str(cut)).startswith(f"{cut}: cannot read as parquet: ArrowInvalid: ")


@pytest.mark.parametrize("rows, where", [
    ([{"a": "1"}, {"a": "2"}, {"a": 3}], r"column 'a', row 2: 3 is a int, but row 0 holds a str \('1'\)"),
    ([{"m": {"truth": "x", "k": 1}}, {"m": None}, {"m": {"truth": ["y"], "k": 2}}],
     r"column 'm.truth', row 2: \['y'\] is a list, but row 0 holds a str \('x'\)"),
    ([{"p": [{"role": "user", "content": "hi"}]}, {"p": "hi"}], r"column 'p', row 1: 'hi' is a str, but row 0 holds a "
                                                                  r"list"),
    ([{"d": datetime.date(2000, 1, 1)}, {"d": object()}], r"column 'd', row 1: <object object at 0x\w+> is a object"),
])
def test_rows_whose_column_mixes_types_name_column_and_row(tmp_path, rows, where):
    path = tmp_path / "mixed.parquet"
    with pytest.raises(DataError, match=rf"cannot write {path}: {where}"):
        write_parquet(rows, str(path))
    assert not path.exists() and not list(tmp_path.iterdir())  # nothing half-written
