package main

// Job steps from inside the pod. `srun` in a bridged pod is this binary (a symlink in the
// agent's bin directory, first on the job's PATH). It does not run anything itself: it asks the
// agent that runs the batch script, over a Unix socket beside it, to have the step launched by
// Slurm. The agent writes the request as one more log line, "s <base64 JSON>"; the daemon hands
// it to the job's waiter on the slurmd host, which runs the real srun there (a real step, in
// sacct) with the bridge's task proxies as its tasks; each proxy has the daemon run its task in
// the right pod (`agent task`), and the waiter reports srun's exit code back with
// `agent step-done`, which the waiting `srun` here picks up.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"slurm-k8s-bridge/agent/internal/srunargs"
	"slurm-k8s-bridge/agent/internal/startlimits"
)

type stepRequest struct {
	Key  string            `json:"key"`
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd"`
	Env  map[string]string `json:"env"`
	// A signal the script's srun got, for Slurm's srun of step SignalKey (no step is asked for).
	SignalKey string `json:"signal_key,omitempty"`
	Signal    int    `json:"signal,omitempty"`
	// One of Slurm's commands (commands.go) instead of a step: its name, what it read on stdin,
	// and the contents of the arguments that name files here (sbatch's script).
	Command string            `json:"command,omitempty"`
	Stdin   []byte            `json:"stdin,omitempty"`
	Files   map[string][]byte `json:"files,omitempty"`
}

type stepSignal struct {
	Key    string `json:"key"`
	Signal int    `json:"signal"`
}

// forwardedToSrun are the signals native srun acts on (it cancels or signals its step): the
// script's srun passes them to Slurm's srun of its step, which then does what it does natively.
var forwardedToSrun = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGCONT}

func socketPath(dir string) string      { return filepath.Join(dir, "agent.sock") }
func resultPath(dir, key string) string { return filepath.Join(dir, "steps", key+".rc") }

// serveSteps accepts step requests from `srun` processes of the script and frames them.
func serveSteps(dir string, out *frames) {
	_ = os.MkdirAll(filepath.Join(dir, "steps"), 0o755)
	_ = os.Remove(socketPath(dir))
	listener, err := net.Listen("unix", socketPath(dir))
	if err != nil {
		// On the script's stderr, in the frames: the container's own stderr may reach the log
		// after the ending frame, where nothing is read any more.
		out.write('e', []byte(fmt.Sprintf("slurm-k8s-bridge-agent: srun will not work: %v\n", err)))
		return
	}
	var counter atomic.Int64
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				line, err := bufio.NewReaderSize(conn, 1<<20).ReadBytes('\n')
				if err != nil {
					return
				}
				var request stepRequest
				if json.Unmarshal(line, &request) != nil {
					return
				}
				if request.SignalKey != "" {
					data, _ := json.Marshal(stepSignal{Key: request.SignalKey, Signal: request.Signal})
					out.writeRaw('k', data)
					return
				}
				request.Key = strconv.FormatInt(counter.Add(1), 10)
				data, _ := json.Marshal(request)
				tag := byte('s')
				if request.Command != "" {
					tag = 'c' // one of Slurm's commands: the same keys, its own frame
				}
				out.writeRaw(tag, data)
				_, _ = conn.Write([]byte(request.Key + "\n"))
			}()
		}
	}()
}

// environ is the process's environment as a map.
func environ() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				env[kv[:i]] = kv[i+1:]
				break
			}
		}
	}
	return env
}

