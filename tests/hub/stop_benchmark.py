"""How long `make hub`'s Ctrl-C takes with N learners' servers running (a benchmark, not a test).

    HUB_TEST_PORT=9000 .venv/bin/python tests/hub/stop_benchmark.py --learners 14

Starts the hub as the hub tests do (hubprocess.start_hub), signs N learners in, starts
their servers, waits until all are ready, then sends SIGINT and times the exit, the
processes and ports left; prints one JSON line. As root, the learners' system users are
removed afterwards (hub/end.py, in hubprocess's stop).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import hubprocess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=14)
    args = parser.parse_args()
    first = hubprocess.BASE_PORT + 4
    hubprocess.SERVER_PORTS = f"{first}-{first + args.learners + 4}"
    names = [f"stop{n:02d}" for n in range(args.learners)]
    hub = hubprocess.start_hub(Path(tempfile.mkdtemp()) / "hub", HUB_PROFILE="smoke")
    try:
        admin = hubprocess.login(hub, "instructor", hubprocess.ADMIN_PASSWORD)
        headers = {"X-XSRFToken": hubprocess.xsrf(admin)}
        started = time.monotonic()
        for name in names:
            hubprocess.login(hub, name)
            admin.post(f"{hub.url}/hub/api/users/{name}/server", headers=headers, timeout=120)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            users = hubprocess.hub_api(admin, hub, "/users").json()
            ready = sum(1 for u in users if (u.get("servers") or {}).get("", {}).get("ready"))
            if ready == len(names):
                break
            time.sleep(2)
        ready_s = time.monotonic() - started
    finally:
        took, left, ports = hub.stop()
    print(
        json.dumps(
            {
                "learners": len(names),
                "ready": ready,
                "all_ready_after_s": round(ready_s, 1),
                "stop_s": round(took, 1),
                "processes_left": len(left),
                "ports_left": ports,
                "load_average": os.getloadavg(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
