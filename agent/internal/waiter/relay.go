package waiter

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The step-output relay: what Slurm's srun for a step of the script
// writes goes, in frames signed under a key its munge credential carries, to the daemon, which
// hands it to the script's srun in the pod. Should the daemon not take it, srun's output goes to
// the job's -o/-e files, and its exit code by step-done.

const (
	streamAnswerTimeout = 60 * time.Second
	streamEndTimeout    = 300 * time.Second
)

// How often, and after what pause, opening the stream is tried: vars only so that tests can
// see a stream that never opens without waiting for it.
var (
	streamOpenAttempts = 30
	streamOpenDelay    = reconnectDelay
)

// chunk is data as one chunk of a chunked HTTP/1.1 body.
func chunk(data []byte) []byte {
	return append(append([]byte(strconv.FormatInt(int64(len(data)), 16)+"\r\n"), data...), '\r', '\n')
}

// readChunk reads one chunk of a chunked body.
func readChunk(reader *bufio.Reader) ([]byte, error) {
	line, err := reader.ReadString('\n')
	if err != nil && line == "" {
		return nil, err
	}
	text := strings.TrimSpace(line)
	if text == "" {
		text = "0"
	}
	size, parseErr := strconv.ParseInt(text, 16, 64)
	if parseErr != nil || size < 0 {
		return nil, fmt.Errorf("bad chunk from the bridge: %s", pyBytesRepr([]byte(text[:min(len(text), 40)])))
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(reader, data); err != nil {
		return nil, fmt.Errorf("the bridge's answer was cut off")
	}
	_, _ = reader.ReadString('\n')
	return data, nil
}

// readAnswerHead reads an answer's status and its first chunk (or its whole body when it is
// not chunked, up to 64 KiB).
func readAnswerHead(reader *bufio.Reader) (int, []byte, error) {
	status, err := readStatus(reader)
	if err != nil {
		return 0, nil, err
	}
	chunked, length := false, 0
	for {
		line, err := reader.ReadString('\n')
		if line == "\r\n" || line == "\n" || line == "" {
			if err != nil && line == "" && err != io.EOF {
				return 0, nil, err
			}
			break
		}
		name, value, _ := strings.Cut(line, ":")
		name = strings.ToLower(strings.TrimSpace(name))
		chunked = chunked || name == "transfer-encoding" && strings.Contains(strings.ToLower(value), "chunked")
		if n, err := strconv.Atoi(strings.TrimSpace(value)); name == "content-length" && err == nil && n >= 0 {
			length = min(n, 65536)
		}
	}
	if chunked {
		first, err := readChunk(reader)
		return status, first, err
	}
	body := make([]byte, length)
	n, _ := io.ReadFull(reader, body)
	return status, body[:n], nil
}

// jsonObject is the JSON object the daemon answered, or an empty one for anything else.
func jsonObject(data []byte) Object {
	value, err := Loads(data)
	if obj, ok := value.(Object); ok && err == nil {
		return obj
	}
	return Object{}
}

// stepOutputRelay is one step's output stream to the daemon. Each frame is kept until the
// script's srun has written it (the daemon passes on its count: {"delivered": N}); should the
// stream break (the daemon killed, restarted, failed over), the next daemon is asked to go on,
// and the frames from the count the script's srun gives ({"from": N}) are sent again.
type stepOutputRelay struct {
	client    *Client
	key       string
	run       int64 // the job's run, named when going on with another daemon (-1: unknown)
	conn      *timedConn
	answer    chan []byte // the daemon's last word, whenever it comes: early, the stream is over
	from      chan int64  // where the script's srun stands, as a resumed stream opens
	streamKey []byte
	seq       uint64 // this connection's frames, for their signatures
	kept      []keptFrame
	keptBytes int
	next      int64        // the index of the next frame of the step
	written   atomic.Int64 // frames the script's srun wrote
	delivered bool
	gone      bool
	broke     bool // the stream broke and no daemon went on with it
	toldLost  bool
	// termedBySlurm: slurmstepd has just sent the process a TERM itself (nil: never).
	termedBySlurm func() bool
}

type keptFrame struct {
	index int64
	fd    byte
	data  []byte
}

const (
	// Frames not yet written by the script's srun that a relay keeps: then srun's output waits
	// in its pipes, as it waits natively for a slow reader.
	relayWindow  = 4 << 20
	relayAckPoll = 20 * time.Millisecond
)

// How long a relay whose stream broke asks another daemon to go on: a var for tests.
var relayResumeFor = 3 * time.Minute

func newStepOutputRelay(client *Client, key string) *stepOutputRelay {
	return &stepOutputRelay{client: client, key: key, run: -1}
}

func (r *stepOutputRelay) path() string {
	return "/v1/jobs/" + strconv.FormatInt(r.client.JobID, 10) + "/step-output"
}

func (r *stepOutputRelay) header() []byte {
	fields := Object{{"key", r.key}, {"resumable", true}}
	if r.run >= 0 {
		fields = append(fields, Field{"run", r.run})
	}
	return append(Dumps(fields), '\n')
}

// open starts the stream; on failure output is written locally. A daemon that is busy or
// restarting (5xx) is asked again for a while: srun's output waits in its pipes meanwhile.
func (r *stepOutputRelay) open() {
	for attempt := range streamOpenAttempts {
		status := r.tryOpen()
		if status == 200 && r.conn != nil {
			return
		}
		if status >= 400 && status < 500 {
			return // refused for good (an older daemon, the step unknown): written here
		}
		time.Sleep(streamOpenDelay(attempt))
	}
}

func (r *stepOutputRelay) tryOpen() int {
	path, header := r.path(), r.header()
	r.streamKey = make([]byte, 32)
	_, _ = rand.Read(r.streamKey)
	r.seq = 0
	// Connected first, as Client.Post is: a retry against a daemon that is down costs no munge.
	munge, err := mungeProgram()
	if err != nil {
		return 0
	}
	conn, err := Connect(r.client.URL, streamAnswerTimeout, r.client.CAFile)
	if err != nil {
		return 0
	}
	credential, err := mungeCredentialWith(munge, RequestDigest("POST", path, r.client.JobID, header)+" "+hex.EncodeToString(r.streamKey))
	if err != nil {
		conn.Close()
		return 0
	}
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"+
		"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"+
		"X-Munge-Credential: %s\r\n\r\n", path, HostHeader(r.client.URL.Host, r.client.URL.Port), credential)
	if _, err := conn.Write(append([]byte(head), chunk(header)...)); err != nil {
		conn.Close()
		return 0
	}
	reader := bufio.NewReader(conn)
	status, first, err := readAnswerHead(reader)
	accepted, _ := jsonObject(first).Get("accepted")
	if err != nil || status != 200 || accepted != true {
		conn.Close()
		return status
	}
	conn.timeout = 0 // a slow reader in the pod holds srun, as natively
	answer, from := make(chan []byte, 1), make(chan int64, 1)
	r.conn, r.answer, r.from = conn, answer, from
	go r.readNotes(reader, answer, from)
	return 200
}