// ask hands a request to the agent that runs the batch script and returns its key. `name` is
// the command's own name, for its error messages.
func ask(dir, name string, request stepRequest) string {
	conn, err := net.Dial("unix", socketPath(dir))
	for attempt := 0; err != nil && attempt < 50; attempt++ {
		time.Sleep(100 * time.Millisecond) // the agent may still be starting up
		conn, err = net.Dial("unix", socketPath(dir))
	}
	if err != nil {
		// Only the batch script's pod has the agent's socket (the other pods' agents only hold
		// their node): say so instead of waiting.
		fmt.Fprintf(os.Stderr, "%s: error: cannot reach the job's batch script agent (only the batch "+
			"script's pod, the job's first node, runs Slurm commands): %v\n", name, err)
		os.Exit(1)
	}
	data, _ := json.Marshal(request)
	if _, err := conn.Write(append(data, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "%s: error: %v\n", name, err)
		os.Exit(1)
	}
	key, err := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if err != nil || len(key) < 2 {
		fmt.Fprintf(os.Stderr, "%s: error: the job's batch script agent did not answer\n", name)
		os.Exit(1)
	}
	return key[:len(key)-1]
}

// srunClient is `srun ARGS...` inside the pod: it waits for Slurm to run the step and exits
// with srun's exit code.
func srunClient(args []string) {
	// `srun --version` (MPI launchers and tools ask it), --help, --usage: Slurm's srun on the slurmd
	// host prints them, through the door of Slurm's commands; no step.
	if info := srunargs.Info(args); info != "" {
		commandClient("srun", []string{info})
		return
	}
	dir := filepath.Dir(mustExecutable()) // the symlink resolved: the agent's own directory
	cwd, _ := os.Getwd()
	// A batch script's `srun --pty` has no terminal: native srun says so and runs the step without.
	args, said := srunargs.WithoutPty(args, windowSize)
	if said != "" {
		_, _ = os.Stderr.WriteString(said)
	}
	// `srun --jobid=$SLURM_JOB_ID`: the step runs in this job anyway, as natively.
	args = srunargs.WithoutOwnJobID(args, os.Getenv("SLURM_JOB_ID"))
	stdin, asFile := srunStdin(args)
	request := stepRequest{Argv: append(asFile, args...), Cwd: cwd, Env: withOwnLimits(environ()), Stdin: stdin}
	if data, _ := json.Marshal(request); request.Stdin != nil && base64.StdEncoding.EncodedLen(len(data)) > maxFrameData {
		fmt.Fprintf(os.Stderr, "srun: error: the step's stdin, arguments and environment exceed %d KiB\n",
			maxFrameData*3/4>>10)
		os.Exit(1)
	}
	key := ask(dir, "srun", request)
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, forwardedToSrun...)
	go func() {
		var lastInterrupt time.Time
		for sig := range signals {
			number, _ := sig.(syscall.Signal)
			forwardSignal(dir, key, int(number))
			// Should the step not end (the bridge restarted and lost it, the waiter is away),
			// a signal that ends native srun ends this one too, a while later.
			ends := number == syscall.SIGTERM || number == syscall.SIGHUP || number == syscall.SIGQUIT ||
				(number == syscall.SIGINT && time.Since(lastInterrupt) < time.Second)
			if number == syscall.SIGINT {
				lastInterrupt = time.Now()
			}
			if ends {
				go func(code int) {
					// The job is ending (scancel, the time limit) before Slurm's srun of this step
					// started: no step will come (Slurm makes none in an ending job), and native
					// srun ends at once; waiting would hold the job until the pod's KILL.
					if jobStopping(dir) && !stepStartedBySlurm(stoppingRelayWait) {
						os.Exit(128 + code)
					}
					time.Sleep(srunSignalGrace())
					os.Exit(128 + code)
				}(int(number))
			}
		}
	}()
	awaitResult(dir, key)
}

