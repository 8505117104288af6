"""Container logs as a node keeps them, long lines in pieces: the CRI logging format of
containerd and CRI-O (``/var/log/containers``: ``P`` pieces ended by an ``F`` piece, cut at a
byte count, inside a UTF-8 character too) and Docker's json-file driver (a JSON object a line,
a piece's ``log`` without its newline). Every example and spec file so cut must read as the
file itself; cut lines are joined across blocks, chunks and incremental runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest import IngestOptions, IngestState, ingest_paths
from pipeline.ingest.lines import LineReader
from pipeline.ingest.summary import TOO_LONG, Rejects
from tests.unit.ingest.alike import EXAMPLES, FILES, assert_read_alike, read_pair

OPTIONS = IngestOptions(year=2025)
CRI, DOCKER = "kubernetes CRI", "docker json-file"
V011 = EXAMPLES / "vllm-v0.11.txt"


def _stamp(i: int) -> bytes:
    return b"2025-06-03T09:42:%02d.%09dZ" % (i % 60, i)


def cri_line(line: bytes, piece: int, stream: bytes = b"stdout", i: int = 0) -> bytes:
    """``line`` as containerd writes it: pieces of ``piece`` bytes (the last one ``F``)."""
    cuts = list(range(0, len(line), piece)) or [0]
    pieces = [line[a : a + piece] for a in cuts]
    tags = [b"P"] * (len(pieces) - 1) + [b"F"]
    return b"".join(
        b"%s %s %s %s\n" % (_stamp(i + k), stream, tag, text)
        for k, (tag, text) in enumerate(zip(tags, pieces, strict=True))
    )


def docker_line(line: bytes, piece: int, stream: bytes = b"stdout", i: int = 0) -> bytes:
    """``line`` as Docker's json-file driver writes it: pieces of ``piece`` characters (Docker
    cuts at a byte count and writes a cut character as U+FFFD: that loss is Docker's), ``<``,
    ``>`` and ``&`` escaped as Go escapes them."""
    text = line.decode("utf-8", "replace")
    pieces = [text[a : a + piece] for a in range(0, len(text), piece)] or [""]
    pieces[-1] += "\n"
    entries = [
        json.dumps({"log": p, "stream": stream.decode(), "time": _stamp(i + k).decode()},
                   ensure_ascii=False, separators=(",", ":"))
        for k, p in enumerate(pieces)
    ]  # fmt: skip
    escaped = (e.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
               for e in entries)  # fmt: skip
    return "".join(e + "\n" for e in escaped).encode()


WRITERS: dict[str, Callable[[bytes, int, bytes, int], bytes]] = {
    CRI: cri_line,
    DOCKER: docker_line,
}


def cut_file(data: bytes, piece: int, runtime: str = CRI) -> bytes:
    """Every line of ``data`` cut into pieces (stdout and stderr lines alternate)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":  # (the last line's newline ends it: no line after it)
        lines.pop()
    write = WRITERS[runtime]
    return b"".join(
        write(line.rstrip(b"\r"), piece, b"stderr" if i % 2 else b"stdout", i)
        for i, line in enumerate(lines)
    )


@pytest.mark.parametrize("runtime", WRITERS)
@pytest.mark.parametrize("piece", [7, 61])  # (7: inside nearly every multi-byte character)
@pytest.mark.parametrize("source", FILES, ids=lambda p: p.name)
def test_every_file_reads_the_same_cut_into_pieces(tmp_path, source, piece, runtime):
    clean = source.read_bytes()
    cut = cut_file(clean, piece, runtime)
    dirty, plain = read_pair(tmp_path, source.name, clean, cut, OPTIONS)
    assert_read_alike(dirty, plain)
    assert f"every line starts with a {runtime} prefix" in " ".join(dirty.summary[0].assumptions)
    if runtime == CRI:  # (Docker writes bytes that are no UTF-8 as U+FFFD itself)
        assert dirty.summary[0].repaired == plain.summary[0].repaired


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(list(WRITERS)),
    st.lists(
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40
        ),
        max_size=12,
    ),
    st.integers(1, 9),
    st.integers(16, 200),
)
def test_pieces_join_back_into_their_lines(tmp_path_factory, runtime, lines, piece, block):
    """Whatever the lines, the piece size and the block the reader reads at once."""
    path = tmp_path_factory.mktemp("cri") / "0.log"
    data = b"".join(line.encode() + b"\n" for line in lines)
    path.write_bytes(cut_file(data, piece, runtime))
    reader = LineReader(path, Rejects(str(path)), block_bytes=block, line_prefix=runtime)
    numbered = [(first + k, line) for first, run in reader for k, line in enumerate(run)]
    assert [line for _, line in numbered] == lines
    assert [n for n, _ in numbered] == sorted({n for n, _ in numbered})  # numbers only grow
    assert reader.repaired == 0 and reader.rejects.total == 0


def test_pieces_of_two_streams_between_each_other_join_by_stream(tmp_path):
    out = cri_line(b"INFO stdout line " + b"x" * 30, 10, b"stdout").split(b"\n")
    err = cri_line(b"WARNING stderr line " + b"y" * 30, 10, b"stderr").split(b"\n")
    path = tmp_path / "0.log"
    path.write_bytes(b"\n".join([out[0], err[0], out[1], *err[1:-1], *out[2:]]))
    reader = LineReader(path, Rejects(str(path)), line_prefix=CRI)
    lines = [line for _, run in reader for line in run]
    assert lines == ["WARNING stderr line " + "y" * 30, "INFO stdout line " + "x" * 30]


