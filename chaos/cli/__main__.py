"""`python -m chaos.cli`: the same as the `torchchaos` command."""

import sys

from chaos.cli.main import main

sys.exit(main())
