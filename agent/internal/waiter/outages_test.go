package waiter

// The waiter's timeouts, with shorter stand-ins for the real ones (tests/unit/test_outages_answer_
// 503_and_the_waiter_retries.py drives these with `go test -run` and checks the real values
// through TestTimeoutConstantsDump).

import (
	"bufio"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestASilentAttachIsDroppedAndAttachedAgain(t *testing.T) {
	saved := streamTimeout
	streamTimeout = 300 * time.Millisecond
	t.Cleanup(func() { streamTimeout = saved })
	daemon := &signalDaemon{streams: [][]string{{silence}, {exitLine}}}
	job := waiterFor(t, daemon)

	started := time.Now()
	code := 0
	said := stderrOf(t, func() { code = job.Run() })

	expectEqual(t, "code", code, 0)
	expectEqual(t, "calls", daemon.actions(), []string{"attach", "attach"})
	expectEqual(t, "what the job's stderr got", said, "")
	if elapsed := time.Since(started); elapsed < streamTimeout || elapsed > 10*time.Second {
		t.Fatalf("attached again after %v, the timeout being %v", elapsed, streamTimeout)
	}
}

// A munge that hangs on its first call (`first`: how), then answers as withFakeMunge's does.
func withMungeHangingOnce(t *testing.T, first string) string {
	directory := t.TempDir()
	trustFakesIn(t, directory)
	calls := filepath.Join(directory, "calls")
	munge := filepath.Join(directory, "munge")
	writeExecutable(t, munge, "#!/bin/sh\necho call >> "+calls+"\n"+
		"if [ \"$(wc -l < "+calls+")\" = 1 ]; then "+first+"; fi\n"+
		"printf 'MUNGE:'\nexec cat\n")
	saved, savedTimeout := MungePaths, mungeTimeout
	MungePaths, mungeTimeout = []string{munge}, 300*time.Millisecond
	t.Cleanup(func() { MungePaths, mungeTimeout = saved, savedTimeout })
	return calls
}

// munge hangs on the waiter's first call (`first`: how): the waiter takes it for an outage and
// asks again, and its job ends as the daemon says.
func expectMungeAskedAgain(t *testing.T, first string) {
	daemon := &signalDaemon{streams: [][]string{{`{"type": "exit", "code": 4, "signal": null}` + "\n"}}}
	job := waiterFor(t, daemon)
	calls := withMungeHangingOnce(t, first) // after waiterFor's fake munge, in its place

	started := time.Now()
	code := 0
	said := stderrOf(t, func() { code = job.Run() })

	expectEqual(t, "code", code, 4)
	expectEqual(t, "calls", daemon.actions(), []string{"attach"})
	expectEqual(t, "what the job's stderr got", said, "")
	expectEqual(t, "munge's calls", fileText(t, calls), "call\ncall\n")
	// The timeout, then at most the WaitDelay (1 s) given to a child holding munge's output.
	if elapsed := time.Since(started); elapsed < mungeTimeout || elapsed > mungeTimeout+5*time.Second {
		t.Fatalf("asked again after %v, the timeout being %v", elapsed, mungeTimeout)
	}
}

// bench-scale on 1,000 nodes (load 146): munge took over 10 s once, and the waiter's job FAILED
// 1:0 without a word. A munge that does not answer in time is an outage: the waiter asks again.
func TestAMungeThatTimesOutIsAnOutageTheWaiterWaitsOut(t *testing.T) {
	// Hung as one process (exec: as munge itself would, no child left holding its output).
	expectMungeAskedAgain(t, "exec sleep 30")
}

// Killed at the timeout, a munge whose child still holds its output: the waiter does not wait
// for that child (it once waited the child's 30 s), it asks munge again.
func TestAHungMungeIsGivenUpOnEvenIfAChildHoldsItsOutput(t *testing.T) {
	expectMungeAskedAgain(t, "sleep 30; exit 0")
}

// The real timeouts, for the Python test: written as JSON to WAITER_TIMEOUT_CONSTANTS_OUT.
func TestTimeoutConstantsDump(t *testing.T) {
	writeJSON(t, outputOr(t, "WAITER_TIMEOUT_CONSTANTS_OUT", "timeouts.json"), map[string]any{
		"stream_timeout_s": streamTimeout.Seconds(), "munge_timeout_s": mungeTimeout.Seconds()})
}

// A munge that counts its calls in the returned file, then answers as withFakeMunge's does.
func withCountingMunge(t *testing.T) string {
	directory := t.TempDir()
	calls := filepath.Join(directory, "calls")
	munge := filepath.Join(directory, "munge")
	writeExecutable(t, munge, "#!/bin/sh\necho call >> "+calls+"\nprintf 'MUNGE:'\nexec cat\n")
	trustFakesIn(t, directory)
	saved := MungePaths
	MungePaths = []string{munge}
	t.Cleanup(func() { MungePaths = saved })
	return calls
}

// A port nothing listens on: one that was just listened on and closed.
func closedPort(t *testing.T) int {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := listener.Addr().(*net.TCPAddr).Port
	listener.Close()
	return port
}

// While the daemon is down, a retry costs no munge process: 1,000 waiters on one host retrying
// every few seconds once ran munge 200 times a second and starved it (bench/hold.py, 2026-12-06).
func TestARequestToADaemonThatIsDownRunsNoMunge(t *testing.T) {
	calls := withCountingMunge(t)
	client := &Client{URL: URL{"http", "127.0.0.1", closedPort(t)}, JobID: testJobID}

	_, err := client.Post("/v1/jobs/42/end", []byte("{}"), time.Second)
	if err == nil {
		t.Fatal("a post to a closed port succeeded")
	}
	relay := &stepOutputRelay{client: client}
	expectEqual(t, "the stream's status", relay.tryOpen(), 0)
	expectEqual(t, "srun --pty's exit code", runTerminalTask(client, "/v1/jobs/42/steps/0/terminal", Object{}), 1)

	if _, err := os.Stat(calls); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("munge ran for a daemon that is down: %q", fileText(t, calls))
	}
}

// Once the daemon answers, the request carries the credential as before.
func TestARequestToADaemonThatIsUpStillCarriesItsCredential(t *testing.T) {
	calls := withCountingMunge(t)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	got := make(chan string, 1)
	go func() {
		conn, err := listener.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer conn.Close()
		reader, head := bufio.NewReader(conn), ""
		for {
			line, err := reader.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
			head += line
		}
		_, _ = conn.Write([]byte("HTTP/1.0 200 OK\r\n\r\n"))
		got <- head
	}()
	client := &Client{URL: URL{"http", "127.0.0.1", listener.Addr().(*net.TCPAddr).Port}, JobID: testJobID}

	if err := client.PostClose("/v1/jobs/42/end", []byte("{}"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	head := <-got
	if !strings.HasPrefix(head, "POST /v1/jobs/42/end HTTP/1.0\r\n") || !strings.Contains(head, "\r\nX-Munge-Credential: MUNGE:") {
		t.Fatalf("the request's head: %q", head)
	}
	expectEqual(t, "munge's calls", fileText(t, calls), "call\n")
}
