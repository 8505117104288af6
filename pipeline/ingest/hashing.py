"""Prefix hashes of many prompts that share their heads, without re-reading the heads.

Requests of one service share long heads (a system prompt, a template's static part). A
pseudo-token that ends before the start of the last token lying wholly inside a head is
decided by the head alone (its greedy match stops at a character of the head), so its tokens
and the hashes of the blocks they fill can be remembered per head and reused: the same
hashes as :func:`pipeline.prefix.block_hashes`, with only the tail tokenised.
"""

from __future__ import annotations

from pipeline.prefix import chain_hashes, pseudo_tokens

#: head lengths (characters) remembered, longest first
HEAD_LENGTHS = (4096, 1024, 256)
#: heads remembered per length; the cache is dropped when full (cheap, and traffic is bursty)
HEADS_PER_LENGTH = 1024


class PrefixHasher:
    """``block_hashes`` with a per-head memory of tokens and hashes."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.heads: dict[int, dict[str, tuple[list[str], list[str], int]]] = {
            n: {} for n in HEAD_LENGTHS
        }

    def hashes(self, prompt: str) -> list[str]:
        """Chain hashes of the whole blocks of ``prompt``."""
        for length in HEAD_LENGTHS:
            if len(prompt) > length:
                hit = self.heads[length].get(prompt[:length])
                if hit is not None:
                    tokens, known, end = hit
                    tail = pseudo_tokens(prompt[end:])
                    return chain_hashes(tokens + tail, self.block_size, known)
        tokens = pseudo_tokens(prompt)
        hashes = chain_hashes(tokens, self.block_size)
        self._remember(prompt, tokens, hashes)
        return hashes

    def _remember(self, prompt: str, tokens: list[str], hashes: list[str]) -> None:
        end, count, stable = 0, 0, []
        for length in sorted(HEAD_LENGTHS):
            if len(prompt) <= length:
                break
            # tokens ending before the start of the last token inside the head
            while count < len(tokens) and end + len(tokens[count]) < length:
                end += len(tokens[count])
                count += 1
            stable.append((length, count, end))
        for length, count, end in stable:
            if count < 1:
                continue
            kept = tokens[: count - 1]
            kept_end = end - len(tokens[count - 1])
            whole = len(kept) // self.block_size
            table = self.heads[length]
            if len(table) >= HEADS_PER_LENGTH:
                table.clear()
            table[prompt[:length]] = (kept, hashes[:whole], kept_end)
