"""``python -m vesper.party_a.workers``: one worker process of party A.

Party A starts its W-1 workers on its own host itself (``party_a.workers = W``). On other hosts,
start each by hand, once, with the rendezvous of party A's rank 0 (``party_a.workers_listen``):

    python -m vesper.party_a.workers --rank R --world W --init tcp://RANK0_HOST:PORT --forever

or with torch's environment variables (``--init env://``: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from vesper.party_a.workers.rendezvous import RendezvousError, store_address
from vesper.party_a.workers.worker import main


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m vesper.party_a.workers", description=__doc__.splitlines()[0])
    parser.add_argument("--init", default="env://", help="rank 0's rendezvous: tcp://HOST:PORT or env://")
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "-1")), help="this worker's rank, 1..W-1")
    parser.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "0")), help="W: rank 0 and the workers")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="how long a collective waits (party_a.step_timeout_s)")
    parser.add_argument("--forever", action="store_true", help="join one run after another (a worker on another host)")
    args = parser.parse_args(argv)
    if not 1 <= args.rank < args.world:
        parser.error(f"--rank must be in 1..{max(args.world - 1, 1)} and --world at least 2, got rank {args.rank} of {args.world}")
    try:
        store_address(args.init)
    except RendezvousError as exc:
        parser.error(str(exc))
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    options = parse(sys.argv[1:])
    sys.exit(main(options.init, options.rank, options.world, options.timeout_s, options.forever))
