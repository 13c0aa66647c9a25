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

// stepOutputRelay is one step's output stream to the daemon.
type stepOutputRelay struct {
	client    *Client
	key       string
	conn      *timedConn
	answer    chan []byte // the daemon's answer, whenever it comes: early, the stream is over
	streamKey []byte
	seq       uint64
	delivered bool
	gone      bool
	toldLost  bool
	// termedBySlurm: slurmstepd has just sent the process a TERM itself (nil: never).
	termedBySlurm func() bool
}

func newStepOutputRelay(client *Client, key string) *stepOutputRelay {
	return &stepOutputRelay{client: client, key: key}
}

// open starts the stream; on failure output is written locally. A daemon that is busy or
// restarting (5xx) is asked again for a while: srun's output waits in its pipes meanwhile.
func (r *stepOutputRelay) open() {
	path := "/v1/jobs/" + strconv.FormatInt(r.client.JobID, 10) + "/step-output"
	header := append(Dumps(Object{{"key", r.key}}), '\n')
	for attempt := range streamOpenAttempts {
		status := r.tryOpen(path, header)
		if status == 200 && r.conn != nil {
			return
		}
		if status >= 400 && status < 500 {
			return // refused for good (an older daemon, the step unknown): written here
		}
		time.Sleep(streamOpenDelay(attempt))
	}
}

func (r *stepOutputRelay) tryOpen(path string, header []byte) int {
	r.streamKey = make([]byte, 32)
	_, _ = rand.Read(r.streamKey)
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
	r.conn, r.answer = conn, make(chan []byte, 1)
	go func() {
		data, err := readChunk(reader)
		if err != nil {
			data = nil
		}
		r.answer <- data
	}()
	return 200
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
		if _, err := r.conn.Write(chunk(SignOutputFrame(r.streamKey, r.seq, byte(fd), part))); err != nil {
			r.drop()
			r.sayMaybeLost()
			_ = WriteAll(fd, data[start:])
			return
		}
		r.seq++
	}
}

// finish sends the end frame (srun's exit code) and waits for the daemon's word that the
// script's srun took it; should it not come, step-done tells the code instead.
func (r *stepOutputRelay) finish(code int) {
	if r.conn == nil || r.answered() {
		return
	}
	end := append(chunk(SignOutputFrame(r.streamKey, r.seq, 0, []byte(strconv.Itoa(code)))), "0\r\n\r\n"...)
	heard := false
	if _, err := r.conn.Write(end); err == nil {
		select {
		case data := <-r.answer:
			done, _ := jsonObject(data).Get("done")
			r.delivered, heard = done == true, data != nil
		case <-time.After(streamEndTimeout):
		}
	}
	r.drop()
	if !heard {
		r.sayMaybeLost()
	}
}

// sayMaybeLost tells the job's files, where the user looks, that the daemon went away (kill -9,
// a failover) with frames of this step's output it never confirmed: the kernel took them for a
// peer that was gone, and the script's srun may never have written them.
func (r *stepOutputRelay) sayMaybeLost() {
	if r.seq > 0 && !r.toldLost {
		r.toldLost = true
		_ = WriteAll(2, []byte("slurm-k8s-bridge: the bridge went away while it relayed this step's output: "+
			"some of what srun wrote may be missing\n"))
	}
}

// answered: the daemon spoke before the end (the script's srun is gone, or the pod could not
// be reached); the stream is over.
func (r *stepOutputRelay) answered() bool {
	if r.conn == nil {
		return false
	}
	select {
	case data := <-r.answer:
		_, r.gone = jsonObject(data).Get("gone")
		r.drop()
		if data == nil { // the connection ended without a word: the daemon died
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
