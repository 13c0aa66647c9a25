package main

// A caller that starts srun with a pipe for its stdin and then waits for srun to end, never
// writing to the pipe nor closing it (Python's subprocess.Popen(..., stdin=PIPE) then wait(), as
// Snakemake's SLURM executor starts each rule's step), waits for ever on an srun that reads its
// stdin to the end before the step starts. Native srun starts the step at once and forwards its
// stdin as it comes; a task that does not read it ends, and srun with it.
//
// So: when nothing came on an anonymous pipe for stdinSilence, and every process that holds its
// write end is an ancestor of this srun that is waiting for a child (the one waiting for it; never
// a sibling such as `sort big | srun ...`, which writes once it is done, nor a parent still
// computing what it will write), the step starts with no stdin. Should anything come after all,
// srun says it was not passed on, and ends with 1 rather than 0. A named FIFO is read to its end.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// stdinSilence is how long srun waits for a first byte from an ancestor's pipe.
var stdinSilence = time.Second

// readPipeUnlessOnlyAncestorsHoldIt reads stdin (a pipe, inode ino) to its end, at most limit
// bytes, unless it stays silent and only waiting ancestors hold its write end: then nil, and a
// late byte is reported on stderr.
func readPipeUnlessOnlyAncestorsHoldIt(ino uint64, limit int64) ([]byte, error) {
	type result struct {
		data []byte
		err  error
	}
	first, done := make(chan struct{}), make(chan result, 1)
	go func() {
		reader := &firstByte{reader: io.LimitReader(os.Stdin, limit), first: first}
		data, err := io.ReadAll(reader)
		done <- result{data, err}
	}()
	select {
	case got := <-done:
		return got.data, got.err
	case <-first:
		got := <-done
		return got.data, got.err
	case <-time.After(stdinSilence):
	}
	// Looked at again each second: a sibling holding the write end may close it, and only the
	// waiting caller's remain.
	for tick := time.NewTicker(stdinSilence); ; {
		if onlyWaitingAncestorsWrite(ino) {
			select {
			case <-first: // came while we looked
			default:
				tick.Stop()
				go func() {
					<-first
					lateInput.Store(true)
					fmt.Fprintln(os.Stderr, "srun: error: input written to srun's stdin after its step "+
						"started in Kubernetes was not passed on to the step (close the pipe or give "+
						"srun --input=FILE before srun starts)")
				}()
				return nil, nil
			}
		}
		select {
		case got := <-done:
			tick.Stop()
			return got.data, got.err
		case <-first:
			tick.Stop()
			got := <-done
			return got.data, got.err
		case <-tick.C:
		}
	}
}

// lateInput: stdin brought a byte after the step started without it.
var lateInput atomic.Bool

// exitAfterStep ends srun with the step's code, or 1 where input was lost (lateInput) and the
// step itself succeeded.
func exitAfterStep(code int) {
	if code == 0 && lateInput.Load() {
		code = 1
	}
	os.Exit(code)
}

// isAnonymousPipe says whether fd 0 is a pipe (not a named FIFO, whose holders are not found by
// its inode's `pipe:[N]` link).
func isAnonymousPipe(ino uint64) bool {
	link, err := os.Readlink("/proc/self/fd/0")
	return err == nil && link == "pipe:["+strconv.FormatUint(ino, 10)+"]"
}

// firstByte closes first once a read returned data.
type firstByte struct {
	reader io.Reader
	first  chan struct{}
	seen   bool
}

func (f *firstByte) Read(p []byte) (int, error) {
	n, err := f.reader.Read(p)
	if n > 0 && !f.seen {
		f.seen = true
		close(f.first)
	}
	return n, err
}

// onlyWaitingAncestorsWrite says whether the write end of pipe ino is held, and only by ancestors
// of this process waiting for a child (or by this process itself). A process whose descriptors
// cannot be read might hold one (false), but for an ancestor (the agent that started the script is
// undumpable) and PID 1 (the pod's pause process, maybe of another user). No holder at all is no
// silent caller: the last writer has just written and gone, and its bytes and the end are on their
// way to the reader (a sibling's `echo late` seen gone before its bytes were read lost them).
func onlyWaitingAncestorsWrite(ino uint64) bool {
	ancestors := ancestorPids()
	target := "pipe:[" + strconv.FormatUint(ino, 10) + "]"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self, held := os.Getpid(), false
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		writes, known := holdsWriteEnd(pid, target)
		if pid == self {
			held = held || writes
			continue
		}
		if !known && !ancestors[pid] && pid != 1 {
			return false
		}
		if writes && (!ancestors[pid] || !waitsForAChild(pid)) {
			return false
		}
		held = held || writes
	}
	return held
}

// waitsForAChild says whether a thread of pid sleeps in wait() (its wchan: do_wait), or in
// sigsuspend() as a shell's `wait` builtin does.
func waitsForAChild(pid int) bool {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return false
	}
	for _, task := range tasks {
		wchan, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "wchan"))
		if err == nil && (string(wchan) == "do_wait" || strings.Contains(string(wchan), "sigsuspend")) {
			return true
		}
	}
	return false
}

// holdsWriteEnd says whether process pid holds `target` open for writing (known: false when its
// descriptors cannot be read, and it has not ended meanwhile).
func holdsWriteEnd(pid int, target string) (writes, known bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		_, gone := os.Stat(dir)
		return false, os.IsNotExist(gone)
	}
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err != nil || link != target {
			continue
		}
		info, err := os.ReadFile(filepath.Join(dir, "fdinfo", fd.Name()))
		if os.IsNotExist(err) {
			continue // closed meanwhile
		}
		if err != nil {
			return false, false
		}
		if accessMode(string(info)) != syscall.O_RDONLY {
			return true, true
		}
	}
	return false, true
}

// accessMode is O_RDONLY, O_WRONLY or O_RDWR from an fdinfo's `flags:` line (octal); -1 if none.
func accessMode(fdinfo string) int {
	for _, line := range strings.Split(fdinfo, "\n") {
		if value, found := strings.CutPrefix(line, "flags:"); found {
			flags, err := strconv.ParseUint(strings.TrimSpace(value), 8, 64)
			if err == nil {
				return int(flags) & syscall.O_ACCMODE
			}
		}
	}
	return -1
}

// ancestorPids is this process and its ancestors, by their parent links in /proc.
func ancestorPids() map[int]bool {
	found := map[int]bool{}
	for pid := os.Getpid(); pid > 0 && !found[pid]; {
		found[pid] = true
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			break
		}
		// The fields after the command, whose parentheses may hold anything: state, then ppid.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 {
			break
		}
		pid, _ = strconv.Atoi(fields[1])
	}
	return found
}
