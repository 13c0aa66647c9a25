"""The job-side waiter: standard library only, run per job by the slurmds as one installed file, a
zipapp of this package (build.py), by absolute path in isolated mode. main.py is its entry point.
Imports nothing of the bridge but itself and the pure core modules it shares with the daemon."""
