"""``prewarm simulator``: serve the engine simulator in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Opt = typer.Option


def simulator(
    host: Annotated[str, Opt(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, Opt(help="Port to listen on (0: any free port).")] = 8000,
    model: Annotated[str, Opt(help="Served model name.")] = "sim-llm",
    block_size: Annotated[int, Opt(min=1, help="Tokens per prefix-cache block.")] = 16,
    capacity_blocks: Annotated[int, Opt(min=1, help="Prefix-cache capacity in blocks.")] = 4096,
    prefill_ms_per_token: Annotated[
        float, Opt(min=0, help="Prefill cost per uncached token.")
    ] = 0.5,
    decode_ms_per_token: Annotated[float, Opt(min=0, help="Decode cost per output token.")] = 10.0,
    overhead_ms: Annotated[float, Opt(min=0, help="Fixed scheduling cost per request.")] = 5.0,
    max_num_seqs: Annotated[int, Opt(min=1, help="Requests running at once.")] = 64,
    max_model_len: Annotated[int, Opt(min=16, help="Context length in tokens.")] = 32_768,
    stats_interval_s: Annotated[float, Opt(min=0.1, help="Seconds between stats lines.")] = 10.0,
    log_file: Annotated[Path | None, Opt(help="Also append the vLLM-format log here.")] = None,
    stdout_log: Annotated[bool, Opt(help="Write the vLLM-format log to standard output.")] = True,
    kv_events_endpoint: Annotated[
        str | None, Opt(help="Publish KV-cache events here, as vLLM (e.g. tcp://*:5557).")
    ] = None,
    kv_replay_endpoint: Annotated[
        str | None, Opt(help="Replay missed KV-event batches here (e.g. tcp://*:5558).")
    ] = None,
    kv_events_form: Annotated[
        str, Opt(help="Wire form of the events: map (current vLLM) or array (older vLLM).")
    ] = "map",
) -> None:
    """Serve the engine SIMULATOR (OpenAI-compatible, vLLM-format logs; latencies simulated)."""
    from jobs.simulator import runner
    from jobs.simulator.engine import LatencyModel, SimulatorConfig
    from pipeline.errors import BadInputError

    if kv_events_form not in ("map", "array"):
        raise BadInputError("must be map or array", where="--kv-events-form")

    config = SimulatorConfig(
        model=model,
        block_size=block_size,
        capacity_blocks=capacity_blocks,
        latency=LatencyModel(prefill_ms_per_token, decode_ms_per_token, overhead_ms),
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        stats_interval_s=stats_interval_s,
        log_file=log_file,
        kv_events_endpoint=kv_events_endpoint,
        kv_replay_endpoint=kv_replay_endpoint,
        kv_events_form="array" if kv_events_form == "array" else "map",
        # (checked above: only "map" or "array" get here)
    )
    stream = runner.stdout_log() if stdout_log else None
    runner.SimulatorServer(config, host=host, port=port, log_stream=stream).serve_forever()


def register(app: typer.Typer) -> None:
    """Add ``prewarm simulator`` to the CLI."""
    app.command("simulator")(simulator)
