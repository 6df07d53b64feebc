"""`python -m summrl.cluster status|down|logs [name]`: the SkyPilot clusters that backend=skypilot drives.

The same as `sky status`, `sky down <name>` and `sky logs <name>`; the name defaults to backend.cluster_name's
default (a multirun's jobs use <name>-<job number>).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from summrl.errors import exit_on

DEFAULT_CLUSTER = "summrl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m summrl.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["status", "down", "logs"])
    parser.add_argument("name", nargs="?", default=None, help=f"cluster name (default: all for status, "
                                                              f"{DEFAULT_CLUSTER} otherwise)")
    parser.add_argument("--job", type=int, default=None, help="logs: the job id (default: the latest)")
    args = parser.parse_args(argv)
    try:
        import sky
    except ImportError:
        print("summrl: skypilot is not installed: pip install -e '.[cloud]'", file=sys.stderr)
        return 2
    try:
        return _command(sky, args)
    except Exception as e:  # SkyPilot refusing (its API server, credentials): one line and its code, as summrl.sweep
        exit_on(e)


def _command(sky: Any, args: argparse.Namespace) -> int:
    if args.command == "status":
        records = sky.get(sky.status(cluster_names=[args.name] if args.name else None))
        if not records:
            print("summrl: no clusters" + (f" named {args.name}" if args.name else ""))
        for r in records:  # StatusResponse (dict-like)
            status = getattr(r["status"], "value", r["status"])
            resources = getattr(r.get("handle"), "launched_resources", "")
            down = " (down)" if r.get("to_down") else ""
            minutes = r.get("autostop")  # -1: none (a launch stopped before SkyPilot set it): it bills until down
            autostop = f"autostop {minutes} min{down}" if minutes is not None and minutes >= 0 else "no autostop"
            print(f"{r['name']}\t{status}\t{resources}\t{autostop}")
        return 0
    name = args.name or DEFAULT_CLUSTER
    try:
        if args.command == "down":
            sky.stream_and_get(sky.down(name))
            print(f"summrl: cluster {name} is down")
            return 0
        return int(sky.tail_logs(name, args.job, follow=True))
    except (sky.exceptions.ClusterDoesNotExist, sky.exceptions.ClusterNotUpError) as e:
        what = (f"there is no cluster {name}" if isinstance(e, sky.exceptions.ClusterDoesNotExist)
                else f"cluster {name} is not up, so it has no logs to show")
        print(f"summrl: {what} (python -m summrl.cluster status lists the clusters)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
