package waiter

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// The task proxy (`waiter task KEY`): started by Slurm's srun as one task
// of a step of the script, it has the daemon run that task in the pod of this node, streams its
// output back for srun to gather, passes on the signals slurmstepd sends the task, and ends as
// the task ended.

const (
	taskSignalAttempts = 5
	// Longer than the daemon may take (4 execs of at most 30 s and their pauses), so a slow
	// delivery is never asked for a second time.
	taskSignalTimeout = 150 * time.Second
	maxTaskInput      = 4 * 1024 * 1024
	taskStartAttempts = 60
	// How long a proxy whose stream broke asks for the rest of its running task: a daemon's
	// restart, a failover, an upgrade's rollout.
	taskResumeFor = 3 * time.Minute
	// The usage figures the pod's agent gives for a task it never started (agent/task_follow.go).
	unknownTask = "unknown"
)

// endingSignals end a process by their default action: a task that exits 128+N with one of
// them was ended by it (the pod's exec reports a death by signal N as a shell does).
var endingSignals = setOf(syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP,
	syscall.SIGABRT, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGKILL, syscall.SIGUSR1, syscall.SIGSEGV,
	syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTERM, syscall.SIGXCPU, syscall.SIGXFSZ,
	syscall.SIGSYS)

// isatty tells whether fd is a terminal.
func isatty(fd int) bool {
	var termios syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TCGETS, uintptr(unsafe.Pointer(&termios)))
	return errno == 0
}

// taskInput is the task's stdin as slurmstepd gave it (srun --input), read to its end; nil when
// there is none; an error past maxTaskInput.
func taskInput() ([]byte, error) {
	if isatty(0) {
		return nil, nil
	}
	data, err := io.ReadAll(io.LimitReader(os.Stdin, maxTaskInput+1))
	if err != nil {
		return nil, nil
	}
	if len(data) > maxTaskInput {
		return nil, fmt.Errorf("the task's input is larger than the %d MiB a task of a job that runs in "+
			"Kubernetes can be given", maxTaskInput>>20)
	}
	if len(data) == 0 {
		return nil, nil
	}
	return data, nil
}

// endAsTheTask ends the proxy as its task ended: by signal N when that ended it, so that srun
// and sacct see what they see natively; the exit code otherwise.
func endAsTheTask(code int64) int {
	sig := syscall.Signal(code - 128)
	if code > 128 && code < 128+64 && endingSignals&setOf(sig) != 0 {
		// The user picks the code: a SEGV or ABRT must leave no core of this process on the host.
		dieWithoutCore(sig)
	}
	return int(code)
}

// slurmVariables are the SLURM* variables of environ but the bridge's own, and the SRUN_DEBUG
// srun sets for its tasks: what Slurm gave this task of its own.
func slurmVariables(environ Object) Object {
	var env Object
	for _, f := range environ {
		if (strings.HasPrefix(f.Key, "SLURM") && !strings.HasPrefix(f.Key, "SLURM_K8S_BRIDGE")) || f.Key == "SRUN_DEBUG" {
			env = append(env, f)
		}
	}
	return env
}

// taskVariables are Slurm's variables for this task: those slurmstepd set after the guard held the
// environment (SLURM_*, SLURMD_NODENAME), then those the guard held (SLURMD_DEBUG, srun's
// SRUN_DEBUG) under their own names again.
func taskVariables(environ Object) Object {
	env := slurmVariables(environ)
	for _, f := range slurmVariables(JobEnvironment(environ)) {
		if _, ok := env.Get(f.Key); !ok {
			env = append(env, f)
		}
	}
	return env
}

// RunTask runs task key of a step of the script in the pod of this node; the exit code.
func RunTask(apiURL, caFile, key string, early chan os.Signal) int {
	environ := Environ()
	jobID, problem := jobIDOf(environ)
	if problem != "" {
		return crash(problem)
	}
	node := lookup(environ, "SLURMD_NODENAME")
	body := Object{{"key", key}, {"node", node}, {"env", WithLimits(taskVariables(environ))}}
	stdin, err := taskInput()
	if err != nil {
		Say(err.Error())
		return 1
	}
	if stdin != nil {
		body = append(body, Field{"stdin", base64.StdEncoding.EncodeToString(stdin)})
	}
	procid := "0"
	if v, ok := environ.Get("SLURM_PROCID"); ok {
		procid = v.(string)
	}
	prefix := "/v1/jobs/" + strconv.FormatInt(jobID, 10)
	return proxyTask(apiURL, caFile, jobID, prefix+"/task", body,
		signalRoute{prefix + "/task-signal", Object{{"key", key}, {"procid", procid}, {"node", node}}}, early)
}

// signalRoute is where a proxy's signals go: the path and the fields that name its task.
type signalRoute struct {
	path   string
	fields Object
}

// signalPasser has the daemon pass a signal to the task in the pod.
func signalPasser(client *Client, route signalRoute) func(syscall.Signal) {
	return func(sig syscall.Signal) {
		body := Dumps(append(append(Object{}, route.fields...), Field{"signal", int(sig)}))
		for attempt := range taskSignalAttempts {
			err := client.PostClose(route.path, body, taskSignalTimeout)
			status := daemonStatus(err)
			if err == nil || status == 202 { // 202: kept by the daemon for the task's start
				return
			}
			if status >= 400 && status < 500 {
				Say(fmt.Sprintf("the bridge refused signal %d for this task: %s", int(sig), err.(*DaemonError).Text))
				return
			}
			time.Sleep(reconnectDelay(attempt))
		}
	}
}

