"""The simulator's listener sends small responses at once (no Nagle delay on keep-alive)."""

from __future__ import annotations

import socket

from jobs.simulator.runner import _bind


def test_listener_sets_tcp_nodelay_for_accepted_connections():
    listener = _bind("127.0.0.1", 0)
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for sock in (accepted, client, listener):
            sock.close()
