"""`python -m torchchaos.cli`: the same as the `torchchaos` command."""

import sys

from torchchaos.cli.main import main

sys.exit(main())
