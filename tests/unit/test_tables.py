"""Reading back the Parquet tables prewarm wrote: a bad one is one error naming the file."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.errors import BadInputError
from pipeline.tables import read_parquet_file


def test_a_table_reads_back_as_written(tmp_path):
    path = tmp_path / "counts.parquet"
    frame = pd.DataFrame({"item_key": ["a", "b"], "requests": [3, 4]})
    frame.to_parquet(path, index=False)
    pd.testing.assert_frame_equal(read_parquet_file(path, "counts"), frame)


@pytest.mark.parametrize("content", [b"PAR1" + bytes(range(64)), b"", b"not parquet at all\n" * 10])
def test_a_table_that_cannot_be_read_is_bad_input_naming_the_file(tmp_path, content):
    path = tmp_path / "records.parquet"
    path.write_bytes(content)
    with pytest.raises(BadInputError) as raised:
        read_parquet_file(path, "records")
    assert raised.value.where == str(path)
    assert str(raised.value).startswith(f"{path}: cannot read records (")


def test_a_missing_table_is_left_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_parquet_file(tmp_path / "none.parquet", "observations")
