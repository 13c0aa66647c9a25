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
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

type stepRequest struct {
	Key  string            `json:"key"`
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd"`
	Env  map[string]string `json:"env"`
}

func socketPath(dir string) string      { return filepath.Join(dir, "agent.sock") }
func resultPath(dir, key string) string { return filepath.Join(dir, "steps", key+".rc") }

// serveSteps accepts step requests from `srun` processes of the script and frames them.
func serveSteps(dir string, out *frames) {
	_ = os.MkdirAll(filepath.Join(dir, "steps"), 0o755)
	_ = os.Remove(socketPath(dir))
	listener, err := net.Listen("unix", socketPath(dir))
	if err != nil {
		fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: srun will not work: %v\n", err)
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
				request.Key = strconv.FormatInt(counter.Add(1), 10)
				data, _ := json.Marshal(request)
				out.writeRaw('s', data)
				_, _ = conn.Write([]byte(request.Key + "\n"))
			}()
		}
	}()
}

// srunClient is `srun ARGS...` inside the pod: it waits for Slurm to run the step and exits
// with srun's exit code.
func srunClient(args []string) {
	dir := filepath.Dir(mustExecutable()) // the symlink resolved: the agent's own directory
	cwd, _ := os.Getwd()
	env := map[string]string{}
	for _, kv := range os.Environ() {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				env[kv[:i]] = kv[i+1:]
				break
			}
		}
	}
	conn, err := net.Dial("unix", socketPath(dir))
	for attempt := 0; err != nil && attempt < 50; attempt++ {
		time.Sleep(100 * time.Millisecond) // the agent may still be starting up
		conn, err = net.Dial("unix", socketPath(dir))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "srun: error: cannot reach the job's step launcher: %v\n", err)
		os.Exit(1)
	}
	data, _ := json.Marshal(stepRequest{Argv: args, Cwd: cwd, Env: env})
	if _, err := conn.Write(append(data, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "srun: error: %v\n", err)
		os.Exit(1)
	}
	key, err := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if err != nil || len(key) < 2 {
		fmt.Fprintln(os.Stderr, "srun: error: the job's step launcher did not answer")
		os.Exit(1)
	}
	rc := resultPath(dir, key[:len(key)-1])
	for {
		if raw, err := os.ReadFile(rc); err == nil {
			code, err := strconv.Atoi(string(trimSpace(raw)))
			if err == nil {
				os.Exit(code)
			}
		}
		time.Sleep(50 * time.Millisecond)
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

// task is `agent task PIDFILE ENV -- ARGV`: one task of a step, run by the daemon in this pod. ENV is
// base64 JSON of the variables the task gets on top of the container's (srun's environment in
// the script, and the SLURM_* slurmstepd set for this task).
func task(pidfile, encodedEnv string, argv []string) {
	_ = os.MkdirAll(filepath.Dir(pidfile), 0o755)
	// The task's pid is ours after the exec: `agent signal PIDFILE N` reaches it (scancel -s,
	// --signal=SIG@T for steps, and the kill of a task whose proxy died).
	_ = os.WriteFile(pidfile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	// Its own process group: a signal for the step reaches every process of the task, as
	// slurmstepd signals all of a step's processes.
	_ = syscall.Setpgid(0, 0)
	raw, err := base64.StdEncoding.DecodeString(encodedEnv)
	if err != nil {
		fail("bad task environment")
	}
	env := map[string]string{}
	if json.Unmarshal(raw, &env) != nil {
		fail("bad task environment")
	}
	for key, value := range env {
		_ = os.Setenv(key, value)
	}
	if cwd := env["SLURM_K8S_BRIDGE_TASK_CWD"]; cwd != "" {
		_ = os.Chdir(cwd)
	}
	_ = os.Unsetenv("SLURM_K8S_BRIDGE_TASK_CWD")
	path := argv[0]
	if filepath.Base(path) == path {
		if found, err := lookPath(path); err == nil {
			path = found
		}
	}
	err = syscall.Exec(path, argv, os.Environ())
	// As slurmstepd reports a task it cannot start; srun then reports exit code 2.
	fmt.Fprintf(os.Stderr, "slurmstepd: error: execve(): %s: %v\n", argv[0], err)
	os.Exit(2)
}

func lookPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		candidate := filepath.Join(dir, name)
		if info, err := os.Stat(candidate); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", os.ErrNotExist
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
