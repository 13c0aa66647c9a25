"""The pure core: translation, outcome, directives, hostlist, config; data in, data out."""
