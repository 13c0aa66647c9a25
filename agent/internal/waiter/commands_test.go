package waiter

// Slurm's commands for the script, on the waiter's side (commands.go), checked from tests/unit/
// test_slurm_commands_in_the_pod_run_only_what_is_allowed.py with `go test -run`: what it checked
// of the retired Python waiter's commands, now of this one.

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTheBinarysEnvironmentIsFixedWhateverTheJobExported(t *testing.T) {
	environ := Object{{"LD_PRELOAD", "/tmp/evil.so"}, {"SQUEUE_FORMAT", "%Z"}, {"SBATCH_GET_USER_ENV", "1"},
		{"PATH", "/home/alice/bin"}, {"SLURM_CONF", "/home/alice/slurm.conf"}, {"SLURM_JOB_NODELIST", "k[1-2]"},
		{"SLURM_NODELIST", "k[1-2]"}}

	expectEqual(t, "squeue's", commandEnvironment("squeue", environ),
		[]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"})
	// `scontrol show hostnames` with no list reads SLURM_NODELIST (a PSI/J job's node file).
	scontrol := commandEnvironment("scontrol", environ)
	if !slices.Contains(scontrol, "SLURM_JOB_NODELIST=k[1-2]") || !slices.Contains(scontrol, "SLURM_NODELIST=k[1-2]") {
		t.Fatalf("scontrol's: %v", scontrol)
	}
}

// relayFrame is one frame of a step-output stream: its fd (0: the end, data the exit code).
type relayFrame struct {
	fd   int
	data string
}

// fakeStepOutput is the daemon's step-output endpoint: it accepts one stream, keeps its frames
// until the end frame, then answers {"done": done}.
type fakeStepOutput struct {
	url    URL
	mu     sync.Mutex
	frames []relayFrame
	ended  chan struct{}
}

func serveStepOutput(t *testing.T, done bool) *fakeStepOutput {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	server := &fakeStepOutput{url: URL{"http", "127.0.0.1", listener.Addr().(*net.TCPAddr).Port},
		ended: make(chan struct{})}
	go func() {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		reader := bufio.NewReader(conn)
		for {
			line, err := reader.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
		}
		if _, err := readChunk(reader); err != nil { // the stream's header: its key
			return
		}
		_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"))
		_, _ = conn.Write(chunk([]byte("{\"accepted\": true}\n")))
		for {
			frame, err := readChunk(reader)
			if err != nil || len(frame) < 5 {
				return
			}
			size := binary.BigEndian.Uint32(frame[1:5])
			server.mu.Lock()
			server.frames = append(server.frames, relayFrame{int(frame[0]), string(frame[5 : 5+size])})
			server.mu.Unlock()
			if frame[0] == 0 {
				break
			}
		}
		answer, _ := json.Marshal(map[string]bool{"done": done})
		_, _ = conn.Write(append(chunk(append(answer, '\n')), "0\r\n\r\n"...))
		close(server.ended)
		_, _ = io.Copy(io.Discard, reader)
	}()
	return server
}

// commandsAgainst are a waiter's Slurm commands relaying to server, each end it was not told of
// noted in done; waitIdle waits until none runs.
func commandsAgainst(t *testing.T, server *fakeStepOutput) (*scriptCommands, *[][2]string, func()) {
	withFakeMunge(t)
	var mu sync.Mutex
	done := [][2]string{}
	commands := newScriptCommands(&Client{URL: server.url, JobID: testJobID}, func(key string, code int) {
		mu.Lock()
		defer mu.Unlock()
		done = append(done, [2]string{key, strconv.Itoa(code)})
	})
	waitIdle := func() {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			commands.mu.Lock()
			active := commands.active
			commands.mu.Unlock()
			if active == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the command never ended")
			}
		}
	}
	return commands, &done, waitIdle
}

func commandEvent(t *testing.T, key string, request map[string]any) Object {
	data, err := json.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	number, _ := strconv.ParseInt(key, 10, 64)
	return Object{{"type", "command"}, {"key", number}, {"data", base64.StdEncoding.EncodeToString(data)}}
}

