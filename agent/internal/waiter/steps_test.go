package waiter

// The script's srun steps on the waiter's side (steps.go) and a task proxy's end (task.go),
// checked from tests/unit/test_srun_steps_cannot_put_user_code_on_the_slurmd_host.py: what it
// checked of the retired Python waiter's steps and tasks, now of this one. Some are drivers the Python
// test runs as a program, with what to do in the environment.

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// WAITER_SRUN_ENVIRON (a JSON object) in, the environment srun would get out, as a JSON object in
// WAITER_SRUN_ENV_OUT; run in the directory a relative SLURM_CONF is read from.
func TestSrunEnvironmentOf(t *testing.T) {
	given := map[string]string{"SLURM_JOB_ID": "42", "LD_PRELOAD": "/home/alice/evil.so"}
	if raw, ok := os.LookupEnv("WAITER_SRUN_ENVIRON"); ok {
		given = map[string]string{}
		if err := json.Unmarshal([]byte(raw), &given); err != nil {
			t.Fatal(err)
		}
	}
	environ := Object{}
	for name, value := range given {
		environ = append(environ, Field{name, value})
	}
	env := map[string]string{}
	for _, entry := range srunEnvironment(environ) {
		name, value, _ := strings.Cut(entry, "=")
		if _, twice := env[name]; twice {
			t.Fatalf("%s twice in %v", name, srunEnvironment(environ))
		}
		env[name] = value
	}
	out, ok := os.LookupEnv("WAITER_SRUN_ENV_OUT")
	if !ok {
		expectEqual(t, "srun's environment", env, map[string]string{"SLURM_JOB_ID": "42",
			"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
		return
	}
	writeJSON(t, out, env)
}

// The steps' tables, for the Python test to check against the daemon's and the Python waiter's:
// JSON in WAITER_STEP_CONSTANTS_OUT.
func TestStepConstantsDump(t *testing.T) {
	out := outputOr(t, "WAITER_STEP_CONSTANTS_OUT", "steps.json")
	var layout []string
	for name := range srunLayoutVariables {
		layout = append(layout, name)
	}
	var signals []int
	for sig := 1; sig <= 64; sig++ {
		if stepSignals&setOf(syscall.Signal(sig)) != 0 {
			signals = append(signals, sig)
		}
	}
	safe := map[string]string{}
	for _, entry := range SafeEnvironment() {
		name, value, _ := strings.Cut(entry, "=")
		safe[name] = value
	}
	writeJSON(t, out, map[string]any{"layout": layout, "step_signals": signals, "safe_environment": safe,
		"srun_paths": SrunPaths})
}

// stepsUnderTest are a waiter's steps with a fake Slurm srun that notes its argv, environment and
// working directory in the directory returned, no daemon to relay its output to (it is written
// here), and the ends told by step-done noted.
type stepsUnderTest struct {
	steps     *scriptSteps
	directory string
	mu        sync.Mutex
	done      [][2]string
}

var waiterOwnCommand = []string{"/usr/libexec/slurm-k8s-bridge/waiter", "--api", "http://d:1"}

func newStepsUnderTest(t *testing.T) *stepsUnderTest {
	t.Setenv("SLURM_JOB_ID", "42")
	t.Setenv("SLURM_NTASKS", "4")
	t.Setenv("SLURM_TASK_PROLOG", "/home/alice/tp.sh")
	t.Setenv("LD_PRELOAD", "/home/alice/evil.so")
	withFakeMunge(t)
	directory := t.TempDir()
	srun := "#!/bin/sh\n" +
		"d=" + directory + "\n" +
		"printf '%s\\n' \"$0\" \"$@\" >\"$d/argv\"\n" +
		"tr '\\0' '\\n' </proc/$$/environ >\"$d/env\"\n" +
		"readlink /proc/$$/cwd >\"$d/cwd\"\n"
	writeExecutable(t, filepath.Join(directory, "srun"), srun)
	savedPaths, savedAttempts, savedDelay := SrunPaths, streamOpenAttempts, streamOpenDelay
	t.Cleanup(func() { SrunPaths, streamOpenAttempts, streamOpenDelay = savedPaths, savedAttempts, savedDelay })
	SrunPaths = []string{filepath.Join(directory, "srun")}
	trustFakesIn(t, directory)
	streamOpenAttempts, streamOpenDelay = 1, func(int) time.Duration { return 0 }
	under := &stepsUnderTest{directory: directory}
	post := func(action string, body []byte, _ time.Duration) error {
		var decoded struct {
			Key  string
			Code int
		}
		if action != "step-done" || json.Unmarshal(body, &decoded) != nil {
			t.Errorf("posted %s %s", action, body)
			return nil
		}
		under.mu.Lock()
		defer under.mu.Unlock()
		under.done = append(under.done, [2]string{decoded.Key, strconv.Itoa(decoded.Code)})
		return nil
	}
	// No daemon listens there: the relay does not open, and srun's output is written here.
	under.steps = newScriptSteps(&Client{URL: URL{"http", "127.0.0.1", 1}, JobID: testJobID}, waiterOwnCommand, post)
	return under
}

func stepData(t *testing.T, request map[string]any) string {
	data, err := json.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(data)
}

// startAndWait starts a step and waits for its end to be told; what it wrote to stderr.
func (u *stepsUnderTest) startAndWait(t *testing.T, data, token string) string {
	return stderrOf(t, func() {
		u.steps.start(data, token, []any{}) // no file options, as the attach passes a step without them
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			u.mu.Lock()
			told := len(u.done) > 0
			u.mu.Unlock()
			u.steps.mu.Lock()
			active := u.steps.active
			u.steps.mu.Unlock()
			if told && active == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the step never ended")
			}
		}
	})
}

