"""Compressed logs (gzip, bzip2, xz, zstd) read as the text they hold: every example and spec
file alike, cut streams keep what came before the cut, memory bounded whatever the ratio."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from collections.abc import Callable

import pytest
import zstandard

from pipeline.ingest import IngestOptions, IngestState, ingest_paths
from pipeline.ingest.compressed import DAMAGE, codec_of, damaged, decompressed_blocks
from tests.unit.ingest.alike import EXAMPLES, FILES, assert_read_alike, read_pair

V011 = EXAMPLES / "vllm-v0.11.txt"
COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "bzip2": lambda data: bz2.compress(data, 1),  # blocks of 100 kB: a cut file keeps some
    "xz": lzma.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}
CODECS = list(COMPRESS)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_example_file_reads_alike_compressed(tmp_path, path, codec):
    clean = path.read_bytes()
    options = IngestOptions(year=2025)
    packed, plain = read_pair(tmp_path, "app.log.1", clean, COMPRESS[codec](clean), options)
    assert_read_alike(packed, plain)


@pytest.mark.parametrize("codec", CODECS)
def test_a_cut_stream_keeps_the_lines_before_the_cut(tmp_path, codec):
    # two streams, the second cut inside: the first is read whole whatever the codec's blocks
    half = V011.read_bytes() * 25
    second = COMPRESS[codec](half)
    whole = tmp_path / "whole.log"
    whole.write_bytes(COMPRESS[codec](half) + second)
    cut = tmp_path / "cut.log"
    cut.write_bytes(whole.read_bytes()[: -len(second) // 2])
    options = IngestOptions(year=2025)
    clean, broken = ingest_paths([whole], options), ingest_paths([cut], options)
    assert len(clean.records) == 250 and clean.summary[0].rejects.total == 0
    assert broken.summary[0].rejects.counts == {damaged(codec): 1}
    assert 125 <= len(broken.records) < 250
    # every request read before the cut is one of the whole file's, as it was read there
    kept = ["ts", "request_id", "prompt", "prompt_tokens", "temperature", "max_tokens"]
    seen = clean.records[kept].value_counts()
    for row, times in broken.records[kept].value_counts().items():
        assert times <= seen[row]


@pytest.mark.parametrize("codec", CODECS)
def test_streams_one_after_another_read_as_one(codec):
    first, second = b"a\nb\n" * 1000, b"c\n" * 3000
    packed = COMPRESS[codec](first) + COMPRESS[codec](second)
    assert b"".join(decompressed_blocks(io.BytesIO(packed), 4096, codec)) == first + second


@pytest.mark.parametrize("codec", CODECS)
def test_blocks_stay_bounded_whatever_the_ratio(codec):
    # compresses to a few kB; a whole number of blocks (a gzip member that ended on a full
    # block once read as cut)
    newlines = b"\n" * (24 << 20)
    blocks = decompressed_blocks(io.BytesIO(COMPRESS[codec](newlines)), 1 << 20, codec)
    sizes = [len(block) for block in blocks]
    assert max(sizes) <= 1 << 20 and sum(sizes) == len(newlines)


@pytest.mark.parametrize("codec", CODECS)
def test_a_stream_cut_anywhere_raises_damage_after_its_good_bytes(codec):
    data = b"".join(b"line %d\n" % i for i in range(20000))
    packed = COMPRESS[codec](data)
    for end in (len(packed) // 7, len(packed) // 2, len(packed) - 1):
        got = bytearray()
        with pytest.raises(DAMAGE):
            for block in decompressed_blocks(io.BytesIO(packed[:end]), 4096, codec):
                got += block
        assert data.startswith(got)


def test_the_codec_is_told_by_the_bytes_not_the_name(tmp_path):
    plain = tmp_path / "x.log.gz"
    plain.write_bytes(V011.read_bytes())
    assert codec_of(plain) is None
    assert len(ingest_paths([plain], IngestOptions(year=2025)).records) == 5
    for codec, compress in COMPRESS.items():
        named = tmp_path / f"{codec}.log.1"
        named.write_bytes(compress(V011.read_bytes()))
        assert codec_of(named) == codec
    # a text file that merely starts like a bzip2 header is text
    (tmp_path / "bzh.log").write_bytes(b"BZh9 not compressed\n")
    assert codec_of(tmp_path / "bzh.log") is None


@pytest.mark.parametrize("codec", CODECS)
def test_a_file_rotated_then_compressed_is_not_read_twice(tmp_path, codec):
    text = V011.read_bytes()
    log, state = tmp_path / "app.log", IngestState()
    log.write_bytes(text)
    assert len(ingest_paths([log], IngestOptions(year=2025), state).records) == 5
    rotated = tmp_path / "app.log.1"
    rotated.write_bytes(COMPRESS[codec](text + text))
    log.unlink()
    result = ingest_paths([rotated], IngestOptions(year=2025), state)
    assert len(result.records) == 5  # only what was written after the last run
    assert "continued from" in " ".join(result.summary[0].assumptions)


@pytest.mark.parametrize("codec", CODECS)
def test_a_stream_cut_before_its_first_line_says_so(tmp_path, codec):
    cut = tmp_path / "app.log.1"
    cut.write_bytes(COMPRESS[codec](V011.read_bytes())[:12])  # hardly past the header
    summary = ingest_paths([cut], IngestOptions(year=2025)).summary[0]
    assert summary.format == "unknown" and summary.records == 0
    assert summary.rejects.counts == {damaged(codec): 1}
