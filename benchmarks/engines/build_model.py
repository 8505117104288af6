"""Build a tiny Llama model and its tokenizer for real-engine checks, without a model hub.

The weights are random (``torch.manual_seed(0)``), so the model's output is gibberish; what the
engine does with it (prefill cost, prefix cache, logs) is real. The tokenizer is a byte-level BPE
(vocabulary 8192) trained on the CPython standard library sources of the running interpreter and
saved with a chat template, which vLLM needs to answer ``/v1/chat/completions``.

Run it with an interpreter that has ``torch``, ``transformers`` and ``tokenizers`` (the vLLM venv
has all three)::

    /work/vllm-venv/bin/python benchmarks/engines/build_model.py /work/engine-model

Same interpreter, same output: file order is sorted and the corpus is capped by size.

``--smoke`` builds a much smaller one (a 1,024-token vocabulary from 400 KB of sources, two
layers of width 64) in seconds, as the test suite does; its tokenizer files serve the pure parts
of the engine benchmarks (:mod:`benchmarks.engines.cache_model`).
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

DEFAULT_OUT = Path("/work/engine-model")
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]
# 12 MB of sources trains in a few seconds and already gives ~3.5 characters per token on prose.
CORPUS_BYTES = 12_000_000
# One role header per message; the generation prompt opens the assistant turn. A system message
# renders first, so requests sharing a system prompt share a token prefix.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MAX_POSITIONS = 4096


def corpus_files(limit_bytes: int = CORPUS_BYTES) -> list[Path]:
    """Standard-library ``.py`` files in sorted order, up to ``limit_bytes`` in all."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or total >= limit_bytes:
            continue
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def corpus_lines(files: list[Path]) -> Iterator[str]:
    """The text of ``files``, a chunk of lines at a time."""
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


#: what ``--smoke`` builds instead: corpus bytes, vocabulary, and the model's shape
SMOKE_CORPUS_BYTES, SMOKE_VOCAB = 400_000, 1024
SMOKE_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
FULL_SHAPE = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
              "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip


def train_tokenizer(files: list[Path], vocab_size: int = VOCAB_SIZE):  # -> PreTrainedTokenizerFast
    """A byte-level BPE tokenizer with a BOS post-processor and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    core.train_from_iterator(corpus_lines(files), trainer=trainer)
    bos = core.token_to_id("<s>")
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, shape: dict[str, int] | None = None):  # -> LlamaForCausalLM
    """A randomly initialised fp32 Llama with seed 0 (about 32M parameters with the full
    shape)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
        max_position_embeddings=MAX_POSITIONS,
        **(shape or FULL_SHAPE),
    )
    # torch's default dtype is float32, so the weights are created (and saved) in fp32.
    return LlamaForCausalLM(config)


def build(out: Path, smoke: bool = False) -> dict[str, object]:
    """Write model and tokenizer (the small ones with ``smoke``) into ``out``; return a short
    summary."""
    started = time.monotonic()
    files = corpus_files(SMOKE_CORPUS_BYTES if smoke else CORPUS_BYTES)
    tokenizer = train_tokenizer(files, SMOKE_VOCAB if smoke else VOCAB_SIZE)
    model = build_model(tokenizer, SMOKE_SHAPE if smoke else FULL_SHAPE)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "out": str(out),
        "corpus_files": len(files),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, in seconds")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out, smoke=args.smoke)))


if __name__ == "__main__":
    main()
