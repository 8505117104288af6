"""Reading log files as they really are: whole lines, in blocks, in bounded memory.

* Plain files are read by byte range (``start`` .. ``end``), so a large file can be cut into
  chunks at line boundaries and read by several processes.
* Compressed files (gzip, bzip2, xz, zstd: :mod:`~pipeline.ingest.compressed`) are read in
  order (``start`` counts decompressed bytes); a truncated or corrupt stream counts one
  reject and keeps every complete line read before the damage.
* A line longer than ``max_line_bytes`` is skipped without ever being held in memory whole and
  counts as ``line too long``.
* Invalid UTF-8 is decoded with U+FFFD replacements (the line may still carry a good record)
  and counted in ``repaired``; the parser rejects it if it is not a line it knows.
* Lines end with ``\n``, ``\r\n`` or a lone ``\r`` (a CR-only file, or a CR left between two
  lines), and never keep their ending: a lone ``\r`` does not glue two lines' fields together.
* A UTF-8 byte-order mark at the start of a file (an editor's or an exporter's) is not part of
  its first line: that line is read as if it had none.
* A container runtime's prefix of every line (``vllm-1  | ``, a ``--timestamps`` time) is cut
  off when the reader is told which (:mod:`pipeline.ingest.line_prefixes`).
* With ``partial_tail=False`` (incremental ingestion of a growing file) a last line without its
  newline is left unread: ``offset`` then points at its start, for the next run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest import line_prefixes
from pipeline.ingest.compressed import DAMAGE, codec_of, damaged, decompressed_blocks
from pipeline.ingest.summary import TOO_LONG, Rejects

#: a colour code (ANSI SGR) as engines print them around their envelopes
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: bytes read per system call and parsed as one block: the column-wise readers cost a few
#: dozen Arrow calls and frames a block (8 MiB: ~8% less parsing than 4 MiB on TGI logs)
BLOCK_BYTES = 8 << 20
#: default cap on one line; a 128k-token prompt printed with repr() is about 1 MiB
DEFAULT_MAX_LINE_BYTES = 8 << 20

#: the UTF-8 byte-order mark some tools write at the start of a text file
BOM = b"\xef\xbb\xbf"


class Lines(list[str]):
    """A block's decoded lines, and (when its body decoded whole) the body's bytes, so that a
    column-wise reader gets them as an Arrow array without a Python object per line."""

    __slots__ = ("_body", "_head_lines")

    def __init__(
        self, lines: Iterable[str] = (), body: bytes | memoryview | None = None, head_lines: int = 0
    ) -> None:
        super().__init__(lines)
        #: the UTF-8 bytes of the lines after the first ``head_lines``, one ``\n`` after each
        #: (None: not known)
        self._body = body
        self._head_lines = head_lines

    def arrow(self) -> pa.StringArray:
        """The lines as an Arrow string array (the body cut from its bytes when known)."""
        if self._body is None or len(self) <= self._head_lines:
            return pa.array(self, pa.string())
        body = _arrow_lines(self._body, len(self) - self._head_lines)
        if body is None:
            return pa.array(self, pa.string())
        if not self._head_lines:
            return body
        head = pa.array(self[: self._head_lines], pa.string())
        return pa.concat_arrays([head, body])

    def binary(self) -> pa.BinaryArray:
        """The lines as Arrow binary values, each *with* its ``\\n``: the body's bytes viewed
        where they lie. No copy and no UTF-8 check (the lines decoded already): on a 100 MB
        vLLM log ~0.13 CPU-s less than :meth:`arrow`, which cuts the newlines off (a copy of
        every byte) and checks the UTF-8 again. Raises ``UnicodeEncodeError`` for a line that
        is no valid text (a lone surrogate), as :meth:`arrow` raises ``ArrowInvalid``."""
        count = len(self) - self._head_lines
        ends = None if self._body is None or count <= 0 else _newline_ends(self._body, count)
        if ends is None:
            return _binary_lines(self)
        offsets = np.empty(count + 1, np.int32)
        offsets[0], offsets[1:] = 0, ends
        body = pa.BinaryArray.from_buffers(
            pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(self._body)]
        )
        if not self._head_lines:
            return body
        return pa.concat_arrays([_binary_lines(self[: self._head_lines]), body])


def arrow_lines(lines: Iterable[str]) -> pa.StringArray:
    """``lines`` as an Arrow string array: from a :class:`Lines` block's bytes, else built."""
    if isinstance(lines, Lines):
        return lines.arrow()
    return pa.array(list(lines), pa.string())


