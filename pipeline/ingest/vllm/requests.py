"""A vLLM log piece's requests, joined by request id: the record each line adds to, its
status, prompt, token counts and prefix hashes; at the end of the piece, heads (the defining
``Received request`` line was read here) and tails (follow-up lines of a request whose head is
in an earlier piece)."""

from __future__ import annotations

import re
from typing import Any

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.hashing import PrefixHasher
from pipeline.ingest.vllm.fields import endpoint_of
from pipeline.ingest.vllm.request_lines import as_token_ids, cut_looking, listed_count
from pipeline.prefix_blocks import block_hashes_from_ids

ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
#: a prompt's prefix hashes until the piece ends and its prompts are hashed together
_HASHED_LATER = object()

Record = dict[str, Any]


def settle(record: Record, status: str) -> None:
    """Give a request ``status``: an outcome replaces "received" and "ok", "ok" nothing else
    (a request that was aborted, failed or rejected stays so)."""
    if status != "ok" or record.get("status") in (None, "received", "ok"):
        record["status"] = status


class RequestJoins:
    """The requests of one piece by id, and the counts their lines leave in ``result``
    (longest prompt and id list, ``--max-log-len`` evidence)."""

    def __init__(self, result: ChunkResult, block_size: int) -> None:
        self.out = result
        self.block_size = block_size
        self.requests: dict[str, Record] = {}
        self._hasher = PrefixHasher(block_size)
        #: the records that took a prompt, and the prompt, in log order
        self._prompted: list[tuple[Record, str]] = []

    # --- which record a line adds to ------------------------------------------------------

    def record(self, request_id: str, ts: str, line_no: int) -> Record:
        """The record of ``request_id`` (a tail until its head line is read)."""
        record = self.requests.get(request_id)
        if record is None:
            record = {"request_id": request_id, "ts": ts, "_line": line_no, "_head": False}
            self.requests[request_id] = record
        return record

    def engine_id(self, request_id: str) -> str:
        """Strip the engine's 8-hex suffix when the id without it is known (FORMATS.md 1.12)."""
        if request_id in self.requests:
            return request_id
        base = ENGINE_SUFFIX.sub("", request_id)
        return base if base in self.requests else request_id

    def set_status(self, request_id: str, status: str, ts: str, line_no: int) -> None:
        settle(self.record(request_id, ts, line_no), status)

    def new_head(self, request_id: str, ts: str, line_no: int) -> Record:
        """The record a ``Received request`` line is the head of (its fields are set by the
        caller)."""
        record = self.requests.get(request_id)
        if record is not None and (record["_head"] or record.get("status") is not None):
            # A reused id (client X-Request-Id, a restart) is a new request: later lines join
            # the new one. An outcome seen before it belongs to an earlier request (a tail);
            # a DEBUG details line printed just before it belongs to this one.
            self.requests[f"{request_id}\x00{line_no}"] = self.requests.pop(request_id)
            record = None
        if record is None:  # (one literal: the usual case, a request not seen before)
            record = self.requests[request_id] = {
                "request_id": request_id, "ts": ts, "_line": line_no, "_head": True,
                "status": "received", "endpoint": endpoint_of(request_id),
            }  # fmt: skip
            return record
        record["ts"], record["_line"], record["_head"] = ts, line_no, True
        record.setdefault("status", "received")
        record["endpoint"] = endpoint_of(request_id)
        return record

    # --- what a record holds --------------------------------------------------------------

    def set_prompt(self, record: Record, prompt: str | None) -> None:
        """The prompt of ``record``; its prefix hashes come when the piece ends
        (:meth:`_hash_prompts`)."""
        record["prompt"] = prompt
        if prompt is None:
            return
        if len(prompt) > self.out.longest_prompt:
            self.out.longest_prompt = len(prompt)
        self._prompted.append((record, prompt))
        record["prefix_hashes"] = _HASHED_LATER  # (text hashes win over token ids' hashes)

    def set_ids(self, record: Record, ids: str | None) -> None:
        """The prompt's printed token ids: their count, and the prefix hashes of their blocks
        when the record has no prompt text to hash."""
        if not ids or ids == "None" or not ids.startswith("["):
            return
        body = ids[1 : ids.rfind("]")]
        count = listed_count(body)
        self.set_id_count(record, count)
        if record.get("prefix_hashes") is None and count >= self.block_size:
            token_ids = as_token_ids(body)
            if token_ids is None:  # (the record keeps what else its lines said)
                self.out.ignored["token ids not integers (no block hashes from them)"] += 1
                return
            record["prefix_hashes"] = block_hashes_from_ids(token_ids, self.block_size)

    def set_id_count(self, record: Record, count: int) -> None:
        record["_ids_len"] = count
        if count > self.out.longest_ids:
            self.out.longest_ids = count
        prompt = record.get("prompt")
        if prompt is not None and len(prompt) == count and cut_looking(prompt, count):
            self.out.cap_evidence[count] += 1

    def count_output(self, record: Record, mode: str, ids: str | None) -> None:
        """The output token count a ``Generated response`` line prints (streaming deltas add
        up)."""
        if ids is None or not ids.startswith("["):
            return
        count = listed_count(ids[1 : ids.rfind("]")])
        if count > self.out.longest_ids:  # --max-log-len cuts output ids too
            self.out.longest_ids = count
        if mode == "(streaming delta)":
            record["_delta_tokens"] = record.get("_delta_tokens", 0) + count
        else:
            record["output_tokens"] = count

    # --- end of the piece -----------------------------------------------------------------

    def _hash_prompts(self) -> None:
        """The prefix hashes of the piece's prompts, hashed together (each distinct prompt
        once, in log order: :meth:`~pipeline.ingest.hashing.PrefixHasher.hashes_many`), set
        on their records in the order the records took them."""
        prompts = list(dict.fromkeys(prompt for _, prompt in self._prompted))
        hashes = dict(zip(prompts, self._hasher.hashes_many(prompts), strict=True))
        for record, prompt in self._prompted:
            record["prefix_hashes"] = hashes[prompt]
        self._prompted.clear()

    def split(self) -> None:
        """Hash the prompts and put the joined requests into ``result``: heads (defining line
        seen here), in line order, and tails."""
        self._hash_prompts()
        for record in self.requests.values():
            if record.pop("_head"):
                delta = record.pop("_delta_tokens", None)
                if delta is not None and record.get("output_tokens") is None:
                    record["output_tokens"] = delta
                self.out.heads.append(record)
            else:  # streaming deltas stay a count to add: the head's chunk has the first ones
                self.out.tails[record["request_id"]] = record
        self.out.heads.sort(key=lambda r: r["_line"])
