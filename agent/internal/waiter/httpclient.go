package waiter

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// The waiter's HTTP client to the daemon: a POST over HTTP/1.0
// (or HTTPS) that carries a munge credential bound to the request, and the jittered backoff
// every part of the waiter retries with.

// DefaultAPIURL is where the daemon listens unless --api says otherwise.
const DefaultAPIURL = "http://127.0.0.1:8470"

const (
	reconnectBase  = 100 * time.Millisecond
	reconnectCap   = 5 * time.Second
	connectTimeout = 10 * time.Second
)

// DaemonError is an HTTP error status of the daemon's (5xx: retry; 4xx: refused for good).
type DaemonError struct {
	Status int
	Text   string
}

func (e *DaemonError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Text) }

// daemonStatus is the status of a DaemonError, or 0 for any other error.
func daemonStatus(err error) int {
	var daemon *DaemonError
	if errors.As(err, &daemon) {
		return daemon.Status
	}
	return 0
}

// reconnectDelay is a jittered exponential backoff: thousands of waiters must not retry in step.
func reconnectDelay(attempt int) time.Duration {
	jitter := 0.5 + float64(rand.IntN(65536))/65536
	delay := min(reconnectCap, reconnectBase<<min(attempt, 10))
	return time.Duration(float64(delay) * jitter)
}

// URL is the daemon's address: scheme, host (an IPv6 one without brackets) and port.
type URL struct {
	Scheme string
	Host   string
	Port   int
}

// SplitURL reads `http[s]://host[:port][/]` as the Python waiter does.
func SplitURL(raw string) (URL, error) {
	scheme, rest, found := strings.Cut(raw, "://")
	if found {
		scheme = strings.ToLower(scheme)
	} else {
		scheme, rest = "http", raw
	}
	rest = strings.TrimRight(rest, "/")
	var host, port string
	if strings.HasPrefix(rest, "[") {
		var after string
		host, after, _ = strings.Cut(rest[1:], "]")
		if strings.HasPrefix(after, ":") {
			port = after[1:]
		}
	} else if strings.Count(rest, ":") == 1 {
		host, port, _ = strings.Cut(rest, ":")
	} else {
		host = rest
	}
	if host == "" {
		host = "127.0.0.1"
	}
	number := 80
	if scheme == "https" {
		number = 443
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil {
			return URL{}, fmt.Errorf("invalid literal for int() with base 10: %s", pyRepr(port))
		}
		number = n
	}
	return URL{scheme, host, number}, nil
}

// HostHeader is the Host header's value: an IPv6 address in brackets, as in the URL.
func HostHeader(host string, port int) string {
	if strings.Contains(host, ":") {
		return fmt.Sprintf("[%s]:%d", host, port)
	}
	return fmt.Sprintf("%s:%d", host, port)
}

// timedConn gives every read and write its own timeout, as a Python socket's timeout does: a
// long stream may last for days, but no single read may wait longer than the timeout.
type timedConn struct {
	net.Conn
	timeout time.Duration
}

func (c *timedConn) Read(p []byte) (int, error) {
	if c.timeout > 0 {
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.timeout))
	} else {
		_ = c.Conn.SetReadDeadline(time.Time{})
	}
	return c.Conn.Read(p)
}

func (c *timedConn) Write(p []byte) (int, error) {
	if c.timeout > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
	} else {
		_ = c.Conn.SetWriteDeadline(time.Time{})
	}
	return c.Conn.Write(p)
}

