"""A real Docker engine on this machine: the daemon (`engine`), the images it runs
(`images`: a base made from Debian's packages, the project's image built without a
registry), the folders an owned engine lives in and what a dead one leaves (`folders`)."""
