package waiter

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// The waiter's entry point: `waiter [--api URL] [--ca CA_FILE]
// BATCH_SCRIPT [ARG...] | task KEY | step -- ARGV...`, as the slurmds run it.

// Usage is what a bad invocation prints.
const Usage = "usage: waiter [--api URL] [--ca CA_FILE] BATCH_SCRIPT [ARG...] | task KEY | step -- ARGV..."

// crash ends the waiter where the Python one dies of an uncaught exception: its exit code 1 and
// its traceback's last line, the exception.
func crash(line string) int {
	_ = WriteAll(2, []byte(line+"\n"))
	return 1
}

// Main runs the waiter or a proxy as args (the command line less the program) says; the exit
// code. pendingAtStart are the signals that were pending when the process started, environ the
// environment it started with (the job's, whole).
func Main(args []string, pendingAtStart []syscall.Signal, environ, limits []string) int {
	startEnviron, startLimits = environ, limits
	early := HoldEarlySignals(pendingAtStart)
	// What the job runs with is taken first; then the waiter leaves the user's directory.
	environment := WithLimits(JobEnvironment(Environ()))
	workDir, err := syscall.Getwd()
	if err != nil {
		return crash("FileNotFoundError: " + pyError(err))
	}
	apiURL, caFile := DefaultAPIURL, ""
	for len(args) >= 2 && (args[0] == "--api" || args[0] == "--ca") {
		if args[0] == "--api" {
			apiURL = args[1]
		} else {
			caFile = args[1]
		}
		args = args[2:]
	}
	if len(args) == 2 && args[0] == "task" {
		return RunTask(apiURL, caFile, args[1], early)
	}
	if len(args) >= 3 && args[0] == "step" && args[1] == "--" {
		return RunUserStep(apiURL, caFile, args[2:], environment, workDir, early)
	}
	if len(args) == 0 {
		Say(Usage)
		return 2
	}
	// The batch script (slurmd's copy), then the arguments sbatch gave it.
	arguments := args[1:]
	jobID, problem := jobIDOf(environment)
	if problem != "" {
		return crash(problem)
	}
	content, err := os.ReadFile(args[0])
	if err != nil {
		return crash(fileErrorLine(err, args[0]))
	}
	script := UserScript(UniversalNewlines(content))
	if err := os.Chdir("/"); err != nil {
		return crash(fileErrorLine(err, "/"))
	}
	url, err := SplitURL(apiURL)
	if err != nil {
		return crash("ValueError: " + err.Error())
	}
	client := &Client{URL: url, CAFile: caFile, JobID: jobID}
	ownCommand := append([]string{}, os.Args[:len(os.Args)-1-len(arguments)]...)
	waiter := NewWaiter(client, script, WithBatchStdin(environment), workDir, arguments, ownCommand)
	handle := func(sig os.Signal) {
		number := sig.(syscall.Signal)
		if number == syscall.SIGTERM {
			// The daemon decides whether it stops the run (Slurm shows the job over: a cancel, the
			// time limit, a requeue) or is the script's signal (`scancel -b -s TERM`). Silent, as
			// a native batch script is: slurmstepd reports a cancel or a time limit. Each one: a
			// script that traps TERM gets every `scancel -s TERM -b`.
			waiter.RequestCancel()
			return
		}
		waiter.ForwardSignal(number)
	}
	// Those that came while the waiter started are acted on first, in order.
	for pending := true; pending; {
		select {
		case sig := <-early:
			handle(sig)
		default:
			pending = false
		}
	}
	go func() {
		for sig := range early {
			handle(sig)
		}
	}()
	return waiter.Run()
}

// jobIDOf is int(environment["SLURM_JOB_ID"]), or the exception line Python would end with.
func jobIDOf(environment Object) (int64, string) {
	value, ok := environment.Get("SLURM_JOB_ID")
	if !ok {
		return 0, "KeyError: 'SLURM_JOB_ID'"
	}
	text := value.(string)
	id, ok := pyInt(text)
	if !ok {
		return 0, "ValueError: invalid literal for int() with base 10: " + pyRepr(text)
	}
	return id, ""
}

// fileErrorLine is the exception line of a failed open() of path.
func fileErrorLine(err error, path string) string {
	var errno syscall.Errno
	name := "OSError"
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT:
			name = "FileNotFoundError"
		case syscall.EACCES, syscall.EPERM:
			name = "PermissionError"
		case syscall.EISDIR:
			name = "IsADirectoryError"
		case syscall.ENOTDIR:
			name = "NotADirectoryError"
		}
		text, known := strerror[errno]
		if !known {
			text = errno.Error()
			text = strings.ToUpper(text[:1]) + text[1:]
		}
		return name + ": [Errno " + strconv.Itoa(int(errno)) + "] " + text + ": " + pyRepr(path)
	}
	return name + ": " + err.Error()
}
