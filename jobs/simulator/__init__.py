"""An engine simulator: OpenAI-compatible, with a block prefix cache, a latency model and
vLLM-format logs. For tests, the demo and benchmarks; it always says it is a simulator."""

from jobs.simulator.cache import BlockPrefixCache
from jobs.simulator.chat import CHAT_TEMPLATE, render_chat
from jobs.simulator.engine import FaultInjection, LatencyModel, SimulatedEngine, SimulatorConfig
from jobs.simulator.runner import SimulatorServer

__all__ = [
    "CHAT_TEMPLATE",
    "BlockPrefixCache",
    "FaultInjection",
    "LatencyModel",
    "SimulatedEngine",
    "SimulatorConfig",
    "SimulatorServer",
    "render_chat",
]
