"""Synthetic vLLM and TGI logs in the real formats of FORMATS.md, for benchmarks and tests.

vLLM: v0.11 layout (ANSI ``(APIServer pid=1)`` tag, R9 ``Received request``, ``Added``,
``Generated response``, uvicorn access lines, ``Engine 000`` stats every 40 requests); chat
requests carry a chat-template prompt, completions a prompt and its token ids. TGI: v3.3 text
(``LOG_COLORIZE=1``): ``Success`` events with quoted ``GenerateParameters`` and timings, plus
validation and overload errors. Prompts combine 8 system prompts with drawn user messages, so
some prefixes repeat and most tails do not — as in real traffic.

As a command, it writes logs of ``--size-mb`` into ``--out`` and reports lines, bytes and MB/s
of generation::

    python benchmarks/loggen.py [--formats vllm,tgi] [--size-mb 64] [--out DIR] [--smoke]

``--smoke`` writes 256 KB of each format into a temporary folder: what the test suite runs.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

E = "\x1b"
TAG = f"{E}[1;36m(APIServer pid=1){E}[0;0m "
WORDS = " ".join(
    (
        "the of and to in is it for on with as by at from this that are be or an was not have all "
        "cache prefix model token request latency engine warm cold batch queue memory kernel graph "
        "python rust deploy cluster replica tenant adapter prompt template system answer question "
        "explain summarize translate write code review bug fix test plan budget score window",
    )
).split()


def _system(i: int) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(40 + 20 * i)).capitalize() + "."


SYSTEMS = [_system(i) for i in range(8)]
SP = (
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
    "temperature={t}, top_p={p}, top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
    "bad_words=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={m}, "
    "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
    "spaces_between_special_tokens=True, truncate_prompt_tokens=None, structured_outputs=None, "
    "extra_args=None)"
)
GP = (
    "GenerateParameters {{ best_of: None, temperature: Some({t}), repetition_penalty: None, "
    "frequency_penalty: None, top_k: None, top_p: Some({p}), typical_p: None, do_sample: true, "
    "max_new_tokens: Some({m}), return_full_text: None, stop: [], truncate: None, watermark: "
    "false, details: true, decoder_input_details: false, seed: None, top_n_tokens: None, "
    'grammar: None, adapter_id: Some(\\"{a}\\") }}'
)


def _user(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60))) + "?"


def _clock(i: int) -> str:
    seconds = 36000 + i // 20  # 20 requests a second
    return f"10-03 {seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def vllm_request(rng: random.Random, i: int) -> list[str]:
    """The lines one request leaves in a v0.11 vLLM log."""
    ts = _clock(i)
    rid = f"{rng.getrandbits(128):032x}"
    system, user = rng.choice(SYSTEMS), _user(rng)
    params = SP.format(
        t=rng.choice((0.0, 0.7, 1.0)), p=rng.choice((1.0, 0.9)), m=rng.choice((64, 256, 1024))
    )
    if rng.random() < 0.8:
        rid = f"chatcmpl-{rid}"
        prompt = (
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        ids, path = "None", "/v1/chat/completions"
    else:
        rid = f"cmpl-{rid}-0"
        prompt = f"{system} {user}"
        ids = str([rng.randrange(150000) for _ in range(len(prompt) // 4)])
        path = "/v1/completions"
    out_ids = [rng.randrange(150000) for _ in range(rng.randint(5, 40))]
    return [
        f"{TAG}INFO {ts} [logger.py:40] Received request {rid}: prompt: {prompt!r}, "
        f"params: {params}, prompt_token_ids: {ids}, prompt_embeds shape: None, "
        "lora_request: None.",
        f"{TAG}INFO {ts} [async_llm.py:316] Added request {rid}.",
        f"{TAG}INFO {ts} [logger.py:71] Generated response {rid}: output: {user[:40]!r}, "
        f"output_token_ids: {out_ids}, finish_reason: stop",
        f'{TAG}INFO:     172.17.0.1:{40000 + i % 20000} - "POST {path} HTTP/1.1" 200 OK',
    ]


def vllm_stats(i: int) -> str:
    """An ``Engine 000`` stats line."""
    return (
        f"{TAG}INFO {_clock(i)} [loggers.py:127] Engine 000: Avg prompt throughput: {i % 997}.5 "
        f"tokens/s, Avg generation throughput: {i % 503}.1 tokens/s, Running: {i % 30} reqs, "
        f"Waiting: {i % 7} reqs, GPU KV cache usage: {i % 100}.0%, Prefix cache hit rate: 41.2%"
    )


def tgi_request(rng: random.Random, i: int) -> str:
    """One TGI v3 text event: mostly ``Success``, some validation and overload errors."""
    seconds = 30000 + i // 20
    clock = f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    ts = f"2025-06-03T{clock}.{rng.randrange(10**6):06d}Z"
    params = GP.format(
        t=rng.choice((0.2, 0.7)), p=rng.choice((0.9, 0.95)), m=rng.choice((64, 512)),
        a=rng.choice(("llama-8b", "sql-lora", "chat-lora")),
    )  # fmt: skip
    roll = rng.random()
    if roll < 0.03:
        return (
            f'{ts} ERROR chat_completions{{parameters="{params}"}}:async_stream:generate_stream: '
            "text_generation_router::infer: router/src/infer/mod.rs:126: `inputs` tokens + "
            "`max_new_tokens` must be <= 8192. Given: 8150 `inputs` tokens and 100 "
            "`max_new_tokens`"
        )
    if roll < 0.05:
        raw = params.replace(chr(92), "")
        return (
            f"{ts} ERROR generate{{parameters={raw}}}:generate:generate_stream: "
            "text_generation_router::infer: router/src/infer/mod.rs:118: no permits available"
        )
    infer = rng.uniform(0.1, 8.0)
    tokens = rng.randint(5, 500)
    return (
        f'{ts}  INFO chat_completions{{parameters="{params}" total_time="{infer + 0.002:.9f}s" '
        f'validation_time="{rng.uniform(100, 999):.3f}µs" '
        f'queue_time="{rng.uniform(50, 999):.3f}µs" '
        f'inference_time="{infer:.9f}s" time_per_token="{infer / tokens * 1000:.6f}ms" '
        f'seed="Some({rng.getrandbits(64)})"}}: text_generation_router::server: '
        "router/src/server.rs:432: Success"
    )


def vllm_lines(seed: int = 0) -> Iterator[str]:
    """An endless vLLM log."""
    rng = random.Random(seed)
    i = 0
    while True:
        yield from vllm_request(rng, i)
        if i % 40 == 39:
            yield vllm_stats(i)
        i += 1


def tgi_lines(seed: int = 0) -> Iterator[str]:
    """An endless TGI log."""
    rng = random.Random(seed)
    i = 0
    while True:
        yield tgi_request(rng, i)
        i += 1


def write_log(path: Path, lines: Iterator[str], size_bytes: int) -> int:
    """Write lines until the file holds at least ``size_bytes``; return the line count."""
    written = count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        batch: list[str] = []
        for line in lines:
            batch.append(line)
            count += 1
            if len(batch) == 2000:
                text = "\n".join(batch) + "\n"
                out.write(text)
                written += len(text.encode())
                batch.clear()
                if written >= size_bytes:
                    break
    return count


LINES = {"vllm": vllm_lines, "tgi": tgi_lines}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--formats", default="vllm,tgi")
    parser.add_argument("--size-mb", type=float, default=64.0)
    parser.add_argument("--out", type=Path, help="folder for the logs (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true", help="256 KB per format")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size_mb = 0.25
    with tempfile.TemporaryDirectory(prefix="prewarm-loggen-") as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        report = {}
        for kind in args.formats.split(","):
            path = folder / f"{kind}.log"
            started = time.perf_counter()
            lines = write_log(path, LINES[kind](), int(args.size_mb * 2**20))
            seconds = time.perf_counter() - started
            size = path.stat().st_size
            report[kind] = {"path": str(path), "lines": lines, "bytes": size,
                            "mb_per_s": round(size / 2**20 / seconds, 1)}  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
