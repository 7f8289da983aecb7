"""``python -m rsp_bench.speed project|bench ...``: the standalone entry of the speed commands."""

from rsp_bench.speed.commands import _main

raise SystemExit(_main())
