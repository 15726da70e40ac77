"""Pure functions over histories: evidence, the checks and their diagnoses. No torch."""
