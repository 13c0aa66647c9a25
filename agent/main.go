// Command slurm-k8s-bridge-agent runs a bridged job's batch script inside its pod.
//
// Kubernetes keeps a container's stdout and stderr in one line-based log, so the script's two
// streams would arrive merged, re-ordered, with invalid UTF-8 replaced and a newline added to a
// last line without one. The agent keeps them apart and byte-exact: it runs the script with its
// own pipes and writes every chunk it reads as one log line, "o <base64>" for stdout and
// "e <base64>" for stderr. The daemon relays those lines to the job's waiter, which writes the
// bytes to its own stdout and stderr: the files Slurm opened for the job (-o, -e). Its last line
// says how the script ended, "x <base64>" (ending.go), so that the daemon need not wait for the
// kubelet to notice.
//
// It is static and needs nothing in the image. It reaches the pod in one of two ways: an init
// container copies it into an emptyDir, or the node has it in a directory mounted read-only into
// the pod ([pods] agent_host_dir), and the container's command copies it into the emptyDir and
// goes on from the copy (install DEST -- VERB ...): its state (pid files, step sockets, the
// script) lives beside the running binary, which must be in the pod's own writable volume.
//
//	slurm-k8s-bridge-agent install DEST [-- VERB ARGS...]
//	    copy this binary to DEST (mode 0755), with the srun and Slurm command links beside it in
//	    bin/; with a VERB, then become the copy running it
//	slurm-k8s-bridge-agent install-on-node ROOT [hold]
//	    put this binary in ROOT/VERSION/ and point ROOT/current at it (node_install.go)
//	slurm-k8s-bridge-agent run PIDFILE MODE -- ARGV
//	    run ARGV, framing its output, and exit as it does. MODE "split": stdout and stderr on
//	    their own pipes (the job has -e elsewhere than -o); "merged": one pipe for both, so the
//	    order between them stays the order of the writes, as in one Slurm output file
//	slurm-k8s-bridge-agent signal PIDFILE SIG [group]
//	    send SIG (a number) to the script run wrote to PIDFILE ("group": to the process group of
//	    a step's task, waiting a little for its pid file)
//	slurm-k8s-bridge-agent signal-all SIG
//	    send SIGSTOP or SIGCONT to every process of the job in the pod (suspend, resume)
//	slurm-k8s-bridge-agent wait                  hold a node of the job until stopped (exit 0)
//	slurm-k8s-bridge-agent receive-script DEST SIZE
//	    write SIZE bytes of stdin to DEST: a script too big for the payload Secret
//	slurm-k8s-bridge-agent step-output KEY       relay Slurm's srun output (frames on stdin) to the
//	                                             script's srun of step KEY
//	slurm-k8s-bridge-agent step-done KEY CODE    tell the script's srun of step KEY it ended with CODE
//	slurm-k8s-bridge-agent task PIDFILE ENV -- ARGV
//	    run one task of a step (ENV: its environment, base64 JSON) as its process group's leader,
//	    writing its pid to PIDFILE; end as it ended, after a line of what it used on stderr
//	slurm-k8s-bridge-agent task-follow PIDFILE FROM1 FROM2
//	    forward the rest of a running or ended task's output from those offsets (a daemon that
//	    streamed it went away), then end as task does
//	srun ARGS                                    (as argv[0] "srun") ask the daemon for a step
//	scontrol|squeue|sbatch|scancel|sacct|sinfo|sstat ARGS
//	    (as argv[0]) have the job's waiter run Slurm's own command (commands.go)
//
// Exit codes of the agent's own failures are named in exitcodes.go.
//
// A batch script runs once, on the job's first node, as Slurm runs it on the batch host; the pods
// of the other nodes run `wait`.
//
// Signals: SIGTERM, SIGINT, SIGHUP and SIGQUIT that reach the agent (the kubelet stopping the pod)
// go to the script's whole process group, as slurmstepd signals every process of a step on
// cancel. `signal` reaches the script alone, as `scancel --batch` does.
package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// chunk bytes become 16,000 characters of base64: below the 16 KiB at which container runtimes
// split a log line into partial lines.
const chunk = 12000

// drainAfterExit bounds how long output is still read once the script has exited: a process that
// left the script's process group (setsid) may hold the pipes open for ever.
const drainAfterExit = 2 * time.Second

// scriptDeliveryTimeout bounds the wait for a script the daemon copies in.
const scriptDeliveryTimeout = 10 * time.Minute

