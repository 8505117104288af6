"""Compressed log files, read as the text they hold.

Rotated logs are compressed by whatever rotated them: gzip by default (logrotate, Docker's
``local`` driver, the kubelet), bzip2, xz or zstd where logrotate's ``compresscmd`` says so.
A file is known by its magic bytes, never by its name (``app.log.1`` may be gzip, ``x.gz``
plain text). Every codec hands out blocks of at most ``size`` decompressed bytes, whatever
the compression ratio (a stream of newlines compresses a thousandfold), and everything
decompressed before a truncation or a corruption, then raises one of :data:`DAMAGE`.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import zstandard

#: what a damaged stream raises (a cut file, a flipped bit, a wrong checksum)
DAMAGE = (EOFError, OSError, zlib.error, lzma.LZMAError, zstandard.ZstdError)

_BZIP2_BLOCKS = (b"1AY&SY", b"\x17rE8P\x90")  # a block, or the end of an empty stream
#: the bytes a file of each codec starts with
_MAGIC: dict[str, Callable[[bytes], bool]] = {
    "gzip": lambda head: head.startswith(b"\x1f\x8b"),
    "bzip2": lambda head: head[:3] == b"BZh" and head[3:4] in b"123456789"
    and head[4:10] in _BZIP2_BLOCKS,
    "xz": lambda head: head.startswith(b"\xfd7zXZ\x00"),
    "zstd": lambda head: head.startswith(b"\x28\xb5\x2f\xfd"),
}  # fmt: skip
#: how much of a file tells its codec
_MAGIC_BYTES = 10


def codec_of(path: str | Path) -> str | None:
    """The compression of ``path`` ("gzip", "bzip2", "xz", "zstd"), ``None`` for plain."""
    with open(path, "rb") as handle:
        head = handle.read(_MAGIC_BYTES)
    return next((name for name, starts in _MAGIC.items() if starts(head)), None)


def damaged(codec: str) -> str:
    """The reject reason of a truncated or corrupt stream of ``codec``."""
    return f"truncated or corrupt {codec}"


def decompressed_blocks(raw: BinaryIO, size: int, codec: str) -> Iterator[bytes]:
    """The decompressed bytes of ``raw`` in blocks of at most ``size`` (streams or members
    one after another read as one)."""
    return _BLOCKS[codec](raw, size)


def gunzip_blocks(raw: BinaryIO, size: int) -> Iterator[bytes]:
    """Decompressed blocks of a gzip stream (several members allowed).

    Unlike ``gzip.GzipFile`` this hands out everything decompressed before a truncation or a
    corruption, then raises ``EOFError`` / ``zlib.error``.
    """
    inflater, pending, fed, full = zlib.decompressobj(wbits=31), b"", False, False
    while True:
        if not pending and not full:  # a full block may leave output inside the inflater
            pending = raw.read(1 << 20)
            if not pending:
                if fed and not inflater.eof:
                    raise EOFError("compressed stream ends before its end-of-stream marker")
                return
        out = inflater.decompress(pending, size)
        fed, pending, full = True, inflater.unconsumed_tail, len(out) == size
        if out:
            yield out
        if inflater.eof:  # next member, if any (an ended member holds no more output)
            pending, inflater = inflater.unused_data, zlib.decompressobj(wbits=31)
            fed = full = False


def unzstd_blocks(raw: BinaryIO, size: int) -> Iterator[bytes]:
    """Decompressed blocks of a zstd stream (several frames allowed), fed
    :data:`_ZSTD_FEED` bytes at a time: a zstd decompressor takes no output limit, and a
    frame's end is told only by its ``eof`` (its stream reader ends a cut frame silently)."""
    inflater, fed, out = zstandard.ZstdDecompressor().decompressobj(), False, bytearray()
    while data := raw.read(_ZSTD_FEED):
        out += inflater.decompress(data)
        fed = True
        while inflater.eof:  # the next frame, if any
            rest, inflater = inflater.unused_data, zstandard.ZstdDecompressor().decompressobj()
            fed = bool(rest)
            if not rest:
                break
            out += inflater.decompress(rest)
        while len(out) >= size:
            yield bytes(out[:size])
            del out[:size]
    if out:
        yield bytes(out)
    if fed:
        raise EOFError("compressed stream ends inside a zstd frame")


#: compressed bytes a zstd decompressor is fed at once: a block of 128 KiB can take 4 bytes,
#: so no call gives more than about 8 MiB
_ZSTD_FEED = 256


def bunzip_blocks(raw: BinaryIO, size: int) -> Iterator[bytes]:
    """Decompressed blocks of a bzip2 stream (several streams allowed)."""
    with bz2.BZ2File(raw) as reader:  # (closing it leaves ``raw`` open)
        yield from _read_blocks(reader, size)


def unxz_blocks(raw: BinaryIO, size: int) -> Iterator[bytes]:
    """Decompressed blocks of an xz (or lzma) stream (several streams allowed)."""
    with lzma.LZMAFile(raw) as reader:
        yield from _read_blocks(reader, size)


def _read_blocks(reader: bz2.BZ2File | lzma.LZMAFile, size: int) -> Iterator[bytes]:
    """The standard library's readers go on stream after stream and take an output limit;
    ``read1`` hands out what one step decompressed (``read`` gathers steps until it has
    ``size`` bytes, and loses them when a later step finds the damage)."""
    while block := reader.read1(size):
        yield block


_BLOCKS: dict[str, Callable[[BinaryIO, int], Iterator[bytes]]] = {
    "gzip": gunzip_blocks, "bzip2": bunzip_blocks, "xz": unxz_blocks, "zstd": unzstd_blocks,
}  # fmt: skip
