package waiter

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

// The waiter's few words of its own (a cancel that could not be sent, a long outage) quote the
// error, and the job's output must read as the Python waiter's: errors are told as Python's
// str(OSError) tells them.

// strerror is glibc's text for the errors a connection meets (Go's own are lowercase).
var strerror = map[syscall.Errno]string{
	syscall.ENOENT:        "No such file or directory",
	syscall.EACCES:        "Permission denied",
	syscall.EPIPE:         "Broken pipe",
	syscall.ECONNREFUSED:  "Connection refused",
	syscall.ECONNRESET:    "Connection reset by peer",
	syscall.ECONNABORTED:  "Software caused connection abort",
	syscall.ETIMEDOUT:     "Connection timed out",
	syscall.EHOSTUNREACH:  "No route to host",
	syscall.ENETUNREACH:   "Network is unreachable",
	syscall.EADDRNOTAVAIL: "Cannot assign requested address",
	syscall.ENOEXEC:       "Exec format error",
	syscall.E2BIG:         "Argument list too long",
	syscall.ENOTDIR:       "Not a directory",
	syscall.ELOOP:         "Too many levels of symbolic links",
}

// pyError is err as Python's str() of the matching exception would read.
func pyError(err error) string {
	var timeout interface{ Timeout() bool }
	if errors.As(err, &timeout) && timeout.Timeout() {
		return "timed out"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsNotFound {
			return "[Errno -2] Name or service not known"
		}
		return "[Errno -3] Temporary failure in name resolution"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		text, ok := strerror[errno]
		if !ok {
			text = errno.Error()
			text = strings.ToUpper(text[:1]) + text[1:]
		}
		var pathErr *os.PathError
		if errors.As(err, &pathErr) && pathErr.Path != "" {
			return fmt.Sprintf("[Errno %d] %s: %s", int(errno), text, pyRepr(pathErr.Path))
		}
		return fmt.Sprintf("[Errno %d] %s", int(errno), text)
	}
	return err.Error()
}

// pyRepr is repr() of a Python str: single quotes unless the text holds one and no double.
func pyRepr(s string) string {
	quote := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		quote = '"'
	}
	return pyQuote(s, quote, false)
}

// pyBytesRepr is repr() of Python bytes.
func pyBytesRepr(b []byte) string {
	s := string(b)
	quote := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		quote = '"'
	}
	return "b" + pyQuote(s, quote, true)
}

func pyQuote(s string, quote byte, asBytes bool) string {
	var out strings.Builder
	out.WriteByte(quote)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == quote || c == '\\':
			out.WriteByte('\\')
			out.WriteByte(c)
		case c == '\n':
			out.WriteString(`\n`)
		case c == '\r':
			out.WriteString(`\r`)
		case c == '\t':
			out.WriteString(`\t`)
		case c < 0x20 || c == 0x7f || (asBytes && c >= 0x80):
			fmt.Fprintf(&out, `\x%02x`, c)
		default:
			out.WriteByte(c)
		}
	}
	out.WriteByte(quote)
	return out.String()
}
