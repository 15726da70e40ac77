"""Running one job: torchrun launches, the nemesis, the reference run, hang watch."""
