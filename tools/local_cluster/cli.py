"""tools/local-cluster: a real multi-node Slurm cluster on this one machine.

  tools/local-cluster install-deps  apt-get the Slurm/munge packages (skips if present)
  tools/local-cluster up            start munged, slurmctld and 5 slurmd (n1..n5); prints
                                    the export line, so `eval "$(tools/local-cluster up)"` works
  tools/local-cluster env           print only the export line(s)
  tools/local-cluster status        daemons + sinfo; exit 0 healthy, 1 degraded, 3 not up
  tools/local-cluster down          stop everything it started; keeps STATE/log

Environment:
  SLURM_TITAN_CLUSTER_DIR      state dir            [/var/tmp/slurm-titan-cluster]
  SLURM_TITAN_CLUSTER_PORT     slurmctld port; nodes use the next 4 ports   [17000]
  SLURM_TITAN_CLUSTER_TIMEOUT  seconds `up` waits for 4 idle nodes          [60]
  SLURM_TITAN_CLUSTER_SLOT     0-3: clusters side by side take one each, so that
                               their job ids (and master ports) never meet   [0]
"""

from __future__ import annotations

import sys

from tools.local_cluster.cluster import ClusterError, LocalCluster, say

COMMANDS = ("install-deps", "up", "env", "status", "down")
HELP = ("-h", "--help", "help")


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0] in HELP:
        print(__doc__.strip())
        return 0
    if len(argv) != 1 or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command = argv[0]
    try:
        cluster = LocalCluster.from_env()
        if command == "install-deps":
            return cluster.install_deps()
        if command == "status":
            status = cluster.status()
            print(status.text)
            return status.code
        if command == "down":
            cluster.down()
            return 0
        if command == "up":
            cluster.up()
        elif not cluster.conf.is_file():
            say(f"warning: no cluster in {cluster.state} (run: tools/local-cluster up)")
        print(cluster.export_lines())
        return 0
    except ClusterError as error:
        say(str(error))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
