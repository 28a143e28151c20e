"""``python -m tools.gpu_check``: the full check, one lease call (``--lease``), the rehearsal
(``--rehearse``) or the environment probe, as the command line (:mod:`.settings`) asks."""
from __future__ import annotations

import json
import os
import sys

from .settings import InputError, get_args_parser, settings


def main_cli(argv=None) -> int:
    """Console entry. The full check: 0 when every check ran and passed, 1 when one failed, 3
    when none failed but some are not proven on a GPU (never in a dry run), 2 for bad input,
    130 when interrupted. ``--lease`` and ``--rehearse``: see their modules."""
    args = get_args_parser().parse_args(argv)
    if args.probe:
        from .machine.environment import probe

        print(json.dumps(probe()))
        return 0
    if args.lease:
        from .lease.run import lease_main
        return lease_main(args)
    try:
        if args.rehearse:
            from .lease.rehearse import rehearse_main
            return rehearse_main(args)
        s = settings(args)
        os.makedirs(s.out, exist_ok=True)
    except (InputError, OSError) as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    from .full import full_main

    return full_main(s)
