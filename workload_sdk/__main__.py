"""``python -m workload_sdk``: see :func:`workload_sdk.cli.main`."""

import sys

from workload_sdk.cli import main

sys.exit(main())
