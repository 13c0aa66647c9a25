package waiter

import (
	"bufio"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dyingDaemon accepts one step-output stream, reads until the first output frame has come, and
// then closes the connection without a word, as a daemon killed with -9 does; no daemon follows.
func dyingDaemon(t *testing.T) URL {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	go func() {
		conn, err := listener.Accept()
		listener.Close() // no daemon comes back: asking again is refused
		if err != nil {
			return
		}
		reader := bufio.NewReader(conn)
		for line, err := reader.ReadString('\n'); err == nil && line != "\r\n"; line, err = reader.ReadString('\n') {
		}
		_, _ = readChunk(reader) // the header naming the step
		answer := `{"accepted": true}`
		_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(answer)), 16) + "\r\n" + answer + "\r\n"))
		_, _ = readChunk(reader) // srun's first output
		conn.Close()
	}()
	port := listener.Addr().(*net.TCPAddr).Port
	return URL{"http", "127.0.0.1", port}
}

func TestADaemonThatDiesMidStreamIsToldInTheJobsFiles(t *testing.T) {
	saved := relayResumeFor
	t.Cleanup(func() { relayResumeFor = saved })
	relayResumeFor = 500 * time.Millisecond
	withCatMunge(t)
	relay := newStepOutputRelay(&Client{URL: dyingDaemon(t), JobID: testJobID}, "7")
	code, said := relayedRun(t, relay, "echo first; sleep 0.3; echo second; sleep 0.3; echo third >&2; exit 1")
	if code != 1 || relay.delivered {
		t.Fatalf("code %d, delivered %v", code, relay.delivered)
	}
	note := "the bridge went away while it relayed this step's output"
	if strings.Count(said, note) != 1 {
		t.Fatalf("the job's stderr got %q, want the note once", said)
	}
}

// withCatMunge makes munge a cat: the credential is the payload.
func withCatMunge(t *testing.T) {
	munge := filepath.Join(t.TempDir(), "munge")
	writeExecutable(t, munge, "#!/bin/sh\nexec cat\n")
	savedMunge := MungePaths
	t.Cleanup(func() { MungePaths = savedMunge })
	MungePaths = []string{munge}
	trustFakesIn(t, filepath.Dir(munge))
}

// relayedRun runs script as Slurm's srun through relay; its code and what the job's stderr got.
func relayedRun(t *testing.T, relay *stepOutputRelay, script string) (int, string) {
	var code int
	said := stderrOf(t, func() {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		var err error
		if code, err = runRelayed(cmd, relay, nil, bounds{}); err != nil {
			t.Error(err)
		}
	})
	return code, said
}