// withFakeSbatch has Slurm's binaries in a directory of the test's alone, with an sbatch that
// notes its argv, environment, stdin and fd 3 there.
func withFakeSbatch(t *testing.T) string {
	directory := t.TempDir()
	sbatch := "#!/bin/sh\n" +
		"d=" + directory + "\n" +
		"printf '%s\\n' \"$0\" \"$@\" >\"$d/argv\"\n" +
		"tr '\\0' '\\n' </proc/$$/environ >\"$d/env\"\n" +
		"cat >\"$d/stdin\"\n" +
		"cat <&3 >\"$d/export\"\n"
	writeExecutable(t, filepath.Join(directory, "sbatch"), sbatch)
	saved := slurmBinaryDirs
	slurmBinaryDirs = []string{directory}
	t.Cleanup(func() { slurmBinaryDirs = saved })
	trustFakesIn(t, directory)
	return directory
}

func fileText(t *testing.T, path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestTheWaiterRunsSlurmsBinaryWithTheScriptOnStdinAndTheExportOnAMemfd(t *testing.T) {
	directory := withFakeSbatch(t)
	server := serveStepOutput(t, true)
	commands, done, waitIdle := commandsAgainst(t, server)

	commands.start(commandEvent(t, "4", map[string]any{
		"key": "4", "command": "sbatch", "argv": []string{"--parsable", "job.sh"}, "cwd": "/w",
		"files": map[string]string{"job.sh": base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho hi\n"))},
		"env":   map[string]string{"A": "1"},
	}))
	waitIdle()

	argv := strings.Split(strings.TrimSuffix(fileText(t, filepath.Join(directory, "argv")), "\n"), "\n")
	expectEqual(t, "the binary", argv[0], filepath.Join(directory, "sbatch"))
	if !strings.HasPrefix(argv[1], "--export-file=") {
		t.Fatalf("argv %q", argv)
	}
	expectEqual(t, "the arguments", argv[2:], []string{"--chdir=/w", "--job-name=job.sh", "--parsable"})
	expectEqual(t, "stdin", fileText(t, filepath.Join(directory, "stdin")), "#!/bin/sh\necho hi\n")
	expectEqual(t, "the export", fileText(t, filepath.Join(directory, "export")), "A=1\x00")
	expectEqual(t, "the environment", fileText(t, filepath.Join(directory, "env")),
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin\nLC_ALL=C\n")
	<-server.ended
	expectEqual(t, "the frames", server.frames, []relayFrame{{0, "0"}})
	expectEqual(t, "ends told by step-done", *done, [][2]string{}) // the relay delivered the end
}

func TestTheWaiterChecksAgainAndRefusesWhatTheDaemonShouldNotHavePassed(t *testing.T) {
	directory := withFakeSbatch(t)
	server := serveStepOutput(t, false)
	commands, done, waitIdle := commandsAgainst(t, server)

	commands.start(commandEvent(t, "9", map[string]any{
		"key": "9", "command": "sbatch", "argv": []string{"--get-user-env", "x.sh"}, "cwd": "/w"}))
	waitIdle()

	if _, err := os.Stat(filepath.Join(directory, "argv")); !os.IsNotExist(err) {
		t.Fatalf("sbatch ran: %v", err)
	}
	<-server.ended
	if len(server.frames) == 0 || server.frames[0].fd != 2 ||
		!strings.Contains(server.frames[0].data, "--get-user-env is not allowed") {
		t.Fatalf("frames %v", server.frames)
	}
	expectEqual(t, "ends told by step-done", *done, [][2]string{{"9", "1"}})
}

func TestSlurmsBinariesAreFoundByAbsolutePathOnly(t *testing.T) {
	expectEqual(t, "where they are looked for", slurmBinaryDirs, []string{"/usr/bin", "/usr/local/bin", "/opt/slurm/bin"})
	evil, first, last := t.TempDir(), t.TempDir(), t.TempDir()
	for _, path := range []string{filepath.Join(evil, "squeue"), filepath.Join(evil, "sinfo"), filepath.Join(last, "squeue")} {
		writeExecutable(t, path, "#!/bin/sh\n")
	}
	t.Setenv("PATH", evil)
	saved := slurmBinaryDirs
	slurmBinaryDirs = []string{first, last}
	t.Cleanup(func() { slurmBinaryDirs = saved })
	trustFakesIn(t, first)
	trustFakesIn(t, last)

	found, err := commandBinary("squeue")
	expectEqual(t, "squeue", found, filepath.Join(last, "squeue"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := commandBinary("sinfo"); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("sinfo: %v", err)
	}
}