def binary_lines(lines: Iterable[str]) -> pa.BinaryArray:
    """``lines`` as Arrow binary values, each with a ``\\n`` after it (see
    :meth:`Lines.binary`)."""
    if isinstance(lines, Lines):
        return lines.binary()
    return _binary_lines(lines)


def _binary_lines(lines: Iterable[str]) -> pa.BinaryArray:
    return pa.array([f"{line}\n".encode() for line in lines], pa.binary())


def _newline_ends(raw: bytes | memoryview, count: int) -> np.ndarray | None:
    """Where each of the ``count`` lines of ``raw`` ends, its ``\\n`` included; None when
    ``raw`` does not hold ``count`` lines."""
    ends = np.flatnonzero(np.frombuffer(raw, np.uint8) == 10)
    return ends + 1 if len(ends) == count else None


def _arrow_lines(raw: bytes | memoryview, count: int) -> pa.StringArray | None:
    """``count`` lines of ``raw`` (each ended by ``\n``): every line's bytes and its newline
    as one value, then the newline cut off (about 10x faster than building from strings);
    ``None`` when ``raw`` does not hold ``count`` lines."""
    ends = np.flatnonzero(np.frombuffer(raw, np.uint8) == 10)
    if len(ends) != count:
        return None
    offsets = np.empty(count + 1, np.int32)
    offsets[0], offsets[1:] = 0, ends + 1
    with_ends = pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(raw)]
    )
    return pc.binary_slice(with_ends, 0, -1).cast(pa.string())


def is_compressed(path: str | Path) -> bool:
    """True when the file is compressed (:mod:`~pipeline.ingest.compressed`, by its magic
    bytes, whatever its name)."""
    return codec_of(path) is not None


def range_blocks(raw: BinaryIO, size: int, start: int, end: int | None) -> Iterator[bytes]:
    """Blocks of at most ``size`` bytes of ``raw`` from ``start`` (already sought) to ``end``."""
    left = None if end is None else end - start
    while left is None or left > 0:
        block = raw.read(size if left is None else min(size, left))
        if not block:
            return
        if left is not None:
            left -= len(block)
        yield block


def read_head(path: Path, limit: int) -> bytes:
    """The first ``limit`` bytes of a file, decompressed when it is compressed.

    A damaged stream gives whatever came out before the damage: a head is a sample, not data.
    """
    codec = codec_of(path)
    with open(path, "rb") as raw:
        if codec is None:
            return raw.read(limit)
        data = b""
        try:
            for block in decompressed_blocks(raw, limit, codec):
                data += block
                if len(data) >= limit:
                    break
        except DAMAGE:
            pass
        return data[:limit]


def _skip(blocks: Iterator[bytes], count: int) -> Iterator[bytes]:
    """``blocks`` without their first ``count`` bytes."""
    for block in blocks:
        if count >= len(block):
            count -= len(block)
            continue
        yield block[count:]
        count = 0


def _without_bom(blocks: Iterator[bytes], reader: LineReader) -> Iterator[bytes]:
    """A file's blocks from its start, a leading byte-order mark dropped (and counted in
    ``reader.bytes_read``: offsets stay the file's)."""
    first = b""
    for block in blocks:
        first += block
        if len(first) >= len(BOM) or not BOM.startswith(first):
            break
    if first.startswith(BOM):
        reader.bytes_read += len(BOM)
        first = first[len(BOM) :]
    if first:
        yield first
    yield from blocks