// stderrOf is what f wrote to fd 2 (the job's error file, for a waiter).
func stderrOf(t *testing.T, f func()) string {
	file, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(saved) // what f starts must not hold the test's own stderr open
	if err := syscall.Dup2(int(file.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = syscall.Dup2(saved, 2); _ = syscall.Close(saved) }()
		f()
	}()
	data, _ := os.ReadFile(file.Name())
	return string(data)
}

func (u *stepsUnderTest) noted(t *testing.T, name string) (string, bool) {
	data, err := os.ReadFile(filepath.Join(u.directory, name))
	if os.IsNotExist(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(data), true
}

func TestAStepIsNamedAfterItsCommandUnlessTheUserNamedIt(t *testing.T) {
	cases := []struct{ options, command, want []string }{
		{nil, []string{"/usr/bin/python3", "x.py"}, []string{"--job-name=python3"}},
		{[]string{"--ntasks=2"}, []string{"bash"}, []string{"--ntasks=2", "--job-name=bash"}},
		{[]string{"--job-name=mine"}, []string{"bash"}, []string{"--job-name=mine"}},
		{nil, []string{"dir/"}, nil},
		{nil, nil, nil},
	}
	for _, c := range cases {
		expectEqual(t, strings.Join(c.command, " "), withStepName(c.options, c.command), c.want)
	}
}

func TestTheWaitersSrunRunsTheTaskProxyWithTheLayoutOnly(t *testing.T) {
	under := newStepsUnderTest(t)

	under.startAndWait(t, stepData(t, map[string]any{"key": 9, "argv": []string{"-l", "-n", "2", "sh", "-c", "id"}}),
		strings.Repeat("t", 64))

	argv, _ := under.noted(t, "argv")
	// Named after its command, as native srun names a step (sacct), not after the task proxies.
	want := append(append([]string{SrunPaths[0], "--jobid=42", "--label", "--ntasks=2", "--job-name=sh", "--chdir=/"},
		waiterOwnCommand...), "task", "9")
	expectEqual(t, "srun's command", strings.Split(strings.TrimSuffix(argv, "\n"), "\n"), want)
	text, _ := under.noted(t, "env")
	env := map[string]string{}
	for _, entry := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		name, value, _ := strings.Cut(entry, "=")
		env[name] = value
	}
	expectEqual(t, "the step token", env["SLURM_K8S_BRIDGE_STEP_TOKEN"], strings.Repeat("t", 64))
	expectEqual(t, "SLURM_NTASKS", env["SLURM_NTASKS"], "4")
	for _, dropped := range []string{"SLURM_TASK_PROLOG", "LD_PRELOAD"} {
		if _, ok := env[dropped]; ok {
			t.Fatalf("%s reached srun: %v", dropped, env)
		}
	}
	expectEqual(t, "PATH", env["PATH"], "/usr/sbin:/usr/bin:/sbin:/bin")
	cwd, _ := under.noted(t, "cwd")
	expectEqual(t, "srun's working directory", cwd, "/\n")
	expectEqual(t, "ends told", under.done, [][2]string{{"9", "0"}})
}

// WAITER_STEP_ARGV (JSON) is refused; WAITER_STEP_CODE is the end told for it.
func TestTheWaiterRunsNoSrunForARefusedStep(t *testing.T) {
	argv, code := []string{"--task-prolog=/home/alice/x", "id"}, "255"
	if raw, ok := os.LookupEnv("WAITER_STEP_ARGV"); ok {
		if err := json.Unmarshal([]byte(raw), &argv); err != nil {
			t.Fatal(err)
		}
		code = os.Getenv("WAITER_STEP_CODE")
	}
	under := newStepsUnderTest(t)

	stderr := under.startAndWait(t, stepData(t, map[string]any{"key": 4, "argv": argv}), strings.Repeat("t", 64))

	if _, ran := under.noted(t, "argv"); ran {
		t.Fatal("srun ran")
	}
	expectEqual(t, "ends told", under.done, [][2]string{{"4", code}})
	if !strings.Contains(stderr, "srun: ") {
		t.Fatalf("stderr %q", stderr)
	}
}

