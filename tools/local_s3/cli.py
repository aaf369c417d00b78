"""tools/local-s3 up|down|env|status|throttle: a local SeaweedFS S3 store on loopback.

Environment: SLURM_TITAN_S3_PORT (8333), SLURM_TITAN_S3_DIR (/var/tmp/slurm-titan-s3),
SLURM_TITAN_S3_BUCKET (slurm-titan), SLURM_TITAN_S3_ACCESS_KEY / SLURM_TITAN_S3_SECRET_KEY
(a test key pair), SLURM_TITAN_WEED (the weed binary), SLURM_TITAN_S3_PROXY_PORT (8340).

    eval "$(tools/local-s3 up)"      # start (if needed), wait until ready, print export lines
    tools/local-s3 env               # print the export lines only
    tools/local-s3 down              # stop it; nothing keeps running
    tools/local-s3 throttle --share 0.5 [--rate N --latency S ...]
                                     # in the foreground: a proxy in front of the store that answers
                                     # requests 503 SlowDown (tools/local_s3/throttle_proxy.py; --help)
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from tools.local_s3 import throttle_proxy
from tools.local_s3.seaweed import DEFAULT_ACCESS_KEY, DEFAULT_SECRET_KEY, Server, ports_free


def server() -> Server:
    return Server(
        port=int(os.environ.get("SLURM_TITAN_S3_PORT", "8333")),
        data_dir=os.environ.get("SLURM_TITAN_S3_DIR", "/var/tmp/slurm-titan-s3"),
        bucket=os.environ.get("SLURM_TITAN_S3_BUCKET", "slurm-titan"),
        access_key=os.environ.get("SLURM_TITAN_S3_ACCESS_KEY", DEFAULT_ACCESS_KEY),
        secret_key=os.environ.get("SLURM_TITAN_S3_SECRET_KEY", DEFAULT_SECRET_KEY),
    )


def print_env(s: Server) -> None:
    for k, v in s.env().items():
        print(f"export {k}={shlex.quote(v)}")
    print(f"# bucket: s3://{s.bucket}/   data: {s.data_dir}")


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "help"
    s = server()
    if cmd == "up":
        Path(s.data_dir).mkdir(parents=True, exist_ok=True)
        pid = s.running_pid()
        if pid is None:
            if not ports_free(s.port):
                print(f"local-s3: ports {s.port}..{s.port + 4} (and +10000) are in use; set SLURM_TITAN_S3_PORT",
                      file=sys.stderr)
                return 1
            s.start()
            print(f"local-s3: SeaweedFS started on {s.endpoint} (log {s.log_file})", file=sys.stderr)
        else:
            s.wait_ready(30)
            print(f"local-s3: already running on {s.endpoint} (pid {pid})", file=sys.stderr)
        print_env(s)
        return 0
    if cmd == "down":
        if s.running_pid() is None:
            print("local-s3: not running", file=sys.stderr)
        s.stop()
        return 0
    if cmd == "env":
        print_env(s)
        return 0
    if cmd == "throttle":
        if s.running_pid() is None and not {"-h", "--help"} & set(argv):
            print("local-s3: not running (tools/local-s3 up first)", file=sys.stderr)
            return 1
        port = os.environ.get("SLURM_TITAN_S3_PROXY_PORT", "8340")
        print(f"local-s3: export AWS_ENDPOINT_URL=http://127.0.0.1:{port}  # through the throttling proxy",
              file=sys.stderr)
        return throttle_proxy.main(["--upstream", s.endpoint, "--port", port, *argv[1:]])
    if cmd == "status":
        pid = s.running_pid()
        print(f"running (pid {pid}) on {s.endpoint}" if pid else "not running")
        return 0 if pid else 3
    print(__doc__.strip())
    return 0 if cmd in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
