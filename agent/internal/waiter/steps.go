package waiter

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The srun steps of a batch script: the script's srun in the pod asks,
// through the attach stream, for a step; this runs Slurm's srun for it on the slurmd host, a real
// step whose tasks are the bridge's task proxies. Its output goes back through the step-output
// relay, its end by step-done. srun gets the job's layout and nothing else of its environment.

const (
	stepToken          = "SLURM_K8S_BRIDGE_STEP_TOKEN"
	maxConcurrentSteps = 64
)

// stepSignals are what the script's srun passes on to Slurm's.
var stepSignals = setOf(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1,
	syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGCONT)

// SrunPaths are where Slurm's srun is looked for, never on the job's PATH.
var SrunPaths = []string{"/usr/bin/srun", "/usr/local/bin/srun", "/opt/slurm/bin/srun"}

// srunLayoutVariables are what Slurm's srun gets of the batch environment: the job's layout, and
// the run's SLURM_RESTART_COUNT (a requeued job's tasks see it, as natively). Many other SLURM_*
// variables are srun options that would run or place the user's things here.
var srunLayoutVariables = map[string]bool{}

func init() {
	for _, name := range []string{"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES",
		"SLURM_JOB_NUM_NODES", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_CORE",
		"SLURM_NTASKS_PER_SOCKET", "SLURM_CPUS_PER_TASK", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
		"SLURM_JOB_CPUS_PER_NODE", "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE",
		"SLURM_MEM_PER_GPU", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_CLUSTER_NAME",
		"SLURM_JOB_PARTITION", "SLURM_JOB_NAME", "SLURM_DISTRIBUTION", "SLURM_OVERCOMMIT",
		"SLURM_THREADS_PER_CORE", "SLURM_TRES_PER_TASK", "SLURM_TRES_BIND", "SLURM_GPU_BIND",
		"SLURM_GPUS_PER_SOCKET", "SLURM_CPUS_PER_GPU", "SLURM_RESTART_COUNT"} {
		srunLayoutVariables[name] = true
	}
}

// rootControlled: the file and every directory above it are root's and writable by nobody else,
// both as the path is written and as its links resolve: what is read there now and later is root's.
func rootControlled(path string) bool {
	return notRootControlled(path) == ""
}

// notRootControlled is why path is not rootControlled, for an admin to act on; "" if it is. A
// link is accepted when root owns it and its directory (nobody else can repoint it) and what it
// leads to is root-controlled too: sites link /opt/slurm to the installed version.
func notRootControlled(path string) string {
	if why := chainNotRootControlled(path); why != "" {
		return why
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return path + ": " + err.Error()
	}
	if resolved != path {
		return chainNotRootControlled(resolved)
	}
	return ""
}

// chainNotRootControlled checks path and each directory above it as written.
func chainNotRootControlled(path string) string {
	for current := path; ; {
		var info syscall.Stat_t
		if err := syscall.Lstat(current, &info); err != nil {
			return current + ": " + err.Error()
		}
		link := info.Mode&syscall.S_IFMT == syscall.S_IFLNK
		switch {
		case info.Uid != 0:
			return fmt.Sprintf("%s is owned by uid %d, not root", current, info.Uid)
		case !link && info.Mode&0o022 != 0: // a link's own mode means nothing
			return fmt.Sprintf("%s is writable by others than root (mode %04o)", current, info.Mode&0o7777)
		}
		parent := filepath.Dir(current)
		if parent == current {
			return ""
		}
		current = parent
	}
}

// srunEnvironment is the environment of the waiter's srun: the job's layout variables, a fixed
// PATH and locale, and SLURM_CONF only if root controls it.
func srunEnvironment(environ Object) []string {
	var env []string
	for _, f := range environ {
		if srunLayoutVariables[f.Key] && f.Key != "PATH" && f.Key != "LC_ALL" {
			env = append(env, f.Key+"="+f.Value.(string))
		}
	}
	env = append(env, SafeEnvironment()...)
	if conf := lookup(environ, "SLURM_CONF"); len(conf) > 0 && conf[0] == '/' && rootControlled(conf) {
		env = append(env, "SLURM_CONF="+conf)
	}
	return env
}

// scriptSteps are the steps one batch waiter runs for its script: which were started (a
// request seen again after a reconnect is not run twice), how many run, and their sruns.
type scriptSteps struct {
	client *Client
	// How the waiter was started, less its batch script: the task proxies are that command.
	ownCommand []string
	post       postAction
	mu         sync.Mutex
	started    map[string]bool
	active     int
	sruns      map[string]*exec.Cmd
	// When slurmstepd last sent the batch step each signal, and which of those each step's
	// srun in the pod has passed back already (signalBack).
	fromSlurm  map[syscall.Signal]time.Time
	passedBack map[string]time.Time
	// stopping: the daemon said the run stops because Slurm ends it (runStopping); stopEchoes,
	// the steps whose srun in the pod has passed that stop's TERM back.
	stopping   bool
	stopEchoes map[string]bool
	// jobRun is the waiter's run of the job (-1: not known), named with each step's end: a daemon
	// started again since the step began knows no step of that key, and finds the run's pod by it.
	jobRun int64
}