func TestTheWaiterRunsNoSrunForAnUnsignedStep(t *testing.T) {
	under := newStepsUnderTest(t)

	stderr := under.startAndWait(t, stepData(t, map[string]any{"key": 6, "argv": []string{"hostname"}}), "")

	if _, ran := under.noted(t, "argv"); ran {
		t.Fatal("srun ran")
	}
	expectEqual(t, "ends told", under.done, [][2]string{{"6", "1"}})
	if !strings.Contains(stderr, "not signed") {
		t.Fatalf("stderr %q", stderr)
	}
}

func TestAStepWhoseSrunCannotStartStillEnds(t *testing.T) {
	under := newStepsUnderTest(t)

	under.startAndWait(t, stepData(t, map[string]any{"key": 8, "argv": []string{"-J", "a\x00b", "hostname"}}),
		strings.Repeat("t", 64))

	if _, ran := under.noted(t, "argv"); ran {
		t.Fatal("srun ran")
	}
	expectEqual(t, "ends told", under.done, [][2]string{{"8", "1"}})
	expectEqual(t, "steps running", under.steps.active, 0)
}

func TestTheWaiterPassesAStepSignalToItsSrunAndNothingElse(t *testing.T) {
	under := newStepsUnderTest(t)
	srun := exec.Command("sleep", "30")
	if err := srun.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srun.Process.Kill(); _, _ = srun.Process.Wait() }()
	under.steps.sruns["5"] = srun
	ended := make(chan syscall.WaitStatus, 1)
	go func() {
		var status syscall.WaitStatus
		_, _ = syscall.Wait4(srun.Process.Pid, &status, 0, nil)
		ended <- status
	}()

	under.steps.signal("5", int64(9))  // not one srun acts on: dropped
	under.steps.signal("6", int64(15)) // no such step: dropped
	select {
	case status := <-ended:
		t.Fatalf("srun ended: %v", status)
	case <-time.After(200 * time.Millisecond):
	}
	under.steps.signal("5", int64(15))
	select {
	case status := <-ended:
		if !status.Signaled() || status.Signal() != syscall.SIGTERM {
			t.Fatalf("srun ended with %v", status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("srun never got TERM")
	}
}

// WAITER_TASK_CODE is what the task ended with: the proxy ends as it did (WAITER_CORE_UNLIMITED=1:
// after allowing core files of any size, as a user may).
func TestEndAsTheTask(t *testing.T) {
	given, ok := os.LookupEnv("WAITER_TASK_CODE")
	if !ok {
		expectEqual(t, "a plain exit code", endAsTheTask(3), 3)
		return
	}
	code, err := strconv.ParseInt(given, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("WAITER_CORE_UNLIMITED") == "1" {
		unlimited := syscall.Rlimit{Cur: ^uint64(0), Max: ^uint64(0)}
		if err := syscall.Setrlimit(syscall.RLIMIT_CORE, &unlimited); err != nil {
			t.Fatal(err)
		}
	}
	os.Exit(endAsTheTask(code))
}

// A daemon started again while a step ran knows no step of that key: the end names the waiter's
// run, whose first pod's srun waits for it (without it the script hung until its time limit).
func TestAStepsEndNamesTheWaitersRun(t *testing.T) {
	for _, test := range []struct {
		environment Object
		want        string
	}{
		{Object{}, `{"key": "3", "code": 1, "run": 0}`},
		{Object{{"SLURM_RESTART_COUNT", "2"}}, `{"key": "3", "code": 1, "run": 2}`},
		{Object{{"SLURM_RESTART_COUNT", "x"}}, `{"key": "3", "code": 1}`},
	} {
		waiter := NewWaiter(&Client{JobID: testJobID}, nil, test.environment, "/", nil, nil)
		var posted []string
		waiter.steps.post = func(action string, body []byte, _ time.Duration) error {
			posted = append(posted, action+" "+string(body))
			return nil
		}
		waiter.steps.done("3", 1)
		expectEqual(t, "posted", posted, []string{"step-done " + test.want})
	}
}

// A daemon rolled back to before the run refuses the field (its bodies forbid unknown ones): the
// end is told again without it, or a refused step's srun in the pod would wait for ever.
func TestAStepsEndIsToldWithoutTheRunToADaemonThatRefusesIt(t *testing.T) {
	steps := newScriptSteps(nil, nil, nil)
	steps.jobRun = 1
	var posted []string
	steps.post = func(action string, body []byte, _ time.Duration) error {
		posted = append(posted, string(body))
		if strings.Contains(string(body), "run") {
			return &DaemonError{Status: 400, Text: "unknown field"}
		}
		return nil
	}
	steps.done("2", 0)
	expectEqual(t, "posted", posted, []string{`{"key": "2", "code": 0, "run": 1}`, `{"key": "2", "code": 0}`})
}
