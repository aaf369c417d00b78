"""A headless Chromium, for the report's PNG and the tests that check the page is drawn.

Flags from Chromium's headless mode (https://developer.chrome.com/docs/chromium/headless):
`--screenshot=FILE` / `--dump-dom` after `--virtual-time-budget=MS` of the page's timers, and
`--enable-logging=stderr` prints the page's console messages as `CONSOLE` lines. The page is a
local file the report wrote; `--no-sandbox` lets it run as root (containers, CI) and every host
name resolves to nothing, so the page cannot fetch anything.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from slurm_titan.errors import SlurmTitanError

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
RENDER_BUDGET_MS = 10_000
TIMEOUT_S = 120


def find() -> str | None:
    """The first Chromium on PATH."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def run(page: Path, *args: str, width: int = 1400, height: int = 1800) -> subprocess.CompletedProcess[str]:
    """Chromium headless on `page` with `args`; stdout and stderr captured."""
    binary = find()
    if binary is None:
        raise SlurmTitanError(f"a PNG needs Chromium, found none of {', '.join(BROWSERS)} on PATH "
                              "(Debian/Ubuntu: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="slurm-titan-chromium-") as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
                   "--no-first-run", f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
                   f"--window-size={width},{height}", f"--virtual-time-budget={RENDER_BUDGET_MS}", *args,
                   page.resolve().as_uri()]
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmTitanError(f"{binary} did not render {page} within {TIMEOUT_S} s") from None


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 1800) -> None:
    """A `width` x `height` PNG of the top of `page`."""
    try:
        png.unlink(missing_ok=True)
    except OSError as error:
        raise SlurmTitanError(f"cannot write {png}: {error.strerror}") from None
    result = run(page, f"--screenshot={png.resolve()}", width=width, height=height)
    if not png.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise SlurmTitanError(f"{find()} wrote no screenshot of {page} (exit {result.returncode}: {last})")