// echoWindow is how long after slurmstepd signalled the batch step the same signal from the
// pod's srun is that one coming back, not the script's own.
const echoWindow = 3 * time.Second

func newScriptSteps(client *Client, ownCommand []string, post postAction) *scriptSteps {
	return &scriptSteps{client: client, ownCommand: ownCommand, post: post, started: map[string]bool{},
		sruns: map[string]*exec.Cmd{}, fromSlurm: map[syscall.Signal]time.Time{}, passedBack: map[string]time.Time{},
		stopEchoes: map[string]bool{}, jobRun: -1}
}

// slurmSignalled: slurmstepd sent the batch step sig. A TERM may stop the run (cli.go):
// the waiter and the sruns it runs are that step's processes, so each srun got it from slurmstepd
// too, and in the pod the stop reaches the script's whole process group, its srun too, which
// passes it back. Other signals reach only the script there: one from its srun is the script's.
func (s *scriptSteps) slurmSignalled(sig syscall.Signal) {
	if sig != syscall.SIGTERM {
		return
	}
	s.mu.Lock()
	s.fromSlurm[sig] = time.Now()
	s.mu.Unlock()
}

// runStopping: the run stops because Slurm ends it. slurmstepd sends every process of the batch
// step its TERM, each srun the waiter runs too, whether it has yet or not; the stop's TERM to the
// script's process group in the pod reaches each step's srun there, which passes it back. That
// one is the stop's, however long the stop takes, and before or after slurmstepd's own.
func (s *scriptSteps) runStopping() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
}

// recentlyFromSlurm: slurmstepd sent the batch step sig within the echo window, or, for TERM, the
// run stops (Slurm's srun gets slurmstepd's TERM).
func (s *scriptSteps) recentlyFromSlurm(sig syscall.Signal) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, recent := s.fromSlurmWithin(sig)
	return recent || (sig == syscall.SIGTERM && s.stopping)
}

// fromSlurmWithin is when slurmstepd last sent sig, and whether that is within the echo window
// (s.mu held).
func (s *scriptSteps) fromSlurmWithin(sig syscall.Signal) (time.Time, bool) {
	at, sent := s.fromSlurm[sig]
	return at, sent && time.Since(at) <= echoWindow
}

// signalBack reports whether sig from step key's srun in the pod is slurmstepd's own coming back:
// the waiter passed it on to the script, whose process group holds that srun, which passes what it
// gets on to Slurm's srun. Natively srun gets it once; each step's srun passes it back once.
func (s *scriptSteps) signalBack(key string, sig syscall.Signal) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sig == syscall.SIGTERM && s.stopping {
		// Each step's srun passes the stop's TERM back once; a second is the script's own.
		echo := !s.stopEchoes[key]
		s.stopEchoes[key] = true
		return echo
	}
	at, recent := s.fromSlurmWithin(sig)
	if !recent {
		return false
	}
	mark := key + ":" + strconv.Itoa(int(sig))
	if s.passedBack[mark].Equal(at) {
		return false
	}
	s.passedBack[mark] = at
	return true
}

