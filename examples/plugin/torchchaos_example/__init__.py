"""An example torchchaos plug-in, written the way a third party would write one.

- `torchchaos_example.pause.Pause`: the `pause` fault kind (a rank stops for a
  while, once), registered under the `torchchaos.faults` entry-point group;
- `torchchaos_example.checks.pause_absorbed`: a check that the job went on
  through every pause without a restart, under `torchchaos.checks`.

Nothing here is imported until torchchaos asks for the kind or the check by
name; the package's `pyproject.toml` is all the registration there is.
"""
