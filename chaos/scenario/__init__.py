"""What to run: fault specs, scenarios, resolved schedules, scenario files and exports."""
