"""Logs as a container runtime hands them over: ``docker compose logs``, ``kubectl logs
--prefix`` and ``--timestamps`` put their own prefix before every line the engine printed.

Every example and spec file, so prefixed, must read as the file itself: the same records, the
same metrics, nothing more ignored or rejected; chunked reads cut at the same events.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.ingest.detect import detect
from pipeline.ingest.line_prefixes import LINE_PREFIXES, candidates, stripped
from tests.unit.ingest.alike import EXAMPLES, FILES, assert_read_alike, read_pair

OPTIONS = IngestOptions(year=2025)
STAMP = b"2025-06-03T09:42:00.118204123Z "
#: how each runtime prefixes a line (the replica, pod and times vary line by line)
PREFIXES = {
    "docker compose": lambda i: b"vllm-1  | " if i % 2 else b"vllm-1  |",  # no space when blank
    "docker compose v1, timestamps": lambda i: b"tgi_1     | " + STAMP,
    "kubectl prefix": lambda i: b"[pod/vllm-6d4f9c-x2x9q/vllm] ",
    "kubectl prefix, timestamps": lambda i: b"[pod/tgi-0/tgi] 2025-06-03T09:42:0%dZ " % (i % 10),
    "runtime timestamps": lambda i: b"2025-06-03T09:42:00.%06d+02:00 " % i,
    "journalctl": lambda i: b"Jun  3 09:42:%02d gpu-7 python3[2301]: " % (i % 60),
    "journalctl -o short-iso": lambda i: b"2025-06-03T09:42:00+0000 gpu-7.lan vllm[7]: ",
    "journalctl -o short-precise": lambda i: b"Jun 03 09:42:00.%06d gpu-7 tgi: " % (i % 10**6),
    "kubernetes CRI": lambda i: (
        b"2025-06-03T09:42:00.%09dZ std%s F " % (i, b"err" if i % 3 else b"out")
    ),
}


def _prefixed(data: bytes, prefix) -> bytes:
    lines = data.split(b"\n")[:-1]
    return b"".join(prefix(i) + (line if line or i % 2 else b"") + b"\n"
                    for i, line in enumerate(lines))  # fmt: skip


def _read(path: Path, options: IngestOptions = OPTIONS):
    result = ingest_paths([path], options)
    return result, result.summary[0]


def _same(tmp_path: Path, source: Path, data: bytes, options: IngestOptions = OPTIONS) -> str:
    """Read ``source`` and ``data`` under one name (one instance): they must come out alike;
    returns the assumption the prefixed read noted."""
    dirty, clean = read_pair(tmp_path, source.name, source.read_bytes(), data, options)
    assert_read_alike(dirty, clean)
    assert len(clean.records) + len(clean.metrics) > 0
    notes = [a for a in dirty.summary[0].assumptions if "prefix" in a]
    return notes[0] if notes else ""


@pytest.mark.parametrize("runtime", PREFIXES)
@pytest.mark.parametrize("source", FILES, ids=lambda p: p.name)
def test_every_file_reads_the_same_through_a_runtime_prefix(tmp_path, source, runtime):
    note = _same(tmp_path, source, _prefixed(source.read_bytes(), PREFIXES[runtime]))
    assert "prefix: cut off before parsing" in note


def test_chunked_prefixed_reads_cut_at_the_same_events(tmp_path):
    for source in (EXAMPLES / "vllm-v0.11.txt", EXAMPLES / "tgi-text-v3-debug.txt"):
        data = _prefixed(source.read_bytes() * 150, PREFIXES["docker compose v1, timestamps"])
        options = IngestOptions(year=2025, chunk_bytes=1 << 16, workers=2)
        path = tmp_path / source.name
        path.write_bytes(data)
        chunked, summary = _read(path, options)
        whole = ingest_paths([source], OPTIONS)
        assert len(chunked.records) == 150 * len(whole.records)
        assert summary.rejects.total == 0, summary.rejects.sample_lines()


def test_files_without_a_runtime_prefix_get_none():
    """TGI's own lines start with an RFC 3339 time: it is the format's, not a runtime's."""
    for source in FILES:
        assert detect(source)[1] is None, source.name


def test_a_line_without_the_prefix_is_read_as_it_is(tmp_path):
    """A garbage line the runtime did not prefix costs itself; one that it did, too."""
    source = EXAMPLES / "vllm-v0.11.txt"
    data = _prefixed(source.read_bytes(), PREFIXES["docker compose"])
    data = data.replace(b"\n", b"\n\xff\xfebinary\nvllm-1  | \xff\xfe\n", 1)
    path = tmp_path / source.name
    path.write_bytes(data)
    dirty, summary = _read(path)
    clean = ingest_paths([source], OPTIONS)
    pd.testing.assert_frame_equal(dirty.records, clean.records)
    assert summary.rejects.total == 2


#: the prefix each runtime of :data:`PREFIXES` is read as
NAMES = {
    "docker compose": "docker compose",
    "docker compose v1, timestamps": "docker compose, timestamps",
    "kubectl prefix": "kubectl prefix",
    "kubectl prefix, timestamps": "kubectl prefix, timestamps",
    "runtime timestamps": "runtime timestamps",
    "journalctl": "journalctl",
    "journalctl -o short-iso": "journalctl",
    "journalctl -o short-precise": "journalctl",
    "kubernetes CRI": "kubernetes CRI",
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(PREFIXES)), st.integers(0, 10**6), st.text(max_size=80))
@example("journalctl -o short-precise", 10**6, "")  # (a time's widest fraction)
@example("runtime timestamps", 10**6, " INFO x")
def test_a_prefix_is_cut_and_nothing_of_the_line(runtime, i, text):
    """A runtime's prefix comes off whole and the engine's line stays as it was (its own
    colour codes, times and brackets included); a line without one is left alone."""
    prefix = PREFIXES[runtime](i | 1).decode()  # (odd: the prefixes that end in a space)
    name = NAMES[runtime]
    assert stripped([prefix + text], name) == [text]
    assert name in candidates([prefix + text])
    if re.match(LINE_PREFIXES[name], text) is None:
        assert stripped([text], name) == [text]
