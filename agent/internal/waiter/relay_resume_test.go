package waiter

import (
	"bufio"
	"encoding/binary"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// daemonFrame is one output frame as a daemon reads it off the stream (its signature not checked).
type daemonFrame struct {
	fd   byte
	data string
}

func readDaemonFrame(t *testing.T, reader *bufio.Reader) daemonFrame {
	raw, err := readChunk(reader)
	if err != nil || len(raw) < 5 {
		t.Errorf("a frame: %v (%d bytes)", err, len(raw))
		return daemonFrame{}
	}
	n := binary.BigEndian.Uint32(raw[1:5])
	return daemonFrame{raw[0], string(raw[5 : 5+n])}
}

func answerChunk(text string) string {
	return strconv.FormatInt(int64(len(text)), 16) + "\r\n" + text + "\r\n"
}

// acceptStream takes one step-output stream on listener as a daemon does: the request's head, the
// header chunk (sent back on headers, if any), then the answer's head and {"accepted": true}.
func acceptStream(listener net.Listener, headers chan<- string) (net.Conn, *bufio.Reader) {
	conn, err := listener.Accept()
	if err != nil {
		return nil, nil
	}
	reader := bufio.NewReader(conn)
	for line, err := reader.ReadString('\n'); err == nil && line != "\r\n"; line, err = reader.ReadString('\n') {
	}
	header, _ := readChunk(reader)
	if headers != nil {
		headers <- string(header)
	}
	_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + answerChunk(`{"accepted": true}`)))
	return conn, reader
}

// restartingDaemon is killed once the first two frames have come (the script's srun wrote only
// the first: the second was in flight); the next daemon says so as the stream opens again, takes
// the rest and the end, and says the script's srun took them. What each daemon read and the
// headers are sent back on the channel.
func restartingDaemon(t *testing.T, seen chan<- []daemonFrame, headers chan<- string) URL {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	open := func() (net.Conn, *bufio.Reader) { return acceptStream(listener, headers) }
	go func() {
		conn, reader := open()
		if conn == nil {
			return
		}
		first := []daemonFrame{readDaemonFrame(t, reader), readDaemonFrame(t, reader)}
		_, _ = conn.Write([]byte(answerChunk(`{"delivered": 1}`)))
		conn.Close()
		seen <- first
		conn, reader = open()
		if conn == nil {
			return
		}
		_, _ = conn.Write([]byte(answerChunk(`{"from": 1}`)))
		var rest []daemonFrame
		for frame := readDaemonFrame(t, reader); ; frame = readDaemonFrame(t, reader) {
			rest = append(rest, frame)
			if frame.fd == 0 {
				break
			}
		}
		_, _ = conn.Write([]byte(answerChunk(`{"done": true}`)))
		conn.Close()
		seen <- rest
	}()
	return URL{"http", "127.0.0.1", listener.Addr().(*net.TCPAddr).Port}
}

func TestAStreamGoesOnWithTheNextDaemonFromWhereTheScriptsSrunStands(t *testing.T) {
	withCatMunge(t)
	seen, headers := make(chan []daemonFrame, 2), make(chan string, 2)
	relay := newStepOutputRelay(&Client{URL: restartingDaemon(t, seen, headers), JobID: testJobID}, "7")
	relay.run = 2
	code, said := relayedRun(t, relay, "echo one; sleep 0.2; echo two; sleep 0.5; echo three; echo four >&2; exit 5")
	if code != 5 || !relay.delivered {
		t.Fatalf("code %d, delivered %v", code, relay.delivered)
	}
	if said != "" {
		t.Fatalf("the job's files got %q: nothing was lost", said)
	}
	first, rest := <-seen, <-seen
	expectEqual(t, "the first daemon's frames", first, []daemonFrame{{1, "one\n"}, {1, "two\n"}})
	// Within a stream the order is srun's; between its stdout and stderr it is the pipes' race.
	var out, err []daemonFrame
	for _, frame := range rest {
		if frame.fd == 2 {
			err = append(err, frame)
		} else {
			out = append(out, frame)
		}
	}
	expectEqual(t, "the next daemon's stdout and end", out, []daemonFrame{{1, "two\n"}, {1, "three\n"}, {0, "5"}})
	expectEqual(t, "its stderr", err, []daemonFrame{{2, "four\n"}})
	for range 2 {
		if header := <-headers; !strings.Contains(header, `"resumable": true`) || !strings.Contains(header, `"run": 2`) {
			t.Fatalf("header %q", header)
		}
	}
}

// goneAfterRestartDaemon dies after the first frame; the next daemon finds the script's srun gone
// (killed while no daemon ran) and says so as the stream opens.
func goneAfterRestartDaemon(t *testing.T) URL {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	open := func() (net.Conn, *bufio.Reader) { return acceptStream(listener, nil) }
	go func() {
		conn, reader := open()
		if conn == nil {
			return
		}
		readDaemonFrame(t, reader)
		conn.Close()
		for {
			conn, _ := open()
			if conn == nil {
				return
			}
			_, _ = conn.Write([]byte(answerChunk(`{"gone": "the script's srun is gone"}`)))
			conn.Close()
		}
	}()
	return URL{"http", "127.0.0.1", listener.Addr().(*net.TCPAddr).Port}
}

func TestAStreamWhoseScriptsSrunWentMeanwhileEndsTheStep(t *testing.T) {
	withCatMunge(t)
	relay := newStepOutputRelay(&Client{URL: goneAfterRestartDaemon(t), JobID: testJobID}, "7")
	relay.run = 0
	started := time.Now()
	code, said := relayedRun(t, relay, "echo first; sleep 0.5; echo second; exec sleep 30")
	if !relay.gone || relay.delivered {
		t.Fatalf("gone %v, delivered %v", relay.gone, relay.delivered)
	}
	if took := time.Since(started); took > 20*time.Second {
		t.Fatalf("Slurm's srun ran %v: it is ended when the script's srun is gone", took)
	}
	if code == 0 || strings.Contains(said, "may be missing") {
		t.Fatalf("code %d, the job's files got %q", code, said)
	}
}
