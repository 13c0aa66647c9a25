package waiter

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// The user-step proxy's terminal (srun --pty, salloc's interactive shell): slurmstepd gives the
// task a pseudo-terminal; this passes it through to a terminal
// of the task in the pod. One HTTP/1.1 request carries both ways: its chunked body the terminal's
// input and window sizes (frames signed under the key the request's munge credential carries),
// its answer the task's output and then its exit code. This end's terminal is put in raw mode,
// so every byte (Ctrl-C, Ctrl-Z, Ctrl-\ included) reaches the pod's terminal, whose line
// discipline acts on it there, as the compute node's would natively.

const (
	terminalInputFrame  = 0 // bytes typed; empty: the end of the input
	terminalResizeFrame = 3 // a new window size, as JSON
	// tcsetattr's TCSADRAIN and TCSAFLUSH as ioctls (the syscall package names only TCSETS).
	ioctlSetDrained = syscall.TCSETS + 1
	ioctlSetFlushed = syscall.TCSETS + 2
)

// windowSize is (rows, cols) of the terminal on fd; (0, 0) when it has none.
func windowSize(fd int) (int, int) {
	var size [4]uint16
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&size)))
	if errno != 0 {
		return 0, 0
	}
	return int(size[0]), int(size[1])
}

func terminalAttributes(fd int, request uintptr, termios *syscall.Termios) error {
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), request, uintptr(unsafe.Pointer(termios)))
	if errno != 0 {
		return errno
	}
	return nil
}

// makeRaw puts the terminal on fd in raw mode as Python's tty.setraw does; its former mode.
func makeRaw(fd int) (syscall.Termios, error) {
	var saved syscall.Termios
	if err := terminalAttributes(fd, syscall.TCGETS, &saved); err != nil {
		return saved, err
	}
	raw := saved
	raw.Iflag &^= syscall.BRKINT | syscall.ICRNL | syscall.INPCK | syscall.ISTRIP | syscall.IXON
	raw.Oflag &^= syscall.OPOST
	raw.Cflag = raw.Cflag&^(syscall.CSIZE|syscall.PARENB) | syscall.CS8
	raw.Lflag &^= syscall.ECHO | syscall.ICANON | syscall.IEXTEN | syscall.ISIG
	raw.Cc[syscall.VMIN], raw.Cc[syscall.VTIME] = 1, 0
	return saved, terminalAttributes(fd, ioctlSetFlushed, &raw)
}

// unreachable tells the user at their terminal that the daemon could not be reached (the Python
// waiter ended with its exception's line, "ConnectionRefusedError: [Errno 111] ..."), in the words
// the task proxy without a terminal uses; exit code 1.
func unreachable(how string, err error) int {
	Say(how + ": " + pyError(err))
	return 1
}

// runTerminalTask runs the task in the pod with this process's terminal as its own; its exit code.
func runTerminalTask(client *Client, path string, body Object) int {
	rows, cols := windowSize(0)
	header := append(Dumps(append(append(Object{}, body...), Field{"rows", rows}, Field{"cols", cols})), '\n')
	streamKey := make([]byte, 32)
	_, _ = rand.Read(streamKey)
	// As Client.Post: a munge this host cannot run fails at once, and the credential is made
	// only once the daemon took the connection (none for a daemon that is down).
	program, err := mungeProgram()
	if err != nil {
		return crash("OSError: " + err.Error())
	}
	conn, err := Connect(client.URL, streamAnswerTimeout, client.CAFile)
	if err != nil {
		return unreachable("could not reach the bridge to run this task", err)
	}
	defer conn.Close()
	credential, err := mungeCredentialWith(program, RequestDigest("POST", path, client.JobID, header)+" "+
		hex.EncodeToString(streamKey))
	if err != nil {
		return crash("OSError: " + err.Error())
	}
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"+
		"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"+
		"X-Munge-Credential: %s\r\n\r\n", path, HostHeader(client.URL.Host, client.URL.Port), credential)
	if _, err := conn.Write(append([]byte(head), chunk(header)...)); err != nil {
		return unreachable("lost the bridge before the task started", err)
	}
	reader := bufio.NewReader(conn)
	status, first, err := readAnswerHead(reader)
	if err != nil {
		return unreachable("lost the bridge before the task started", err)
	}
	if status != 200 {
		said := strings.TrimSpace(decodeReplace(first))
		if said == "" {
			said = fmt.Sprintf("the bridge answered %d", status)
		}
		Say(said)
		return 1
	}
	conn.timeout = 0 // a quiet shell is no reason to give up
	var sending sync.Mutex
	var seq uint64
	send := func(kind byte, data []byte) error {
		sending.Lock()
		defer sending.Unlock()
		_, err := conn.Write(chunk(SignOutputFrame(streamKey, seq, kind, data)))
		seq++
		return err
	}
	saved, rawErr := makeRaw(0)
	if rawErr != nil {
		return crash("termios.error: " + pyError(rawErr))
	}
	restore := func() { _ = terminalAttributes(0, ioctlSetDrained, &saved) }
	defer restore()
	resizes := make(chan os.Signal, 8)
	signal.Notify(resizes, syscall.SIGWINCH)
	defer signal.Stop(resizes)
	go func() {
		for range resizes {
			rows, cols := windowSize(0)
			_ = send(terminalResizeFrame, Dumps(Object{{"rows", rows}, {"cols", cols}}))
		}
	}()
	// In raw mode the terminal sends no SIGINT here; slurmstepd's signals still come (scancel),
	// passed on by startSignalPassing, and a hang-up of this end goes on too.
	go pumpTerminalInput(send)
	code, err := relayTerminalOutput(first, reader)
	if err != nil {
		Say("lost the bridge while the task ran: " + describe(err))
		return 1
	}
	if code == nil {
		Say("the bridge stopped streaming this task before it ended")
		return 1
	}
	restore()
	return endAsTheTask(*code)
}

// pumpTerminalInput sends the terminal's input, as typed; its end (the user's terminal went
// away) ends the input.
func pumpTerminalInput(send func(byte, []byte) error) {
	buffer := make([]byte, 4096)
	for {
		n, err := syscall.Read(0, buffer)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		if send(terminalInputFrame, append([]byte(nil), buffer[:n]...)) != nil || n == 0 {
			return
		}
	}
}

// relayTerminalOutput writes the task's output events as they come; its exit code, or nil when
// the answer ended first.
func relayTerminalOutput(pending []byte, reader *bufio.Reader) (*int64, error) {
	for {
		lines := bytes.Split(pending, []byte("\n"))
		pending = lines[len(lines)-1]
		for _, line := range lines[:len(lines)-1] {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			value, err := Loads(line)
			if err != nil {
				return nil, err
			}
			event, ok := value.(Object)
			if !ok {
				return nil, errGarbled
			}
			if fd, hasFD := event.Get("fd"); hasFD {
				number, isNumber := pyInt(fd)
				data, _ := event.Get("data")
				text, isText := data.(string)
				if !isNumber || !isText {
					return nil, errGarbled
				}
				decoded, err := pyA2bBase64(text)
				if err != nil {
					return nil, err
				}
				if err := WriteAll(int(number), decoded); err != nil {
					return nil, err
				}
			} else if exit, hasExit := event.Get("exit"); hasExit {
				code, isNumber := pyInt(exit)
				if !isNumber {
					return nil, errGarbled
				}
				return &code, nil
			}
		}
		more, err := readChunk(reader)
		if err != nil {
			return nil, err
		}
		if len(more) == 0 {
			return nil, nil
		}
		pending = append(pending, more...)
	}
}