func waitForFile(path string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// receiveScript is `agent receive-script DEST SIZE`: exactly SIZE bytes from stdin become DEST.
func receiveScript(dest, size string) {
	n, err := strconv.Atoi(size)
	if err != nil || n < 0 {
		fail("not a size: " + strconv.Quote(size))
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(os.Stdin, data); err != nil {
		fail("short script: " + err.Error())
	}
	if err := os.WriteFile(dest+".tmp", data, 0o644); err != nil {
		fail(err.Error())
	}
	if err := os.Rename(dest+".tmp", dest); err != nil {
		fail(err.Error())
	}
}

func main() {
	if filepath.Base(os.Args[0]) == "srun" {
		srunClient(os.Args[1:])
		return
	}
	if name := filepath.Base(os.Args[0]); slurmCommands[name] {
		commandClient(name, os.Args[1:])
		return
	}
	if len(os.Args) < 2 {
		fail("usage: slurm-k8s-bridge-agent install DEST [-- VERB ARGS...] | install-on-node ROOT [hold] | " +
			"run PIDFILE MODE -- ARGV... | " +
			"signal PIDFILE SIG [group] | signal-all SIG | wait | receive-script DEST SIZE | step-output KEY | " +
			"step-done KEY CODE | task PIDFILE ENV -- ARGV...")
	}
	switch os.Args[1] {
	case "install":
		if len(os.Args) == 3 {
			install(os.Args[2])
			return
		}
		if len(os.Args) < 5 || os.Args[3] != "--" {
			fail("usage: slurm-k8s-bridge-agent install DEST [-- VERB ARGS...]")
		}
		install(os.Args[2])
		// The copy's directory is the agent's state directory from here on (see mustExecutable).
		argv := append([]string{os.Args[2]}, os.Args[4:]...)
		if err := syscall.Exec(os.Args[2], argv, os.Environ()); err != nil {
			fail("cannot run the installed agent: " + err.Error())
		}
	case "with-limits":
		withLimitsMain(os.Args[2:])
	case "run":
		if len(os.Args) < 6 || os.Args[4] != "--" || (os.Args[3] != "split" && os.Args[3] != "merged") {
			fail("usage: slurm-k8s-bridge-agent run PIDFILE split|merged -- ARGV...")
		}
		code, told := run(os.Args[2], os.Args[3] == "merged", os.Args[5:])
		if told {
			// The daemon knows the script's end from its frame: the job's steps end as their
			// slurmstepd ends them (tasks_left.go), not with this process.
			waitForTasksLeft()
		}
		os.Exit(code)
	case "wait":
		hold()
	case "install-on-node":
		if len(os.Args) != 3 && !(len(os.Args) == 4 && os.Args[3] == "hold") {
			fail("usage: slurm-k8s-bridge-agent install-on-node ROOT [hold]")
		}
		installOnNode(os.Args[2], len(os.Args) == 4)
	case "receive-script":
		if len(os.Args) != 4 {
			fail("usage: slurm-k8s-bridge-agent receive-script DEST SIZE")
		}
		receiveScript(os.Args[2], os.Args[3])
	case "step-output":
		if len(os.Args) != 3 {
			fail("usage: slurm-k8s-bridge-agent step-output KEY")
		}
		stepOutput(os.Args[2])
	case "step-done":
		if len(os.Args) != 4 {
			fail("usage: slurm-k8s-bridge-agent step-done KEY CODE")
		}
		stepDone(os.Args[2], os.Args[3])
	case "task":
		if len(os.Args) < 6 || os.Args[4] != "--" {
			fail("usage: slurm-k8s-bridge-agent task PIDFILE ENV -- ARGV...")
		}
		task(os.Args[2], os.Args[3], os.Args[5:])
	case "task-follow":
		if len(os.Args) != 5 {
			fail("usage: slurm-k8s-bridge-agent task-follow PIDFILE FROM1 FROM2")
		}
		taskFollow(os.Args[2], os.Args[3], os.Args[4])
	case "signal-all":
		if len(os.Args) != 3 {
			fail("usage: slurm-k8s-bridge-agent signal-all SIG")
		}
		signalAll(os.Args[2])
	case "signal":
		if len(os.Args) != 4 && !(len(os.Args) == 5 && os.Args[4] == "group") {
			fail("usage: slurm-k8s-bridge-agent signal PIDFILE SIG [group]")
		}
		sendSignal(os.Args[2], os.Args[3], len(os.Args) == 5)
	default:
		fail("unknown command " + strconv.Quote(os.Args[1]))
	}
}

func fail(message string) { failWith(exitFailed, message) }

// secretKeys are the payload Secret's keys that are files, not variables: the script and the job
// user's /etc/passwd and /etc/group. The Secret is the container's envFrom too, so the pod's own
// env sets each to its file's path; the job's own environment never had them.
var secretKeys = []string{"SLURM_K8S_BRIDGE_SCRIPT", "SLURM_K8S_BRIDGE_PASSWD", "SLURM_K8S_BRIDGE_GROUP"}

func unsetSecretKeys() {
	for _, key := range secretKeys {
		_ = os.Unsetenv(key)
	}
}

// failWith ends the agent with `code`, one the daemon tells apart (exitcodes.go).
func failWith(code int, message string) {
	fmt.Fprintln(os.Stderr, "slurm-k8s-bridge-agent: "+message)
	if atFailure != nil {
		atFailure(code)
	}
	os.Exit(code)
}

// atFailure, when set, ends what must end before the agent exits on a failure of its own.
var atFailure func(code int)

func install(dest string) {
	self, err := os.Executable()
	if err != nil {
		fail("cannot find own executable: " + err.Error())
	}
	in, err := os.Open(self)
	if err != nil {
		fail(err.Error())
	}
	defer in.Close()
	tmp := dest + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		fail(err.Error())
	}
	if _, err := io.Copy(out, in); err != nil {
		fail(err.Error())
	}
	if err := out.Close(); err != nil {
		fail(err.Error())
	}
	// `srun` in the job is this binary too (see steps.go), and so are Slurm's commands
	// (commands.go). The links come first: once DEST exists (what the daemon's execs and a step's
	// tasks run), they resolve.
	bin := filepath.Join(filepath.Dir(dest), "bin")
	_ = os.MkdirAll(bin, 0o755)
	for _, name := range []string{"srun", "scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo", "sstat"} {
		_ = os.Remove(filepath.Join(bin, name))
		if err := os.Symlink(dest, filepath.Join(bin, name)); err != nil {
			fail(err.Error())
		}
	}
	if err := os.Rename(tmp, dest); err != nil {
		fail(err.Error())
	}
}

// frames serialises the two streams' lines on the agent's stdout.
type frames struct {
	mu  sync.Mutex
	out io.Writer
}

func (f *frames) write(tag byte, data []byte) {
	line := make([]byte, 0, 3+base64.StdEncoding.EncodedLen(len(data)))
	line = append(line, tag, ' ')
	line = base64.StdEncoding.AppendEncode(line, data)
	line = append(line, '\n')
	f.mu.Lock()
	defer f.mu.Unlock()
	_, _ = f.out.Write(line)
}

// writeRaw frames data that is not the script's output (a step request).
func (f *frames) writeRaw(tag byte, data []byte) { f.write(tag, data) }

func (f *frames) relay(tag byte, from io.Reader, done chan<- struct{}) {
	buf := make([]byte, chunk)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			f.write(tag, buf[:n])
		}
		if err != nil {
			close(done)
			return
		}
	}
}

