"""Many runs: the battery, crash points and crash states, campaigns, search, suites."""
