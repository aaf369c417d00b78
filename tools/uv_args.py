"""Print, one per line, the `uv pip install` arguments that make uv install from where pip is configured to
(uv does not read pip's configuration): tools/setup installs the environment with uv, which unpacks and
byte-compiles in parallel, and with pip when uv cannot.

pip's settings come from `pip config list` (its files and PIP_* variables, later ones winning):
index-url, extra-index-url, find-links and constraint map to uv's options of the same names, and a
configured certificate bundle to --native-tls (uv then trusts the system's certificates)."""

from __future__ import annotations

import subprocess
import sys

MULTI = ("extra-index-url", "find-links", "constraint")  # options that take several whitespace-separated values


def pip_settings(listing: str) -> dict[str, str]:
    """{option: value} from `pip config list` lines such as global.extra-index-url='a b', the last one winning."""
    settings = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    return settings


def uv_args(settings: dict[str, str]) -> list[str]:
    """uv's arguments for pip's `settings`; pip's way of choosing among indexes (the best version of all)."""
    args = ["--index-strategy", "unsafe-best-match"]
    if settings.get("index-url"):
        args += ["--index-url", settings["index-url"]]
    for option in MULTI:
        for value in settings.get(option, "").split():
            args += [f"--{option}", value]
    if settings.get("cert"):
        args.append("--native-tls")
    return args


def main() -> None:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    print("\n".join(uv_args(pip_settings(listing))))


if __name__ == "__main__":
    main()