// Connect opens a connection to the daemon, TLS when the URL is https://, with keepalives so
// that a long stream notices a peer that vanished without a FIN.
func Connect(url URL, timeout time.Duration, caFile string) (*timedConn, error) {
	dialer := net.Dialer{Timeout: timeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: 30 * time.Second, Interval: 10 * time.Second, Count: 6}}
	conn, err := dialer.Dial("tcp", net.JoinHostPort(url.Host, strconv.Itoa(url.Port)))
	if err != nil {
		return nil, err
	}
	if url.Scheme == "https" {
		config := &tls.Config{ServerName: url.Host, MinVersion: tls.VersionTLS12}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				conn.Close()
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				conn.Close()
				return nil, fmt.Errorf("no certificate in %s", caFile)
			}
			config.RootCAs = pool
		}
		secure := tls.Client(conn, config)
		_ = secure.SetDeadline(time.Now().Add(timeout))
		if err := secure.Handshake(); err != nil {
			conn.Close()
			return nil, err
		}
		_ = secure.SetDeadline(time.Time{})
		conn = secure
	}
	return &timedConn{conn, timeout}, nil
}

// Client posts a job's requests to the daemon.
type Client struct {
	URL    URL
	CAFile string
	JobID  int64
}

// Stream is the body of an answer, read after its headers, until the daemon closes.
type Stream struct {
	conn   *timedConn
	Reader *bufio.Reader
}

// Close ends the connection.
func (s *Stream) Close() error { return s.conn.Close() }

// Post sends body as JSON over HTTP/1.0 (the answer then streams unchunked until the server
// closes) with a munge credential bound to this request; the answer's body, or a DaemonError.
// A timeout of 0 waits for ever.
//
// It connects before it asks munge for the credential: while the daemon is down, each of a job
// host's waiters retries every few seconds, and a munge process per retry (1,000 waiters on one
// host: 200 a second) starved the host; a refused connection costs a syscall. A host without a
// usable munge opens no connection at all (the daemon would get one that never speaks).
func (c *Client) Post(path string, body []byte, timeout time.Duration) (*Stream, error) {
	munge, err := mungeProgram()
	if err != nil {
		return nil, err
	}
	conn, err := Connect(c.URL, connectTimeout, c.CAFile)
	if err != nil {
		return nil, err
	}
	credential, err := mungeCredentialWith(munge, RequestDigest("POST", path, c.JobID, body))
	if err != nil {
		conn.Close()
		return nil, err
	}
	head := fmt.Sprintf("POST %s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nX-Munge-Credential: %s\r\n\r\n", path, HostHeader(c.URL.Host, c.URL.Port),
		len(body), credential)
	conn.timeout = timeout
	if _, err := conn.Write(append([]byte(head), body...)); err != nil {
		conn.Close()
		return nil, err
	}
	reader := bufio.NewReaderSize(conn, 65536)
	status, err := readStatus(reader)
	if err != nil {
		conn.Close()
		return nil, err
	}
	for {
		line, err := reader.ReadBytes('\n')
		if err != nil && err != io.EOF {
			conn.Close()
			return nil, err
		}
		if string(line) == "\r\n" || string(line) == "\n" || len(line) == 0 {
			break
		}
	}
	if status != 200 {
		rest, err := io.ReadAll(reader)
		conn.Close()
		if err != nil {
			return nil, err
		}
		return nil, &DaemonError{status, strings.TrimSpace(decodeReplace(rest))}
	}
	return &Stream{conn, reader}, nil
}

// PostClose posts and closes the answer unread: the status is all that counts.
func (c *Client) PostClose(path string, body []byte, timeout time.Duration) error {
	stream, err := c.Post(path, body, timeout)
	if err == nil {
		stream.Close()
	}
	return err
}

// readStatus reads an answer's status line; an OSError-like error for a garbled one.
func readStatus(reader *bufio.Reader) (int, error) {
	line, err := reader.ReadBytes('\n')
	if err != nil && err != io.EOF {
		return 0, err
	}
	words := bytes.Fields(line)
	if len(words) < 2 || !asciiDigits(words[1]) {
		parts := make([]string, len(words))
		for i, w := range words {
			parts[i] = pyBytesRepr(w)
		}
		return 0, fmt.Errorf("bad HTTP answer from the bridge: [%s]", strings.Join(parts, ", "))
	}
	return strconv.Atoi(string(words[1]))
}

func asciiDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// decodeReplace is bytes.decode(errors="replace"): every byte that is not UTF-8 is U+FFFD.
func decodeReplace(b []byte) string {
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