// startSignalPassing leaves the user's directory and passes every signal slurmstepd sends the
// task on to the task in the pod, those that came while this started first.
func startSignalPassing(apiURL, caFile string, jobID int64, route signalRoute, early chan os.Signal) (*Client, func(syscall.Signal), error) {
	if err := os.Chdir("/"); err != nil {
		return nil, nil, err
	}
	url, err := SplitURL(apiURL)
	if err != nil {
		return nil, nil, err
	}
	client := &Client{URL: url, CAFile: caFile, JobID: jobID}
	passOn := signalPasser(client, route)
	for pending := true; pending; {
		select {
		case sig := <-early:
			passOn(sig.(syscall.Signal))
		default:
			pending = false
		}
	}
	go func() {
		for sig := range early {
			passOn(sig.(syscall.Signal))
		}
	}()
	return client, passOn, nil
}

// proxyTask has the daemon run one task in the pod of this node (POST body to path), writes its
// output to fds 1 and 2 as it comes, passes on this process's signals, and ends as the task did.
// Should the stream break before the task's end (the daemon died or restarted), the task runs on
// in its pod: the next daemon is asked for the rest, from the bytes already written.
func proxyTask(apiURL, caFile string, jobID int64, path string, body Object, route signalRoute, early chan os.Signal) int {
	client, _, err := startSignalPassing(apiURL, caFile, jobID, route, early)
	if err != nil {
		return crash("ValueError: " + err.Error())
	}
	usage := NewUsageFile() // what the task used, for Slurm's accounting of this step
	var progress taskProgress
	var lostAt time.Time // when the stream of a running task broke; zero: none broke
	var lost error
	startedAgain := false
	for attempt := 0; ; attempt++ {
		request := Dumps(body)
		if !lostAt.IsZero() {
			request = Dumps(append(append(Object{}, body...), Field{"resume", []any{progress.written[0], progress.written[1]}}))
		}
		stream, err := client.Post(path, request, 0)
		if err != nil {
			if status := daemonStatus(err); status >= 400 && status < 500 {
				Say(err.(*DaemonError).Text)
				return 1
			}
			if lostAt.IsZero() && attempt >= taskStartAttempts {
				Say("could not reach the bridge to run this task")
				return 1
			}
			if !lostAt.IsZero() && time.Since(lostAt) > taskResumeFor {
				Say("lost the bridge while the task ran: " + describe(lost))
				return 1
			}
			time.Sleep(reconnectDelay(attempt))
			continue
		}
		// From here the task runs (or ran) in the pod: asking again would run it twice.
		before := progress.written
		opened := time.Now()
		code, err := relayTask(stream, usage, &progress)
		stream.Close()
		switch {
		case progress.unknown && progress.written == [2]int64{} && !startedAgain:
			// The daemon that was to run it died before the pod started it: run it now.
			lostAt, progress.unknown, startedAgain, attempt = time.Time{}, false, true, -1
			continue
		case progress.unknown:
			Say("the bridge lost this task: its pod does not know it any more")
			return 1
		case err == nil && code != nil:
			return endAsTheTask(*code)
		case errors.As(err, new(outputGone)):
			return 1 // slurmstepd no longer takes the task's output: the step is over
		}
		// Asked again for a while after each break that followed some progress: a long step may
		// see several restarts (a rolling upgrade, a failover).
		if lostAt.IsZero() || progress.written != before || time.Since(opened) > taskResumeFor {
			lostAt, attempt = time.Now(), -1
		}
		if lost = err; lost == nil {
			lost = errors.New("the bridge stopped streaming this task before it ended")
		}
		if time.Since(lostAt) > taskResumeFor {
			Say("lost the bridge while the task ran: " + describe(lost))
			return 1
		}
		time.Sleep(reconnectDelay(max(attempt, 0)))
	}
}

// outputGone: the task's output could not be written here (not the stream's fault).
type outputGone struct{ error }

// taskProgress is what a task's streams gave so far: the bytes written of its stdout and stderr
// (a stream that breaks is asked for again from there), and whether the pod said it never ran it.
type taskProgress struct {
	written [2]int64
	unknown bool
}

// relayTask writes a task stream's output where it belongs, counting it in progress; the task's
// exit code, or nil when the stream ended without one.
func relayTask(stream *Stream, usage *UsageFile, progress *taskProgress) (*int64, error) {
	for {
		raw, err := stream.Reader.ReadBytes('\n')
		if len(raw) == 0 && err == io.EOF {
			return nil, nil
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		value, err := Loads(raw)
		if err != nil {
			return nil, err
		}
		event, ok := value.(Object)
		if !ok {
			return nil, errGarbled
		}
		fd, hasFD := event.Get("fd")
		data, _ := event.Get("data")
		if number, ok := fd.(int64); ok && number == UsageFD {
			if data == nil {
				data = ""
			}
			if figures, err := pyA2bBase64(pyStr(data)); err == nil && strings.TrimSpace(string(figures)) == unknownTask {
				progress.unknown = true
				continue
			}
			usage.RecordFrame(pyStr(data))
		} else if hasFD {
			number, ok := pyInt(fd)
			text, isText := data.(string)
			if !ok || !isText {
				return nil, errGarbled
			}
			decoded, err := pyA2bBase64(text)
			if err != nil {
				return nil, err
			}
			if err := WriteAll(int(number), decoded); err != nil {
				return nil, outputGone{err}
			}
			if number == 1 || number == 2 {
				progress.written[number-1] += int64(len(decoded))
			}
		} else if exit, ok := event.Get("exit"); ok {
			code, ok := pyInt(exit)
			if !ok {
				return nil, errGarbled
			}
			return &code, nil
		}
	}
}