// readNotes reads what the daemon says on one stream: where the script's srun stands, what it
// wrote, then the last word (nil: the connection ended without one).
func (r *stepOutputRelay) readNotes(reader *bufio.Reader, answer chan<- []byte, from chan<- int64) {
	for {
		data, err := readChunk(reader)
		if err != nil {
			answer <- nil
			return
		}
		note := jsonObject(data)
		if n, ok := note.Get("from"); ok {
			if count, ok := n.(int64); ok {
				select {
				case from <- count:
				default:
				}
			}
			continue
		}
		if n, ok := note.Get("delivered"); ok {
			if count, ok := n.(int64); ok && count > r.written.Load() {
				r.written.Store(count)
			}
			continue
		}
		answer <- data
		return
	}
}

// send relays srun's output; once the script's srun is gone, what Slurm's srun still says goes
// to the job's files, where native srun's stderr would be.
func (r *stepOutputRelay) send(fd int, data []byte) {
	if r.conn == nil || r.answered() {
		_ = WriteAll(fd, data)
		return
	}
	for start := 0; start < len(data); start += MaxOutputFrame {
		part := data[start:min(len(data), start+MaxOutputFrame)]
		if !r.waitForRoom() || !r.relay(byte(fd), append([]byte(nil), part...)) {
			if r.broke {
				r.sayMaybeLost()
			}
			_ = WriteAll(fd, data[start:])
			return
		}
	}
}

