"""Prefixes a container runtime puts before every line an engine printed.

Logs often reach prewarm through the tool that ran the engine rather than straight from it:

* ``docker compose logs`` puts the service and replica before each line (``vllm-1  | ``;
  Compose v1: ``vllm_1  | ``);
* ``kubectl logs --prefix`` the pod and container (``[pod/vllm-6d4f/vllm] ``);
* ``kubectl logs --timestamps`` and ``docker logs --timestamps`` the time the runtime received
  the line, RFC 3339 with up to nanoseconds (``2025-06-03T09:42:00.118204123Z ``), after the
  Compose or kubectl prefix when both are asked for;
* ``journalctl`` (an engine run as a systemd unit) the time, host and process, in its
  ``short``, ``short-precise`` and ``short-iso`` outputs
  (``Jun 03 09:42:00 gpu-7 vllm[2301]: ``, ``2025-06-03T09:42:00+0000 gpu-7 vllm[2301]: ``);
* a Kubernetes node's container log files (``/var/log/containers``, ``/var/log/pods``: the
  CRI logging format of containerd and CRI-O) the time, the stream and a tag
  (``2025-06-03T09:42:00.118204123Z stdout F ``). The runtime cuts a line longer than its
  ``max_container_log_line_size`` (16 KiB by default: a vLLM request line with a long
  prompt) into pieces tagged ``P``, the last one ``F``: :class:`PieceJoiner` puts them back
  together, one line again, numbered as its last piece;
* Docker's default logging driver (``json-file``: the files under
  ``/var/lib/docker/containers``) a JSON object per line, the line in its ``log`` field; a line
  longer than 16 KiB comes in pieces whose ``log`` has no newline, joined the same way.

A file's prefix is found from its head (:func:`pipeline.ingest.detect.detect`): the one that
makes the most head lines read as a format, when it precedes nearly all of them. Each line
then loses it before it is parsed; a line without it is read as it is. Offsets, line numbers
and reject samples stay the file's own.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

import msgspec

from pipeline.ingest.summary import TOO_LONG, Rejects

#: (a terminal gets the service name in colour: the codes are part of the prefix)
_COMPOSE = r"(?:\x1b\[[0-9;]*m)*[\w.-]+[-_]\d+ *\|(?:\x1b\[[0-9;]*m)* ?"
_KUBECTL = r"\[pod/[^\]\s]+\] "
_STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) "
_JOURNAL = (
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,6})?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,6})?(?:Z|[+-]\d\d:?\d\d)) "
    r"[^\s]+ [^\s\[\]:]+(?:\[\d+\])?: "
)

#: the CRI logging format: time, stream, tag (``P`` a piece of a longer line, ``F`` its last
#: piece or a whole line; later tags after a ``:``), then the line (an empty one: no space)
_CRI = (
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) "
    r"(?P<stream>stdout|stderr) (?P<tag>[FP])(?::\S*)?(?: |$)"
)

#: Docker's default logging driver (json-file: ``/var/lib/docker/containers/<id>/*-json.log``)
#: writes each line as a JSON object, the line with its newline in ``log`` (a piece of a line
#: longer than 16 KiB: no newline)
_DOCKER_JSON = r'\{"log":"'

#: name -> the prefix at the start of a line, longest combinations first
LINE_PREFIXES: dict[str, str] = {
    "docker json-file": _DOCKER_JSON,
    "kubernetes CRI": _CRI,
    "docker compose, timestamps": _COMPOSE + _STAMP,
    "docker compose": _COMPOSE,
    "kubectl prefix, timestamps": _KUBECTL + _STAMP,
    "kubectl prefix": _KUBECTL,
    "runtime timestamps": _STAMP,
    "journalctl": _JOURNAL,
}
#: the share of a head's lines a prefix must start for the file to be read as prefixed
SHARE = 0.9


@functools.cache
def pattern(name: str) -> re.Pattern[str]:
    """The compiled prefix called ``name``."""
    return re.compile(LINE_PREFIXES[name])


def stripped(lines: Sequence[str], name: str) -> list[str]:
    """``lines`` without the prefix ``name`` where they start with it (under a runtime that
    cuts long lines: each piece's own text)."""
    read = piece_reader(name)
    if read is not None:
        return [piece[0] if (piece := read(line)) is not None else line for line in lines]
    match = pattern(name).match
    out = []
    for line in lines:
        found = match(line)
        out.append(line[found.end() :] if found is not None else line)
    return out


#: a line of a runtime that cuts long lines: its text, its stream, whether more pieces follow
Piece = tuple[str, str, bool]


def piece_reader(name: str | None) -> Callable[[str], Piece | None] | None:
    """How a line under the prefix ``name`` is read, as a piece (the reader gives ``None`` for
    a line without the prefix); ``None`` where the runtime cuts no line into pieces."""
    return _PIECE_READERS.get(name) if name is not None else None


def _cri_piece(line: str) -> Piece | None:
    found = pattern("kubernetes CRI").match(line)
    if found is None:
        return None
    return line[found.end() :], found.group("stream"), found.group("tag") == "P"


class _DockerEntry(msgspec.Struct):
    log: str
    stream: str = ""


_DOCKER_DECODER = msgspec.json.Decoder(_DockerEntry)
#: a code point JSON can escape that UTF-8 cannot hold (a lone surrogate)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _docker_piece(line: str) -> Piece | None:
    if not line.startswith('{"log":"'):
        return None
    try:
        entry = _DOCKER_DECODER.decode(line)
    except msgspec.DecodeError:  # (not JSON, or not Docker's: read as it is)
        return None
    text = entry.log
    if _SURROGATE.search(text) is not None:  # (Docker writes none; a forged line might)
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if not text.endswith("\n"):
        return text, entry.stream, True
    return text[:-1].removesuffix("\r"), entry.stream, False


#: the runtimes that cut long lines into pieces: how each one's lines are read
_PIECE_READERS: dict[str, Callable[[str], Piece | None]] = {
    "kubernetes CRI": _cri_piece,
    "docker json-file": _docker_piece,
}
#: the prefixes whose lines may be pieces of one longer line
PIECED = frozenset(_PIECE_READERS)


def unprefixed(lines: Sequence[str], name: str) -> list[str]:
    """``lines`` as the engine printed them: without the prefix ``name``, and, under a runtime
    that cuts long lines, its pieces joined (a sample: the last line may stay cut)."""
    if name not in PIECED:
        return stripped(lines, name)
    joiner = PieceJoiner(name, sum(map(len, lines)), Rejects("").add)
    runs = [*joiner.feed(lines, 1), *joiner.flush(len(lines))]
    return [line for _, run in runs for line in run]


def candidates(lines: Sequence[str]) -> list[str]:
    """The prefixes that start at least :data:`SHARE` of ``lines``."""
    if not lines:
        return []
    return [
        name
        for name in LINE_PREFIXES
        if sum(1 for line in lines if pattern(name).match(line)) >= SHARE * len(lines)
    ]


#: counts a rejected line: reason, line number, sample
Reject = Callable[[str, int, str], None]
#: a byte that is no UTF-8, decoded with ``surrogateescape``
_ESCAPED = re.compile("[\udc80-\udcff]")


class PieceJoiner:
    """The lines of a file under a prefix of :data:`PIECED`, without it, pieces joined.

    A stream's pieces (``P``) are held until its last piece (``F``) comes; the joined line
    takes the last piece's number, so the numbers of the lines handed out only grow (the held
    pieces' numbers are skipped). ``held_bytes`` / ``held_lines``: what is held now (a reader
    that stops before the end of a growing file leaves them for its next run).
    """

    def __init__(self, name: str, max_chars: int, reject: Reject) -> None:
        self.read = _PIECE_READERS[name]
        self.max_chars = max_chars
        #: counts a line passing the cap (the reader's rejects of the moment)
        self.reject = reject
        #: per stream: the pieces held, and the bytes and lines they took in the file
        self.pieces: dict[str, list[str]] = {}
        self.held: dict[str, tuple[int, int]] = {}
        #: streams whose line passed the cap: their pieces are dropped up to the last one
        self.dropping: set[str] = set()
        #: streams whose held pieces hold bytes that are no UTF-8 (surrogate escapes)
        self.escaped: set[str] = set()
        #: lines handed out with bytes that were no UTF-8 even joined (replaced)
        self.mended = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the file the held pieces took."""
        return sum(size for size, _ in self.held.values())

    @property
    def held_lines(self) -> int:
        """Lines of the file the held pieces took."""
        return sum(count for _, count in self.held.values())

    def feed(
        self, lines: Sequence[str], line_no: int, escaped: bool = False
    ) -> list[tuple[int, list[str]]]:
        """The lines of a block numbered from ``line_no``, in runs of consecutive numbers.

        ``escaped``: some lines were decoded with ``surrogateescape`` (bytes that are no
        UTF-8 kept as they were): the runtime cuts a line at a byte count, so a character
        can lie in two pieces. Joined, such a line is decoded again; what is still not UTF-8
        is replaced (U+FFFD) and the line counted in ``mended``."""
        runs: list[tuple[int, list[str]]] = []
        run: list[str] = []
        start = line_no
        for i, line in enumerate(lines):
            piece = self.read(line)
            if piece is None:  # (a line without the prefix is read as it is)
                run.append(self._mend(line) if escaped else line)
                continue
            text, stream, more = piece
            whole = None
            if more:
                self._hold(stream, text, line, line_no + i)
            else:
                whole = self._joined(stream, text, line_no + i)
            if whole is None:
                if run:
                    runs.append((start, run))
                run, start = [], line_no + i + 1
            else:
                run.append(self._mend(whole) if escaped or stream in self.escaped else whole)
                self.escaped.discard(stream)
        if run:
            runs.append((start, run))
        return runs

    def _mend(self, line: str) -> str:
        if _ESCAPED.search(line) is None:
            return line
        raw = line.encode("utf-8", "surrogateescape")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.mended += 1
            return raw.decode("utf-8", "replace")

    def flush(self, line_no: int) -> list[tuple[int, list[str]]]:
        """What is held when the file ends (a line whose last piece never came: it is read
        as the runtime left it), numbered ``line_no`` on."""
        runs = []
        for stream in list(self.held):
            whole = self._joined(stream, "", line_no)
            if whole is not None:
                runs.append((line_no, [self._mend(whole)]))
                line_no += 1
        return runs

    def _hold(self, stream: str, text: str, line: str, line_no: int) -> None:
        size, count = self.held.get(stream, (0, 0))
        # the line's bytes as read (surrogate escapes back to theirs) and its "\n" (runtimes
        # end their lines so)
        self.held[stream] = (size + len(line.encode("utf-8", "surrogateescape")) + 1, count + 1)
        if stream in self.dropping:
            return
        pieces = self.pieces.setdefault(stream, [])
        pieces.append(text)
        if _ESCAPED.search(text) is not None:
            self.escaped.add(stream)
        if sum(map(len, pieces)) > self.max_chars:
            self.reject(TOO_LONG, line_no, "".join(pieces)[:200])
            self.dropping.add(stream)
            del self.pieces[stream]

    def _joined(self, stream: str, text: str, line_no: int) -> str | None:
        """The line a last piece ends (``None``: dropped, it passed the cap)."""
        self.held.pop(stream, None)
        if stream in self.dropping:
            self.dropping.discard(stream)
            return None
        pieces = self.pieces.pop(stream, None)
        if pieces is None:
            return text
        whole = "".join(pieces) + text
        if len(whole) > self.max_chars:
            self.reject(TOO_LONG, line_no, whole[:200])
            return None
        return whole