// withOwnLimits is env with this srun's soft limits and umask, as native srun puts them in a
// step's environment: SLURM_RLIMIT_<NAME> for each limit Slurm propagates (over one the script
// set), SLURM_UMASK unless the script set one. The script may have changed them since the job
// started; the waiter passes these on to the step's tasks (internal/waiter/step_limits.go).
func withOwnLimits(env map[string]string) map[string]string {
	entries := startlimits.StartLimits()
	if nofile := callersNofile(entries); nofile != "" {
		entries = append(entries, "SLURM_RLIMIT_NOFILE="+nofile)
	}
	for _, entry := range entries {
		name, value, _ := strings.Cut(entry, "=")
		limit, isLimit := strings.CutPrefix(name, "SLURM_RLIMIT_")
		if isLimit && startlimits.Propagated(limit) {
			env[name] = value
		} else if _, set := env[name]; name == "SLURM_UMASK" && !set {
			env[name] = value
		}
	}
	return env
}

// nofileAskLimit bounds the shell callersNofile asks.
const nofileAskLimit = 2 * time.Second

// callersNofile is the soft RLIMIT_NOFILE this srun was started with when entries (StartLimits of
// an agent built without cgo) lack it because the Go runtime raised it before any Go code ran: a
// child gets it back (os/exec restores it), so a shell's `ulimit -S -n` tells it. "" when entries
// have it, or without a shell in the image (then the waiter passes the job's start value on).
func callersNofile(entries []string) string {
	for _, entry := range entries {
		if strings.HasPrefix(entry, "SLURM_RLIMIT_NOFILE=") {
			return ""
		}
	}
	// Bounded, and without the script's environment (an exported BASH_FUNC_ulimit%%, an
	// LD_PRELOAD profiler): only the shell's builtin answers.
	ctx, cancel := context.WithTimeout(context.Background(), nofileAskLimit)
	defer cancel()
	command := exec.CommandContext(ctx, "/bin/sh", "-c", "ulimit -S -n")
	command.Env = []string{"PATH=/usr/bin:/bin"}
	command.WaitDelay = time.Second
	out, err := command.Output()
	value := strings.TrimSpace(string(out))
	if err != nil {
		return ""
	}
	if value == "unlimited" {
		return strconv.FormatUint(^uint64(0), 10)
	}
	if _, err := strconv.ParseUint(value, 10, 64); err != nil {
		return ""
	}
	return value
}

// awaitResult waits for the output and exit code of request `key` and exits with that code.
func awaitResult(dir, key string) {
	// Slurm's srun output comes back here (`agent step-output`, run by the daemon), so that it
	// goes where this srun's own stdout and stderr go: a pipe, a file, $(...), as natively.
	relayed := make(chan int, 1)
	if listener, err := net.Listen("unix", outputSocketPath(dir, key)); err == nil {
		go receiveStepOutput(listener, relayed)
	}
	rc := resultPath(dir, key)
	// The relay's end wakes this at once; the result file (step-done, when the waiter could not
	// relay) is looked for ever less often: a step of hours must not cost its job CPU time here
	// (native srun sleeps; a 20 ms poll charged ~1 % of a core to the batch step).
	look := resultFirstLook
	for {
		select {
		case code := <-relayed:
			if code >= 0 {
				exitAfterStep(code)
			}
		case <-time.After(look):
			look = min(2*look, resultLastLook)
		}
		if raw, err := os.ReadFile(rc); err == nil {
			code, err := strconv.Atoi(string(trimSpace(raw)))
			if err == nil {
				// step-done: the waiter could not relay the output. A relay under way still
				// ends first, with its own end frame (or by breaking off).
				if relayInProgress.Load() {
					if relayedCode := <-relayed; relayedCode >= 0 {
						code = relayedCode
					}
				}
				exitAfterStep(code)
			}
		}
	}
}

// resultFirstLook and resultLastLook bound the wait between two looks for a step's result file.
const resultFirstLook, resultLastLook = 20 * time.Millisecond, 500 * time.Millisecond

// forwardSignal asks the agent to pass `number` on to Slurm's srun of step `key`.
func forwardSignal(dir, key string, number int) {
	conn, err := net.Dial("unix", socketPath(dir))
	if err != nil {
		return
	}
	defer conn.Close()
	data, _ := json.Marshal(stepRequest{SignalKey: key, Signal: number})
	_, _ = conn.Write(append(data, '\n'))
}

