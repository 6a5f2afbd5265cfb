"""`python -m omnistream.cli`: the `omnistream` command without its console script."""

import sys

from omnistream.cli.main import main

sys.exit(main())
