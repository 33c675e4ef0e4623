"""Regenerate docs/img/: the report's figure 1 and the exporter's landing page, from a real run.

Starts two simulated vLLM replicas, the exporter and Debian's Prometheus on loopback with the
generated rules compressed 20x in time, runs the simulated regression (a timestamp lands at
the top of the system prompt, then is rolled back), screenshots the landing page with headless
chromium while the page is firing (what on-call opens: the ratio, the cause and the culprit),
and calls the report after the rollback. Takes about two minutes.

Run: python docs/make_figures.py   (needs `apt-get install prometheus chromium`)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefixwatch.core.vocab import rulenames  # noqa: E402
from prefixwatch.report import Request, write_report  # noqa: E402
from prefixwatch.simulator.engine import EngineConfig  # noqa: E402
from tests.report.loopback import LoopbackStack  # noqa: E402

OUT = ROOT / "docs" / "img"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def need(name: str) -> str:
    path = shutil.which(name)
    if not path:
        sys.exit(f"make_figures: {name} is not installed (apt-get install {name})")
    return path


def screenshot(chromium: str, url: str, path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="pw-chromium-") as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                        f"--screenshot={path}", "--window-size=1280,900", url],
                       check=True, capture_output=True, timeout=120)


def main() -> int:
    prometheus, chromium = need("prometheus"), need("chromium")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pw-figures-") as tmp:
        # Prefill slow enough that the regression's recomputed prompts queue up (TTFT rises).
        engine = EngineConfig(prefill_tokens_per_s=30_000, time_per_output_token=0.002)
        stack = LoopbackStack(Path(tmp), prometheus, rate=20, engine=engine, kv_events=True)
        started = time.time()
        stack.start()
        try:
            time.sleep(40)
            stack.switch("timestamp-at-top")
            stack.wait_for(lambda: rulenames.ALERT_LOW in stack.firing_seen, 90, "the page")
            time.sleep(6)
            screenshot(chromium, stack.exporter_url, OUT / "landing-page.png")
            time.sleep(6)
            stack.switch("static-system-prompt")
            stack.wait_for(lambda: (stack.fleet_ratio_now() or 0) > 0.8, 60, "the recovery")
            time.sleep(20)
            written = write_report(stack.prom_url, Path(tmp) / "report",
                                   Request(started, time.time(), 0.7,
                                           time_scale=stack.time_scale))
            shutil.copy(written.directory / "figure1-hit-ratio-ttft.png",
                        OUT / "report-figure1.png")
        finally:
            stack.stop()
    print(f"wrote {OUT / 'report-figure1.png'} and {OUT / 'landing-page.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