// relay keeps a frame and sends it; false when the stream broke and no daemon went on with it.
func (r *stepOutputRelay) relay(fd byte, data []byte) bool {
	frame := keptFrame{r.next, fd, data}
	r.next++
	r.kept = append(r.kept, frame)
	r.keptBytes += len(data)
	if r.write(frame) {
		return true
	}
	return r.resume()
}

func (r *stepOutputRelay) write(frame keptFrame) bool {
	if _, err := r.conn.Write(chunk(SignOutputFrame(r.streamKey, r.seq, frame.fd, frame.data))); err != nil {
		return false
	}
	r.seq++
	return true
}

// forget drops the frames the script's srun has written.
func (r *stepOutputRelay) forget() {
	written, n := r.written.Load(), 0
	for n < len(r.kept) && r.kept[n].index < written {
		r.keptBytes -= len(r.kept[n].data)
		n++
	}
	r.kept = r.kept[n:]
}

// waitForRoom holds srun's output while relayWindow bytes wait for the script's srun; false when
// the stream ended meanwhile and no daemon went on with it.
func (r *stepOutputRelay) waitForRoom() bool {
	for r.forget(); r.keptBytes >= relayWindow; r.forget() {
		select {
		case data := <-r.answer:
			if !r.heard(data) {
				return false
			}
		case <-time.After(relayAckPoll):
		}
	}
	return true
}

// heard takes the daemon's last word; true when the stream goes on (with the next daemon).
func (r *stepOutputRelay) heard(data []byte) bool {
	if data == nil { // the connection ended without a word: the daemon went away
		return r.resume()
	}
	_, r.gone = jsonObject(data).Get("gone")
	r.drop()
	return false
}

// resume asks daemons, for relayResumeFor, to go on with the stream from where the script's
// srun stands, and sends the frames it has not written again; false when none did (the rest
// is written to the job's files).
func (r *stepOutputRelay) resume() bool {
	r.drop()
	deadline := time.Now().Add(relayResumeFor)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		status := r.tryOpen()
		if status >= 400 && status < 500 {
			r.broke = true
			return false
		}
		if status == 200 && r.conn != nil {
			ok, final := r.sendKeptFrom()
			if ok {
				return true
			}
			if final { // the daemon's last word (the script's srun is gone): over, nothing lost
				r.drop()
				return false
			}
		}
		r.drop()
		time.Sleep(streamOpenDelay(attempt))
	}
	r.broke = true
	return false
}

// sendKeptFrom waits for where the script's srun stands and sends the frames from there; ok, or
// final when the daemon's answer was its last word (then r.gone says whether srun is gone).
func (r *stepOutputRelay) sendKeptFrom() (ok, final bool) {
	select {
	case count := <-r.from:
		if count > r.written.Load() {
			r.written.Store(count)
		}
		r.forget()
		if len(r.kept) > 0 && r.kept[0].index != r.written.Load() || count > r.next {
			return false, false // frames it has not written were let go: cannot go on
		}
		for _, frame := range r.kept {
			if !r.write(frame) {
				return false, false
			}
		}
		return true, false
	case data := <-r.answer:
		if data == nil {
			return false, false
		}
		_, r.gone = jsonObject(data).Get("gone")
		return false, true
	case <-time.After(streamAnswerTimeout):
		return false, false
	}
}

// finish sends the end frame (srun's exit code) and waits for the daemon's word that the
// script's srun took it; should it not come, step-done tells the code instead.
func (r *stepOutputRelay) finish(code int) {
	if r.conn == nil || r.answered() {
		return
	}
	heard := false
	if r.relay(0, []byte(strconv.Itoa(code))) && r.conn != nil {
		_, _ = r.conn.Write([]byte("0\r\n\r\n"))
		for waiting := true; waiting; {
			select {
			case data := <-r.answer:
				if data == nil {
					if r.resume() {
						_, _ = r.conn.Write([]byte("0\r\n\r\n"))
						continue
					}
					// Gone: the script's srun took the end frame and went (step-done is harmless).
					heard, waiting = r.gone, false
					continue
				}
				done, _ := jsonObject(data).Get("done")
				r.delivered, heard, waiting = done == true, true, false
			case <-time.After(streamEndTimeout):
				waiting = false
			}
		}
	}
	r.drop()
	if !heard {
		r.sayMaybeLost()
	}
}

