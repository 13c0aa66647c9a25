"""The job-side waiter: standard library only, installed as one file (attach.py) on the
slurmd hosts and started there by absolute path. Imports nothing from the bridge."""
