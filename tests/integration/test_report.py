"""``prewarm report``: the page of a real demo run, opened in headless Chromium.

The demo (embedded Redis, a real Celery worker, the engine SIMULATOR) runs with ``--report``;
Chromium (Debian's package) renders the page twice with a fresh profile: once with a probe
script added to a copy (where each plot sits and whether its image decoded), once for a
screenshot of the page as shipped, whose plot areas must hold a drawing. The page must fetch
nothing: its resource-timing list is empty but for inline images, and Chromium's proxy (a local
socket that records each request line) sees only the browser's own service calls (component
updates, account checks: hosts no page of ours names), never a request of the page.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from jobs.report import CSP
from tests.integration.debian_tools import tool
from tests.integration.processes import prewarm_script

pytestmark = pytest.mark.integration

#: Hosts headless Chromium calls by itself, whatever it shows (seen here even on about:blank).
BROWSER_SERVICE_HOSTS = {
    "update.googleapis.com", "accounts.google.com", "clients2.google.com", "redirector.gvt1.com",
}  # fmt: skip

PROBE = """<script>
window.addEventListener("load", () => {
  const fetched = performance.getEntriesByType("resource").map(e => e.name)
    .filter(name => !name.startsWith("data:"));
  const plots = [...document.querySelectorAll("figure.plot img")].map(img => {
    const r = img.getBoundingClientRect();
    return {id: img.parentElement.id, x: r.left, y: r.top + scrollY, w: r.width, h: r.height,
            decoded: img.complete && img.naturalWidth > 0};
  });
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({plots, fetched, height: document.body.scrollHeight});
  document.body.appendChild(out);
});
</script>"""


class RecordingProxy:
    """A TCP listener on loopback that records each connection's request line, then drops it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                line = conn.recv(1024).split(b"\r\n")[0].decode(errors="replace")
            except OSError as exc:
                line = f"unreadable: {exc}"
            if line:  # a connection closed before it sent a byte asked for nothing
                self.requests.append(line)
            conn.close()

    def hosts(self) -> set[str]:
        """Host of every recorded request (``CONNECT host:443`` or ``GET http://host/...``)."""
        out = set()
        for line in self.requests:
            target = line.split(" ")[1] if " " in line else line
            out.add(urlsplit(target if "//" in target else f"//{target}").hostname or target)
        return out

    def close(self) -> None:
        self.sock.close()


def chromium(page: Path, profile: Path, proxy: int, *extra: str) -> subprocess.CompletedProcess:
    argv = [
        tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--no-first-run",
        f"--user-data-dir={profile}", "--hide-scrollbars", "--force-device-scale-factor=1",
        f"--proxy-server=http://127.0.0.1:{proxy}", "--proxy-bypass-list=<-loopback>",
        *extra, page.as_uri(),
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("demo")
    page = work / "report.html"
    done = subprocess.run(
        [prewarm_script(), "demo", "--workdir", str(work), "--report", str(page)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return page


def test_the_page_is_self_contained(demo_report):
    html = demo_report.read_text()
    assert CSP in html.replace("&#39;", "'")
    sources = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources), sources
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "demo: 1" in html  # the demo's plan, recorded with its reason
    numbers = re.search(r"requests in closed windows</th><td[^>]*>(\d+)<", html)
    assert numbers and int(numbers.group(1)) > 0


def test_chromium_renders_every_plot_without_a_network_request(demo_report, tmp_path):
    probed = tmp_path / "probed.html"
    html = demo_report.read_text()
    probed.write_text(
        html.replace("img-src data:;", "img-src data:; script-src 'unsafe-inline';").replace(
            "</body>", PROBE + "</body>"
        )
    )
    proxy = RecordingProxy()
    try:
        dom = chromium(probed, tmp_path / "p1", proxy.port, "--virtual-time-budget=5000",
                       "--dump-dom")  # fmt: skip
        match = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
        assert match, dom.stdout[-1000:] + dom.stderr[-2000:]
        probe = json.loads(match.group(1).replace("&quot;", '"'))
        shot = tmp_path / "shot.png"
        height = int(probe["height"]) + 20
        rendered = chromium(demo_report, tmp_path / "p2", proxy.port,
                            f"--window-size=1000,{height}", f"--screenshot={shot}")  # fmt: skip
        assert shot.exists(), rendered.stderr[-2000:]
    finally:
        proxy.close()
    assert probe["fetched"] == []
    assert proxy.hosts() <= BROWSER_SERVICE_HOSTS, proxy.requests

    plots = probe["plots"]
    ids = {p["id"] for p in plots}
    assert ids == {"plot-hit-rate", "plot-ttft", "plot-coverage", "plot-forecast",
                   "plot-misses", "plot-top"}  # fmt: skip
    from PIL import Image

    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    for plot in plots:
        assert plot["decoded"] and plot["w"] > 400 and plot["h"] > 150, plot
        x, y = int(plot["x"]), int(plot["y"])
        area = image[y : y + int(plot["h"]), x : x + int(plot["w"])]
        assert area.shape[0] > 150 and area.shape[1] > 400, (plot, image.shape)
        # Axes, ticks, labels and a "no data" note are black and grey; series, bars and markers
        # are coloured. An empty plot of this report has no coloured pixel at all.
        coloured = ((area.max(axis=2) - area.min(axis=2)) > 60).mean()
        assert coloured > 0.005, (plot["id"], coloured)
