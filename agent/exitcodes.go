package main

// The agent's exit codes for the daemon, which tells outcomes apart by them (never by the
// message text). Named once here and once in bridge/core/agent_protocol.py; the two must agree.
// `run` and `task` exit as the script or task did, and are not covered by these.
const (
	// exitFailed: anything else went wrong (bad arguments, an I/O error): the message says what.
	exitFailed = 2
	// exitSrunGone: `step-output` found the script's srun gone (its connection closed).
	exitSrunGone = 3
	// exitNotStarted: `signal` found no pid file, or the script has run less than a second: the
	// script (or task) has not started yet, or not long enough to have set its traps.
	exitNotStarted = 4
	// exitNoSuchProcess: `signal` found the process gone: the script (or task) has ended.
	exitNoSuchProcess = 5
)
