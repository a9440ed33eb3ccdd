"""``python -m hyper_parallel.perf``: the same as the ``hp-shmem-perf`` console script."""

import sys

from hyper_parallel.perf.cli import main

sys.exit(main())
