"""``silver.writer.whole_local_files``: a stream batch's files are read by pyarrow only when
the scan's splits read every byte of every file, once, on local disk."""

from silver.writer import whole_local_files

A, B = "file:/lake/bronze/a.parquet", "file:/lake/bronze/b%20c.parquet"


def test_files_read_whole_in_one_or_several_splits_are_taken():
    assert whole_local_files([(A, 0, 10, 10)]) == ["/lake/bronze/a.parquet"]
    assert whole_local_files([(B, 4, 6, 10), (A, 0, 10, 10), (B, 0, 4, 10)]) == [
        "/lake/bronze/b c.parquet", "/lake/bronze/a.parquet"]


def test_a_part_of_a_file_left_out_or_read_twice_is_not():
    assert whole_local_files([(A, 0, 4, 10)]) is None                     # the end
    assert whole_local_files([(A, 4, 6, 10)]) is None                     # the start
    assert whole_local_files([(A, 0, 4, 10), (A, 5, 5, 10)]) is None      # a gap
    assert whole_local_files([(A, 0, 6, 10), (A, 4, 6, 10)]) is None      # overlap
    assert whole_local_files([(A, 0, 10, 10), (A, 0, 10, 10)]) is None    # twice
    assert whole_local_files([(A, 0, 4, 10), (A, 4, 6, 12)]) is None      # sizes differ


def test_files_elsewhere_are_not():
    assert whole_local_files([("s3a://bucket/bronze/a.parquet", 0, 10, 10)]) is None
    assert whole_local_files([(A, 0, 10, 10), ("dbfs:/bronze/a.parquet", 0, 10, 10)]) is None
