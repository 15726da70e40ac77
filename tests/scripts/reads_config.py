"""A script that reads its config file by the path it was given, nanoGPT style
(`exec(open(config_file).read())`), before it trains: a relative path is looked up in
its working directory."""

import sys

exec(open(sys.argv[1]).read())  # the pattern under test