// sayMaybeLost tells the job's files, where the user looks, that the relay broke off and no
// daemon went on with it: some of what srun wrote may not have reached the script's srun.
func (r *stepOutputRelay) sayMaybeLost() {
	if r.next > 0 && !r.toldLost {
		r.toldLost = true
		_ = WriteAll(2, []byte("slurm-k8s-bridge: the bridge went away while it relayed this step's output: "+
			"some of what srun wrote may be missing\n"))
	}
}

// answered: the daemon spoke before the end (the script's srun is gone, or the pod could not
// be reached); the stream is over. A stream that broke goes on with the next daemon.
func (r *stepOutputRelay) answered() bool {
	if r.conn == nil {
		return false
	}
	select {
	case data := <-r.answer:
		if r.heard(data) {
			return false
		}
		if r.broke {
			r.sayMaybeLost()
		}
		return true
	default:
		return false
	}
}

func (r *stepOutputRelay) drop() {
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
}

// bounds are what a Slurm command may take: output bytes and time; 0, no bound.
type bounds struct {
	output  int
	seconds time.Duration
}

type piece struct {
	fd   int
	data []byte
}

// runRelayed runs Slurm's srun (or one of its commands) with its stdout and stderr through the
// relay; its exit code, as a shell reports it (128+N when a signal ended it).
func runRelayed(cmd *exec.Cmd, relay *stepOutputRelay, started func(*exec.Cmd), limits bounds) (int, error) {
	cmd.Dir = "/"
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	if err := startUnblocked(cmd); err != nil {
		return 0, err
	}
	var deadline time.Time
	if limits.seconds > 0 {
		deadline = time.Now().Add(limits.seconds)
	}
	if started != nil {
		started(cmd)
	}
	pieces := make(chan piece, 32) // holds srun when full
	for fd, pipe := range map[int]io.Reader{1: stdout, 2: stderr} {
		go func() {
			buffer := make([]byte, 65536)
			for {
				n, err := pipe.Read(buffer)
				if n > 0 {
					pieces <- piece{fd, append([]byte(nil), buffer[:n]...)}
				}
				if err != nil {
					pieces <- piece{fd, nil}
					return
				}
			}
		}()
	}
	relay.open()
	open, sent, terminated := 2, 0, false
	for open > 0 {
		// Whatever the relay meets, srun's pipes are drained to the end and srun is waited for.
		select {
		case p := <-pieces:
			switch {
			case p.data == nil:
				open--
				continue
			case limits.output > 0 && sent+len(p.data) > limits.output:
				if !terminated {
					relay.send(p.fd, p.data[:max(0, limits.output-sent)])
					relay.send(2, []byte(fmt.Sprintf("slurm-k8s-bridge: output beyond %d bytes: the command was stopped\n", limits.output)))
					_ = cmd.Process.Kill()
					terminated = true
				}
				continue
			}
			sent += len(p.data)
			relay.send(p.fd, p.data)
		case <-time.After(time.Second):
			relay.answered()
		}
		if !deadline.IsZero() && time.Now().After(deadline) && !terminated {
			relay.send(2, []byte(fmt.Sprintf("slurm-k8s-bridge: the command ran %.0f s: stopped\n", limits.seconds.Seconds())))
			_ = cmd.Process.Signal(syscall.SIGTERM)
			terminated = true
		}
		if relay.gone && !terminated {
			// The script's srun is gone: so is the step, as natively. Not twice: the script's srun
			// goes with a cancel, whose TERM slurmstepd sent this srun already.
			if relay.termedBySlurm == nil || !relay.termedBySlurm() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			terminated = true
		}
	}
	_ = cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if status, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		code = 128 + int(status.Signal())
	}
	relay.finish(code)
	return code, nil
}