// start runs Slurm's srun for the script's srun; io are the step's file options as the daemon
// made them.
func (s *scriptSteps) start(data, token string, io any) {
	raw, err := pyA2bBase64(data)
	if err != nil {
		return
	}
	value, err := Loads(raw)
	request, isObject := value.(Object)
	if err != nil || !isObject {
		return // not a step request of the agent's: nothing to run
	}
	keyValue, _ := request.Get("key")
	number, ok := pyInt(keyValue)
	argvValue, _ := request.Get("argv")
	list, isList := argvValue.([]any)
	if !ok || !isList {
		return
	}
	key := strconv.FormatInt(number, 10)
	argv := make([]string, len(list))
	for i, arg := range list {
		argv[i] = pyStr(arg)
	}
	options, userCommand, err := SplitSrunArgs(argv)
	var limitEnv []string
	if err == nil {
		options = withStepName(options, userCommand)
		var hostIO []string
		hostIO, err = HostIOOptions(io)
		requestEnv, _ := request.Get("env")
		environ, _ := requestEnv.(Object)
		var limitOptions []string
		limitEnv, limitOptions = stepLimits(environ, options)
		options = append(append(options, hostIO...), limitOptions...)
	}
	if err != nil {
		_ = WriteAll(2, []byte(err.Error()+"\n"))
		go s.done(key, err.(srunError).ExitCode())
		return
	}
	s.mu.Lock()
	if s.started[key] {
		s.mu.Unlock()
		return // seen before a reconnect
	}
	s.started[key] = true
	busy := s.active >= maxConcurrentSteps
	s.mu.Unlock()
	if token == "" || busy {
		_ = WriteAll(2, []byte("srun: error: this step was not started (too many at once, or not signed)\n"))
		go s.done(key, 1)
		return
	}
	srun, err := executable(SrunPaths, "srun is not installed on this host (looked for "+joinComma(SrunPaths)+")")
	if err != nil {
		_ = WriteAll(2, []byte("srun: error: "+err.Error()+"\n"))
		go s.done(key, 1)
		return
	}
	command := append([]string{srun, "--jobid=" + os.Getenv("SLURM_JOB_ID")}, options...)
	command = append(append(append(command, "--chdir=/"), s.ownCommand...), "task", key)
	env := append(srunEnvironment(Environ()), stepToken+"="+token) // the SPANK guard checks it
	env = append(env, limitEnv...)
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
	go s.run(key, command, env, stepStdin(request))
}

// withStepName names the step as native srun would, after its command's base name (`python`,
// `bash`; sacct's JobName of the step), unless the user named it: Slurm's srun here runs the task
// proxies, whose name it would take otherwise. The tasks still see the script's SLURM_JOB_NAME
// (bridge/core/step_request.py task_environment).
func withStepName(options, command []string) []string {
	for _, option := range options {
		if strings.HasPrefix(option, "--job-name=") {
			return options
		}
	}
	if len(command) == 0 {
		return options
	}
	name := command[0][strings.LastIndexByte(command[0], '/')+1:]
	if name == "" {
		return options
	}
	return append(options, "--job-name="+name)
}

// stepStdin is what the script's srun read of its stdin (`echo x | srun cat`, the rest of an
// sbatch --input file): Slurm's srun gets it as its own stdin and forwards it to the step's tasks
// as natively. None (nil) leaves srun /dev/null.
func stepStdin(request Object) []byte {
	value, _ := request.Get("stdin")
	encoded, ok := value.(string)
	if !ok || encoded == "" {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return nil
	}
	return data
}

func (s *scriptSteps) run(key string, command, env []string, stdin []byte) {
	relay := newStepOutputRelay(s.client, key)
	relay.run = s.jobRun
	relay.termedBySlurm = func() bool { return s.recentlyFromSlurm(syscall.SIGTERM) }
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	code, err := runRelayed(cmd, relay, func(cmd *exec.Cmd) {
		s.mu.Lock()
		s.sruns[key] = cmd
		s.mu.Unlock()
	}, bounds{})
	if err != nil {
		_ = WriteAll(2, []byte("srun: error: "+pyError(err)+"\n"))
		code = 1
	}
	s.mu.Lock()
	delete(s.sruns, key)
	s.active--
	s.mu.Unlock()
	if !relay.delivered {
		s.done(key, code)
	}
}

// signal: the script's srun got sig; Slurm's srun of that step gets it, and does what it does
// natively (cancels the step on TERM, passes USR1 on to the tasks...).
func (s *scriptSteps) signal(key string, sig any) {
	number, ok := sig.(int64)
	s.mu.Lock()
	cmd := s.sruns[key]
	s.mu.Unlock()
	if cmd == nil || !ok || number < 1 || number > 64 || stepSignals&setOf(syscall.Signal(number)) == 0 {
		return
	}
	if s.signalBack(key, syscall.Signal(number)) {
		return
	}
	// Not cmd.ProcessState, which cmd.Wait writes meanwhile: os.Process knows itself whether it
	// has been waited for, and then signals nothing.
	_ = cmd.Process.Signal(syscall.Signal(number))
}

// done tells the daemon the step ended with code (the script's srun exits with it).
func (s *scriptSteps) done(key string, code int) {
	body := Object{{"key", key}, {"code", code}}
	if s.jobRun >= 0 {
		body = append(body, Field{"run", s.jobRun})
	}
	for attempt := range 20 {
		err := s.post("step-done", Dumps(body), 10*time.Second)
		status := daemonStatus(err)
		if status == 400 && len(body) > 2 {
			body = body[:2] // a daemon older than the run refuses the field: told without it
			continue
		}
		if err == nil || status >= 400 && status < 500 {
			return
		}
		time.Sleep(reconnectDelay(attempt))
	}
}

func joinComma(items []string) string {
	out := ""
	for i, item := range items {
		if i > 0 {
			out += ", "
		}
		out += item
	}
	return out
}