@pytest.mark.parametrize("runtime", WRITERS)
def test_chunks_never_start_inside_a_cut_line(tmp_path, runtime):
    data = V011.read_bytes() * 120
    path = tmp_path / "0.log"
    path.write_bytes(cut_file(data, 97, runtime))
    options = IngestOptions(year=2025, chunk_bytes=1 << 16, workers=2)
    chunked = ingest_paths([path], options)
    whole = ingest_paths([V011], OPTIONS)
    assert len(chunked.records) == 120 * len(whole.records)
    assert chunked.summary[0].rejects.total == 0, chunked.summary[0].rejects.sample_lines()


@pytest.mark.parametrize("runtime", WRITERS)
def test_a_line_still_being_written_is_read_once_it_is_whole(tmp_path, runtime):
    """An incremental run stops before the pieces of a line whose last piece is not written
    yet; the next run reads the line whole, and no line twice."""
    text = V011.read_bytes().split(b"\n")
    path, state = tmp_path / "0.log", IngestState()
    received = next(i for i, line in enumerate(text) if b"Received request" in line)
    head = cut_file(b"".join(line + b"\n" for line in text[:received]), 40, runtime)
    cut = WRITERS[runtime](text[received], 40, b"stdout", 0).split(b"\n")
    path.write_bytes(head + b"\n".join(cut[:-2]) + b"\n")  # the line's pieces but its last
    first = ingest_paths([path], OPTIONS, state)
    assert first.summary[0].rejects.total == 0
    with open(path, "ab") as log:
        log.write(cut[-2] + b"\n" + cut_file(b"\n".join(text[received + 1 :]), 40, runtime))
    second = ingest_paths([path], OPTIONS, state)
    assert second.summary[0].rejects.total == 0, second.summary[0].rejects.sample_lines()
    plain = ingest_paths([V011], OPTIONS)
    both = pd.concat([first.records, second.records], ignore_index=True)
    pd.testing.assert_frame_equal(both.sort_values("ts", kind="stable", ignore_index=True),
                                  plain.records)  # fmt: skip
    assert first.summary[0].lines + second.summary[0].lines == cut_file(
        V011.read_bytes(), 40, runtime
    ).count(b"\n")


def test_a_cut_line_past_the_cap_costs_itself(tmp_path):
    lines = V011.read_bytes().split(b"\n")
    long = b"INFO 10-03 10:00:00 [logger.py:1] " + b"z" * 5000
    path = tmp_path / "0.log"
    path.write_bytes(cut_file(b"\n".join([*lines[:3], long, *lines[3:]]), 100))
    options = IngestOptions(year=2025, max_line_bytes=4096)
    result = ingest_paths([path], options)
    assert result.summary[0].rejects.counts == {TOO_LONG: 1}
    pd.testing.assert_frame_equal(result.records, ingest_paths([V011], OPTIONS).records)


def test_a_file_that_ends_inside_a_cut_line_reads_what_there_is(tmp_path: Path):
    lines = V011.read_bytes().split(b"\n")
    path = tmp_path / "0.log"
    path.write_bytes(cut_file(b"\n".join(lines[:4]) + b"\n", 30) + cri_line(b"INFO x" * 20, 30)
                     .split(b"\n")[0] + b"\n")  # fmt: skip
    reader = LineReader(path, Rejects(str(path)), line_prefix=CRI)
    read = [line for _, run in reader for line in run]
    assert read[:4] == [line.decode() for line in lines[:4]] and read[4] == "INFO x" * 5


def test_a_held_piece_cut_inside_a_character_is_left_for_the_next_run(tmp_path):
    """The held pieces' bytes are counted as the file has them (half a character included), so
    the next run starts at the first piece, and the character comes out whole."""
    line = "INFO 10-03 10:00:00 [logger.py:1] café " * 3
    pieces = cri_line(line.encode(), 29).split(b"\n")[:-1]  # byte 29 is inside the first "é"
    path, state = tmp_path / "0.log", IngestState()
    path.write_bytes(b"\n".join(pieces[:-1]) + b"\n")
    first = ingest_paths([path], OPTIONS, state)
    assert first.summary[0].lines == 0 and first.summary[0].rejects.total == 0
    assert state.files[str(path)].offset == 0
    with open(path, "ab") as log:
        log.write(pieces[-1] + b"\n")
    reader = LineReader(path, Rejects(str(path)), line_prefix=CRI)
    assert [text for _, run in reader for text in run] == [line]
    assert reader.repaired == 0


def test_chunks_never_start_inside_a_line_whose_pieces_another_stream_interleaves(tmp_path):
    """stdout's pieces with stderr lines between them: a chunk boundary after a stderr line
    may still be inside a stdout line (its pieces before and after)."""
    warning = b"WARNING 10-03 16:20:12 [x.py:1] a warning between pieces"
    out = []
    for i, line in enumerate((V011.read_bytes() * 120).split(b"\n")[:-1]):
        pieces = cri_line(line, 50, b"stdout", i).split(b"\n")[:-1]
        for piece in pieces:
            out.extend([piece, cri_line(warning, 500, b"stderr", i).rstrip(b"\n")])
    path = tmp_path / "0.log"
    path.write_bytes(b"\n".join(out) + b"\n")
    options = IngestOptions(year=2025, chunk_bytes=1 << 16, workers=2)
    chunked = ingest_paths([path], options)
    whole = ingest_paths([V011], OPTIONS)
    assert chunked.summary[0].rejects.total == 0, chunked.summary[0].rejects.sample_lines()
    assert len(chunked.records) == 120 * len(whole.records)