// run runs the batch script and returns the code to exit with, and whether the script's end was
// told in the ending frame.
func run(pidfile string, merged bool, argv []string) (int, bool) {
	unsetSecretKeys() // the payload Secret's file keys: never the script's variables
	jobSearchPaths()
	// Before any process of the job exists (ending.go).
	tellEnding := undumpable()
	interval := usageInterval() // the bridge's, not the job's: read, then gone from its environment
	_ = os.Unsetenv("SLURM_K8S_BRIDGE_USAGE_INTERVAL")
	grace := stopGrace()
	_ = os.Unsetenv("SLURM_K8S_BRIDGE_STOP_GRACE")
	if pending := os.Getenv("SLURM_K8S_BRIDGE_SCRIPT_PENDING"); pending != "" {
		// A script too big for an annotation: the daemon copies it in (receive-script).
		_ = os.Unsetenv("SLURM_K8S_BRIDGE_SCRIPT_PENDING")
		if !waitForFile(pending, scriptDeliveryTimeout) {
			fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: the job script never arrived in %s\n", pending)
			return 1, false
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = nil // /dev/null, as for a batch script
	// sbatch --input (SLURM_K8S_BRIDGE_SCRIPT_STDIN) is opened by `with-limits`, the script's
	// own process (limits.go), never here: a name the user controls, opened by this undumpable
	// agent, could be a link to /proc/self/fd/1, its own ending stream.
	stdout, stdoutW, err := os.Pipe()
	if err != nil {
		fail(err.Error())
	}
	stderr, stderrW := stdout, stdoutW
	if !merged {
		if stderr, stderrW, err = os.Pipe(); err != nil {
			fail(err.Error())
		}
	}
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Listening before the script starts: its first line may be srun.
	out := &frames{out: os.Stdout}
	serveSteps(filepath.Dir(pidfile), out)
	// Caught before the start, so none is lost in between; forwarded once the script runs.
	stops := make(chan os.Signal, 8)
	signal.Notify(stops, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	stopRequests(filepath.Dir(pidfile))
	throughWithLimits := false
	if cmd.Err == nil {
		program, args := throughLimits("script", cmd.Path, cmd.Args)
		throughWithLimits = program != cmd.Path
		cmd.Path, cmd.Args = program, args
	}
	makeTmpdir(true) // the batch script is its node's one task
	waitStarted := func() {}
	if throughWithLimits { // the pidfile waits for its signals (early_signals.go)
		var started *os.File
		if started, waitStarted, cmd.Env = startedPipe(os.Environ(), 3); started != nil {
			cmd.ExtraFiles = []*os.File{started}
		}
	}
	err = cmd.Start()
	waitStarted()
	if err != nil {
		// As a shell reports a missing interpreter: 127 not found, 126 not executable.
		fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: cannot run %s: %v\n", argv[0], err)
		if os.IsNotExist(err) || errors.Is(err, exec.ErrNotFound) {
			return 127, false
		}
		return 126, false
	}
	// The script holds the write ends now; ours would keep the pipes open after it exits.
	_ = stdoutW.Close()
	if !merged {
		_ = stderrW.Close()
	}
	pid := cmd.Process.Pid
	_ = os.WriteFile(pidfile, []byte(strconv.Itoa(pid)+"\n"), 0o644)
	var stopped, reaped atomic.Bool
	var stoppedAt atomic.Int64 // the first stop's time, Unix nanoseconds
	go func() {
		termed := false
		for sig := range stops {
			if stoppedAt.CompareAndSwap(0, time.Now().UnixNano()) {
				markJobStopping(filepath.Dir(pidfile)) // before the script's srun gets the signal
			}
			stopped.Store(true)
			if sig == syscall.SIGTERM {
				// The daemon's stop (stopRequests) and then the kubelet's are one stop: the
				// script gets one TERM, as slurmstepd sends one before KillWait's SIGKILL.
				if termed {
					continue
				}
				termed = true
			}
			if !reaped.Load() { // once reaped, its number may be another process's
				_ = syscall.Kill(-pid, sig.(syscall.Signal))
			}
		}
	}()
	outDone, errDone := make(chan struct{}), make(chan struct{})
	go out.relay('o', stdout, outDone)
	if merged {
		close(errDone)
	} else {
		go out.relay('e', stderr, errDone)
	}

	sampler := startUsageSampler(pid, out, interval)

	// Wait for the script itself, not for its pipes (cmd.Wait would wait for both).
	var status syscall.WaitStatus
	var rusage syscall.Rusage
	for {
		_, err := syscall.Wait4(pid, &status, 0, &rusage)
		if err != syscall.EINTR {
			break
		}
	}
	sampler.finish(&rusage)
	drain := drainAfterExit
	if stopped.Load() {
		// Stopped (scancel, a requeue, the time limit): slurmstepd gives every process of the
		// batch step its TERM, then KillWait. The script's srun, TERMed with it, goes on telling
		// how its step ends, through the script's pipes, which close once it is done. All of it
		// before the kubelet's SIGKILL, which would leave no ending frame: the job would end as
		// killed (0:9) where the script ended by its TERM.
		deadline := time.Unix(0, stoppedAt.Load()).Add(min(stoppedGroupLimit, grace-stopReserve))
		waitForStoppedGroup(pid, deadline, outDone, errDone)
		// At least a moment: the relays may still be reading what the pipes hold.
		drain = min(drain, max(minimumDrain, time.Until(deadline.Add(stopReserve/2))))
	}
	// What the script left running goes with it, as slurmstepd ends a batch step.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	reaped.Store(true)
	waitForPipes(drain, outDone, errDone)
	out.mu.Lock() // no frame may be cut by the exit, nor follow the ending
	if tellEnding {
		_, _ = out.out.Write(endingFrame(status, stopped.Load()))
	}
	if status.Signaled() {
		return 128 + int(status.Signal()), tellEnding
	}
	return status.ExitStatus(), tellEnding
}

// stoppedGroupLimit bounds how long a stopped script's process group may outlive its stop
// (Slurm's default KillWait).
const stoppedGroupLimit = tasksLeftLimit

// stopReserve is what a stop leaves of the pod's grace for the script's group to be killed, the
// pipes drained and the ending frame written.
const stopReserve = time.Second

// minimumDrain is the least a stop leaves the output relays once the script's group is killed.
const minimumDrain = 200 * time.Millisecond

// waitForStoppedGroup returns once the stopped script's pipes are closed (whatever held them has
// ended), once no process of its group is left (what holds them was never TERMed: a `setsid`
// child), or at deadline.
func waitForStoppedGroup(pgid int, deadline time.Time, done ...chan struct{}) {
	for time.Now().Before(deadline) {
		if allClosed(done) || syscall.Kill(-pgid, 0) == syscall.ESRCH {
			return
		}
		time.Sleep(tasksLeftPoll)
	}
}

func allClosed(done []chan struct{}) bool {
	for _, closed := range done {
		select {
		case <-closed:
		default:
			return false
		}
	}
	return true
}

// stopGrace is the pod's grace period ([pods] termination_grace_s, in SLURM_K8S_BRIDGE_STOP_GRACE
// when not the default): the kubelet SIGKILLs what is left that long after its SIGTERM.
func stopGrace() time.Duration {
	seconds, err := strconv.Atoi(os.Getenv("SLURM_K8S_BRIDGE_STOP_GRACE"))
	if err != nil || seconds < 0 {
		return defaultStopGrace
	}
	// Beyond stoppedGroupLimit it changes nothing; capped before it could overflow.
	return time.Duration(min(seconds, 3600)) * time.Second
}

const defaultStopGrace = 10 * time.Second // wellknown.DEFAULT_TERMINATION_GRACE_S

// waitForPipes returns once every one of done is closed, or after limit.
func waitForPipes(limit time.Duration, done ...chan struct{}) {
	deadline := time.After(limit)
	for _, closed := range done {
		select {
		case <-closed:
		case <-deadline:
			return
		}
	}
}

// hold waits for the kubelet's SIGTERM (or SIGINT) and exits 0 once no step task runs here: the
// node was only held for the job.
func hold() {
	stops := make(chan os.Signal, 1)
	signal.Notify(stops, syscall.SIGTERM, syscall.SIGINT)
	<-stops
	waitForTasksLeft()
	os.Exit(0)
}

const (
	taskStartPoll      = 20 * time.Millisecond
	taskStartWaitTries = 500 // 10 s
)

func sendSignal(pidfile, sig string, group bool) {
	number, err := strconv.Atoi(sig)
	if err != nil || number <= 0 || number > 64 {
		fail("not a signal number: " + strconv.Quote(sig))
	}
	raw, err := os.ReadFile(pidfile)
	// A step's task may be signalled while its exec is still being set up (the signal reached
	// its proxy first): wait a little for the task to write its pid.
	for tries := 0; err != nil && group && os.IsNotExist(err) && tries < taskStartWaitTries; tries++ {
		time.Sleep(taskStartPoll)
		raw, err = os.ReadFile(pidfile)
	}
	if err != nil {
		failWith(exitNotStarted, "the script has not started: "+err.Error())
	}
	pid, err := strconv.Atoi(string(trimSpace(raw)))
	if err != nil || pid <= 1 {
		fail("bad pid file " + pidfile)
	}
	if !group && filepath.Base(pidfile) != runAgentPidfile && !scriptSettled(pidfile) {
		// Not waited for here: the daemon tries again (a sleeping exec would hold its worker).
		failWith(exitNotStarted, "the script started less than a second ago")
	}
	target := pid
	if group {
		target = -pid // a step's task: every process of it
	}
	if err := syscall.Kill(target, syscall.Signal(number)); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			failWith(exitNoSuchProcess, fmt.Sprintf("cannot signal %d: %v", pid, err))
		}
		fail(fmt.Sprintf("cannot signal %d: %v", pid, err))
	}
}

// scriptSettle is how long a batch script has run before a signal for it is sent: time for its
// first lines, its traps, to run (natively the script has run since the job started, and a
// signal that comes in its first instant may beat its trap there too).
const scriptSettle = time.Second

// scriptSettled: the script whose pid file this is has run scriptSettle, counted from the file's
// writing, right after the script's start (run). The daemon counts from the container's start,
// which the API gives to the second, and the agent may start the script a while after: under
// load (CI) a USR1 sent 1 s after the container's start beat a script's trap.
func scriptSettled(pidfile string) bool {
	info, err := os.Stat(pidfile)
	if err != nil {
		return true
	}
	// A file dated in the future (a clock that went back) is no time to wait on.
	age := time.Since(info.ModTime())
	return age < 0 || age >= scriptSettle
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
