package waiter

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Slurm's own commands for the batch script in the pod: the pod's
// command asks through the daemon's attach stream; the daemon checked it (or says why it refused
// it); this checks it again (slurm_commands.go) and runs Slurm's real binary here, as the job's
// user: by absolute path, no shell, a fixed environment, the arguments as checked, sbatch's script
// text on stdin and the job's variables through --export-file on a memfd, bounded output and
// time. Its output and exit code go back through the step-output relay, or step-done should the
// relay fail. Nothing the user chose runs here.

const (
	// Slurm commands a waiter runs at once (each is a process here and RPCs to slurmctld).
	maxConcurrentCommands = 32
	// Bytes of a command's output relayed before it is stopped (sacct of a busy cluster is large).
	commandOutputLimit = 64 * 1024 * 1024
	// A command still running after this is stopped (squeue -i, sbatch --wait of a long job).
	commandTimeLimit = 3600 * time.Second
)

// commandBinary is Slurm's binary by absolute path, never from the job's PATH.
func commandBinary(command string) (string, error) {
	paths := make([]string, len(slurmBinaryDirs))
	for i, directory := range slurmBinaryDirs {
		paths[i] = directory + "/" + command
	}
	return executable(paths, command+" is not installed on this host (looked in "+joinComma(slurmBinaryDirs)+")")
}

// commandEnvironment is the binary's environment: fixed, nothing of the user's (no LD_*,
// SQUEUE_FORMAT, SBATCH_*): a PATH and locale, SLURM_CONF only if root owns it, and for scontrol
// the job's node list (`scontrol show hostnames` with no list reads it).
func commandEnvironment(command string, environ Object) []string {
	env := SafeEnvironment()
	if conf := lookup(environ, "SLURM_CONF"); len(conf) > 0 && conf[0] == '/' && rootControlled(conf) {
		env = append(env, "SLURM_CONF="+conf)
	}
	// scontrol reads SLURM_NODELIST (`scontrol show hostnames` with no list): both names, as
	// slurmstepd sets them for the script.
	for _, name := range []string{"SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		if nodes := lookup(environ, name); command == "scontrol" && nodes != "" {
			env = append(env, name+"="+nodes)
		}
	}
	return env
}

// memfdWith is an anonymous in-memory file holding data, read from its start. Close-on-exec: a
// child gets it only as its stdin or one of its ExtraFiles.
func memfdWith(name string, data []byte) (*os.File, error) {
	cname := append([]byte(name), 0)
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(&cname[0])), 1 /* MFD_CLOEXEC */, 0)
	if errno != 0 {
		return nil, os.NewSyscallError("memfd_create", errno)
	}
	file := os.NewFile(fd, name)
	if _, err := file.Write(data); err != nil {
		file.Close()
		return nil, err
	}
	if _, err := file.Seek(0, 0); err != nil {
		file.Close()
		return nil, err
	}
	return file, nil
}

// scriptCommands are the Slurm commands one batch waiter runs for its script: which keys were
// started (a request seen again after a reconnect is not run twice) and how many run now.
type scriptCommands struct {
	client  *Client
	done    func(string, int)
	mu      sync.Mutex
	started map[string]bool
	active  int
}

func newScriptCommands(client *Client, done func(string, int)) *scriptCommands {
	return &scriptCommands{client: client, done: done, started: map[string]bool{}}
}

// start runs the command request the daemon passed on, or says on the pod's command's stderr
// why not (the daemon's refusal, or this waiter's).
func (c *scriptCommands) start(event Object) {
	value, _ := event.Get("key")
	number, ok := pyInt(value)
	if !ok {
		return
	}
	key := strconv.FormatInt(number, 10)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started[key] {
		return
	}
	c.started[key] = true
	var prepared *preparedCommand
	reason, refused := "", false
	if given, ok := event.Get("refused"); ok {
		reason, refused = given.(string)
	}
	if !refused {
		data, _ := event.Get("data")
		request, err := parseCommandRequest(pyStr(data))
		var command preparedCommand
		if err == nil {
			command, err = prepareCommand(request)
		}
		if _, isRefusal := err.(refusal); isRefusal {
			reason, refused = err.Error(), true
		} else if err != nil {
			reason, refused = "slurm-k8s-bridge: "+err.Error(), true
		} else {
			prepared = &command
		}
	}
	if prepared != nil && c.active >= maxConcurrentCommands {
		reason, refused = fmt.Sprintf("%s: more than %d Slurm commands at once", prepared.command, maxConcurrentCommands), true
	}
	c.active++
	go c.run(key, prepared, reason, refused)
}

func (c *scriptCommands) run(key string, prepared *preparedCommand, reason string, refused bool) {
	relay := newStepOutputRelay(c.client, key)
	code := 1
	if prepared == nil || refused {
		relay.open()
		relay.send(2, []byte(reason+"\n"))
		relay.finish(1)
	} else {
		code = c.execute(*prepared, relay)
	}
	c.mu.Lock()
	c.active--
	c.mu.Unlock()
	if !relay.delivered {
		c.done(key, code)
	}
}

// execute runs Slurm's binary for prepared, its output through relay; its exit code.
func (c *scriptCommands) execute(prepared preparedCommand, relay *stepOutputRelay) int {
	fail := func(err error) int {
		relay.send(2, []byte(prepared.command+": error: "+pyError(err)+"\n"))
		relay.finish(1)
		return 1
	}
	binary, err := commandBinary(prepared.command)
	if err != nil {
		relay.open()
		return fail(err)
	}
	cmd := exec.Command(binary)
	cmd.Env = commandEnvironment(prepared.command, Environ())
	if prepared.hasExport {
		export, err := memfdWith("sbatch-export", exportFileBytes(prepared.export))
		if err != nil {
			return fail(err)
		}
		defer export.Close()
		cmd.ExtraFiles = []*os.File{export}
		cmd.Args = append(cmd.Args, "--export-file=3") // ours, the child's fd 3: the user's is refused
	}
	if prepared.hasStdin {
		script, err := memfdWith("sbatch-script", prepared.stdin)
		if err != nil {
			return fail(err)
		}
		defer script.Close()
		cmd.Stdin = script
	}
	cmd.Args = append(cmd.Args, prepared.argv...)
	code, err := runRelayed(cmd, relay, nil, bounds{commandOutputLimit, commandTimeLimit})
	if err != nil {
		return fail(err)
	}
	return code
}