// srunSignalGrace is how long the script's srun waits, after a signal that ends native srun,
// for its step to end before it exits anyway (KillWait and srun's own wait come first).
func srunSignalGrace() time.Duration {
	if seconds, err := strconv.Atoi(os.Getenv("SLURM_K8S_BRIDGE_SRUN_SIGNAL_GRACE_S")); err == nil && seconds > 0 {
		return time.Duration(seconds) * time.Second // tests
	}
	return 60 * time.Second
}

func outputSocketPath(dir, key string) string { return filepath.Join(dir, "steps", key+".sock") }

var relayInProgress atomic.Bool

// relayConnected: the daemon's `agent step-output` reached this srun, which the waiter starts the
// moment it starts Slurm's srun of the step.
var relayConnected atomic.Bool

// stoppingRelayWait is how long an ending job's srun waits for the relay of a step whose Slurm
// srun may have started just then.
const stoppingRelayWait = 2 * time.Second

// stepStartedBySlurm reports whether Slurm's srun of this step has started, waiting up to `wait`.
func stepStartedBySlurm(wait time.Duration) bool {
	for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) {
		if relayConnected.Load() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func stoppingPath(dir string) string { return filepath.Join(dir, "stopping") }

// markJobStopping records, for the script's sruns, that the job is being stopped (the agent got
// the daemon's or the kubelet's TERM). The directory is the job's user's: a FIFO planted there
// must not block the stop, nor a link lead elsewhere.
func markJobStopping(dir string) {
	fd, err := syscall.Open(stoppingPath(dir), syscall.O_CREAT|syscall.O_WRONLY|syscall.O_NOFOLLOW|
		syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o644)
	if err == nil {
		_ = syscall.Close(fd)
	}
}

func jobStopping(dir string) bool {
	info, err := os.Lstat(stoppingPath(dir))
	return err == nil && info.Mode().IsRegular()
}

// Output frames, from the daemon to `agent step-output` and on to srun here: one byte of fd (1
// stdout, 2 stderr, 0 the end, whose data is srun's exit code), four of length, then the data.
const maxOutputFrame = 1 << 20

func readOutputFrame(r io.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxOutputFrame || head[0] > 2 {
		return 0, nil, fmt.Errorf("bad output frame (fd %d, %d bytes)", head[0], n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return 0, nil, err
	}
	return head[0], data, nil
}

// receiveStepOutput takes the relays of the step's output in turn: should one break off (its
// daemon went away), the next daemon's relay goes on from the frames written here, which each
// relay is told first (8 bytes) and then after each frame it brought (agent step-output).
func receiveStepOutput(listener net.Listener, relayed chan<- int) {
	defer func() {
		listener.Close()
		_ = os.Remove(listener.Addr().String())
	}()
	var written uint64
	for {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		relayConnected.Store(true)
		relayInProgress.Store(true)
		code, ended := takeStepOutput(conn, &written)
		conn.Close()
		relayInProgress.Store(false)
		if ended {
			relayed <- code
			return
		}
		// Broken off: the waiter asks the next daemon to go on; step-done tells the exit code
		// should it give up (awaitResult, holding one, waits for this word).
		select {
		case relayed <- -1:
		default:
		}
	}
}

// takeStepOutput writes one relay's frames where this srun's stdout and stderr go; the exit code
// and true once the end frame came.
func takeStepOutput(conn net.Conn, written *uint64) (int, bool) {
	var count [8]byte
	binary.BigEndian.PutUint64(count[:], *written)
	// Not heard by a relay that wrote all it had and went: its frames are read all the same.
	_, _ = conn.Write(count[:])
	reader := bufio.NewReaderSize(conn, 256<<10)
	for {
		fd, data, err := readOutputFrame(reader)
		if err != nil {
			return 0, false
		}
		switch fd {
		case 0:
			code, err := strconv.Atoi(string(data))
			if err != nil {
				code = 1
			}
			return code, true
		case 1:
			writeAllTo(os.Stdout, data)
		case 2:
			writeAllTo(os.Stderr, data)
		}
		*written++
		binary.BigEndian.PutUint64(count[:], *written)
		_, _ = conn.Write(count[:])
	}
}

func writeAllTo(f *os.File, data []byte) {
	// A closed pipe (srun ... | head -1) ends this srun as it would Slurm's: by SIGPIPE.
	_, _ = f.Write(data)
}

// stepOutput is `agent step-output KEY`: the daemon's exec that carries Slurm's srun output for
// step KEY, framed on stdin, to the waiting srun of the script.
func stepOutput(key string) {
	if _, err := strconv.Atoi(key); err != nil {
		fail("not a step key: " + strconv.Quote(key))
	}
	dir := filepath.Dir(mustExecutable())
	conn, err := net.Dial("unix", outputSocketPath(dir, key))
	for attempt := 0; err != nil && attempt < 200; attempt++ {
		time.Sleep(50 * time.Millisecond) // srun here may not have its socket yet
		conn, err = net.Dial("unix", outputSocketPath(dir, key))
	}
	if err != nil {
		// The script's srun is gone before its output came (killed at once): so is the step.
		fmt.Fprintln(os.Stderr, "slurm-k8s-bridge-agent: the step's srun is not waiting: "+err.Error())
		os.Exit(exitSrunGone)
	}
	defer conn.Close()
	// srun here says how many frames it has written (a relay that goes on from a broken one
	// starts there), then the count after each frame: both go to the daemon on stdout. Its end
	// (killed, `timeout 5 srun ...`) shows as the end of the connection, and ends this relay at
	// once, so that the daemon ends the step, as natively.
	var count [8]byte
	if _, err := io.ReadFull(conn, count[:]); err != nil {
		os.Exit(exitSrunGone)
	}
	fmt.Printf("from %d\n", binary.BigEndian.Uint64(count[:]))
	var ended atomic.Bool
	go func() {
		var count [8]byte
		for {
			if _, err := io.ReadFull(conn, count[:]); err != nil {
				if !ended.Load() {
					os.Exit(exitSrunGone)
				}
				return
			}
			fmt.Printf("k %d\n", binary.BigEndian.Uint64(count[:]))
		}
	}()
	in := bufio.NewReaderSize(os.Stdin, 256<<10)
	var head [5]byte
	for {
		fd, data, err := readOutputFrame(in)
		if err != nil {
			fail(err.Error())
		}
		head[0] = fd
		binary.BigEndian.PutUint32(head[1:], uint32(len(data)))
		if fd == 0 {
			ended.Store(true)
		}
		if _, err := conn.Write(append(head[:], data...)); err != nil {
			// srun here is gone (killed, or its pipe closed): the daemon ends the step.
			os.Exit(exitSrunGone)
		}
		if fd == 0 {
			return
		}
	}
}

// stepDone is `agent step-done KEY CODE`, run by the daemon once Slurm's srun has ended.
func stepDone(key, code string) {
	if _, err := strconv.Atoi(code); err != nil {
		fail("not an exit code: " + strconv.Quote(code))
	}
	if _, err := strconv.Atoi(key); err != nil {
		fail("not a step key: " + strconv.Quote(key))
	}
	dir := filepath.Dir(mustExecutable())
	path := resultPath(dir, key)
	if err := os.WriteFile(path+".tmp", []byte(code+"\n"), 0o644); err != nil {
		fail(err.Error())
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		fail(err.Error())
	}
}

func mustExecutable() string {
	self, err := os.Executable()
	if err != nil {
		fail("cannot find own executable: " + err.Error())
	}
	resolved, err := filepath.EvalSymlinks(self)
	if err != nil {
		return self
	}
	return resolved
}