def _newlines(data: bytes) -> tuple[bytes, bytes]:
    """``data`` with every line ending made ``\n`` (``\r\n`` and a lone ``\r``), and a last
    ``\r`` held back (its ``\n`` may be the first byte of the next block)."""
    if b"\r" not in data:
        return data, b""
    held = b""
    if data.endswith(b"\r"):
        data, held = data[:-1], b"\r"
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), held


class LineReader:
    """Iterate over blocks of decoded lines of one file (or one byte range of it).

    Iterating yields ``(first_line_no, lines)``; line numbers are 1-based and relative to
    ``first_line``. After iteration, ``offset`` is the byte offset just past the last line
    consumed (plain files), ``lines`` the number of lines seen, ``repaired`` the number of
    lines with invalid UTF-8.
    """

    def __init__(
        self,
        path: str | Path,
        rejects: Rejects,
        *,
        start: int = 0,
        end: int | None = None,
        first_line: int = 1,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        partial_tail: bool = True,
        block_bytes: int = BLOCK_BYTES,
        line_prefix: str | None = None,
    ) -> None:
        self.path = Path(path)
        #: the runtime's prefix each line loses (:mod:`~pipeline.ingest.line_prefixes`)
        self.line_prefix = line_prefix
        self.rejects = rejects
        self.start, self.end = start, end
        self.first_line = first_line
        self.max_line_bytes = max_line_bytes
        self.partial_tail = partial_tail
        self.block_bytes = block_bytes
        self.offset = start
        self.lines = 0
        self.repaired = 0
        self.bytes_read = 0
        #: the file's compression (None: plain)
        self.codec = codec_of(self.path)
        #: a block's line was decoded with surrogate escapes (for the joiner to mend)
        self._escaped = False
        #: a runtime's pieces of long lines joined (prefixes that cut lines)
        self.joiner = (
            line_prefixes.PieceJoiner(line_prefix, max_line_bytes, self._reject)
            if line_prefix in line_prefixes.PIECED
            else None
        )

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        # A block never exceeds the line cap, so a line inside one block is within the cap.
        size = min(self.block_bytes, self.max_line_bytes)
        with open(self.path, "rb") as raw:
            if self.codec is not None:  # offsets count decompressed bytes
                blocks = decompressed_blocks(raw, size, self.codec)
                yield from self._blocks(_skip(blocks, self.start))
            else:
                raw.seek(self.start)
                yield from self._blocks(range_blocks(raw, size, self.start, self.end))
        yield from self._end_pieces()

    def _blocks(self, source: Iterator[bytes]) -> Iterator[tuple[int, list[str]]]:
        if self.start == 0:
            source = _without_bom(source, self)
        carry = b""
        skipping = False  # inside a line already known to be too long
        line_no = self.first_line
        held_cr = b""  # a block's last byte "\r": its "\n" may start the next block
        while True:
            try:
                raw = next(source, b"")
            except DAMAGE as exc:
                reason = damaged(self.codec or "stream")
                self.rejects.add(reason, line_no, f"{type(exc).__name__}: {exc}")
                return  # the partial line in ``carry`` is incomplete: never consumed
            if not raw:
                break
            self.bytes_read += len(raw)
            block, held_cr = _newlines(held_cr + raw)
            cut = block.rfind(b"\n")
            if cut < 0:
                carry, skipping = self._grow(carry, block, skipping, line_no)
                continue
            # the block's lines: the one ``carry`` began, then its body (decoded in place)
            first_end = block.find(b"\n")
            first: bytes | None = None
            if skipping or len(carry) + first_end > self.max_line_bytes:
                if not skipping:
                    self.rejects.add(TOO_LONG, line_no, carry[:200])
                skipping = False
                self.lines += 1
                line_no += 1
            else:
                first = carry + block[: first_end + 1]
            lines = self._decode(first, memoryview(block)[first_end + 1 : cut + 1])
            carry = block[cut + 1 :]
            yield from self._emit(lines, line_no)
            line_no += len(lines)
            self.offset = self.start + self.bytes_read - len(carry) - len(held_cr) - self._held()
        if held_cr and self.partial_tail:  # the file ends with "\r": its last line is whole
            self.offset = self.start + self.bytes_read
            if skipping:
                self.lines += 1
            else:
                yield from self._emit([self._decode_line(carry)], line_no)
            return
        yield from self._tail(carry, skipping, line_no)

    def _grow(self, carry: bytes, block: bytes, skipping: bool, line_no: int) -> tuple[bytes, bool]:
        """Accumulate a line with no newline yet; past the cap, start skipping it."""
        if skipping:
            return b"", True
        if len(carry) + len(block) > self.max_line_bytes:
            self.rejects.add(TOO_LONG, line_no, (carry[:200] + block[:200])[:200])
            return b"", True
        return carry + block, False

    def _decode(self, first: bytes | None, body: memoryview) -> list[str]:
        """The lines of ``first`` (one line, or None) and ``body`` (whole lines), each ended by
        ``\n``. The body is decoded where it lies, not copied: a block's bytes are copied only
        into its text and its lines (an 8 MiB copy also costs 2,048 fresh pages)."""
        head = [] if first is None else [self._decode_line(first[:-1])]
        try:
            text = str(body, "utf-8")
        except UnicodeDecodeError:
            raw_lines = bytes(body)[:-1].split(b"\n") if len(body) else []
            return head + [self._decode_line(raw) for raw in raw_lines]
        lines = text.split("\n")
        lines.pop()  # the text ends with "\n": nothing after it
        if head:
            lines.insert(0, head[0])
        return Lines(lines, body, len(head))

    def _decode_line(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            if self.joiner is not None:  # a character may lie in two pieces: mended joined
                self._escaped = True
                return raw.decode("utf-8", "surrogateescape")
            self.repaired += 1
            return raw.decode("utf-8", "replace")

    def _emit(self, lines: list[str], line_no: int) -> Iterator[tuple[int, list[str]]]:
        self.lines += len(lines)
        if lines and self.joiner is not None:
            runs = self.joiner.feed(lines, line_no, self._escaped)
            self._escaped = False
            yield from self._mended(runs)
            return
        if lines and self.line_prefix is not None:
            lines = line_prefixes.stripped(lines, self.line_prefix)
        if lines:
            yield line_no, lines

    def _reject(self, reason: str, line_no: int, sample: str) -> None:
        self.rejects.add(reason, line_no, sample)  # (a parse swaps them piece by piece)

    def _held(self) -> int:
        """Bytes of the pieces of a line held for its last piece (not consumed yet)."""
        return 0 if self.joiner is None else self.joiner.held_bytes

    def _end_pieces(self) -> Iterator[tuple[int, list[str]]]:
        """At the end: a whole file's held pieces are read as they are (numbered as its last
        line); a growing file's are left for the next run (its offset is before them)."""
        if self.joiner is None or not self.joiner.held:
            return
        if self.partial_tail:
            self.offset = self.start + self.bytes_read
            yield from self._mended(self.joiner.flush(self.first_line + self.lines - 1))
        else:
            self.lines -= self.joiner.held_lines

    def _mended(self, runs: list[tuple[int, list[str]]]) -> list[tuple[int, list[str]]]:
        """``runs`` of the joiner, its count of lines with bytes that are no UTF-8 taken."""
        if self.joiner is not None:
            self.repaired += self.joiner.mended
            self.joiner.mended = 0
        return runs

    def _tail(self, carry: bytes, skipping: bool, line_no: int) -> Iterator[tuple[int, list[str]]]:
        """The last line has no newline: consume it only when the file is finished."""
        if skipping:
            if self.partial_tail:
                self.lines += 1
                self.offset = self.start + self.bytes_read
            return
        if carry and self.partial_tail:
            self.offset = self.start + self.bytes_read
            yield from self._emit([self._decode_line(carry)], line_no)
