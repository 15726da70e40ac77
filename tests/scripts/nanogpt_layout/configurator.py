# Read by train.py as `exec(open('configurator.py').read())`, by that fixed relative name,
# the way nanoGPT reads its configurator: `--key=value` arguments override its globals.
import sys
from ast import literal_eval

for _arg in sys.argv[1:]:
    _key, _, _value = _arg.removeprefix("--").partition("=")
    if _key not in globals():
        raise ValueError(f"unknown config key: {_key}")
    try:
        globals()[_key] = literal_eval(_value)
    except (SyntaxError, ValueError):
        globals()[_key] = _value
