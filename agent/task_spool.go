package main

// A step's task outlives the daemon that streams its output (kill -9, an upgrade, a failover):
// its stdout and stderr go through a spool beside its pid file, and the exec that started it
// forwards from there. A task proxy that lost its stream asks the next daemon to follow the task
// from the bytes it has (`agent task-follow`, task_follow.go), which reads the same spool.
//
// Files, beside PIDFILE:
//
//	.run   made when the task is set up (a follower knows the task started): "running AGENTPID";
//	       its end replaces that: "end CODE FINAL1 FINAL2\n" and the usage line (usageFigures)
//	.1 .2  the task's stdout and stderr, at their stream offsets
//	.sent  what a follower's daemon passed on of each (two little-endian int64), so the spool
//	       here may take more and drop what lies far behind
//
// What counts as passed on is what the daemon says it handed to the task's proxy: it writes
// "a STDOUT STDERR\n" on the exec's stdin as it does (after the task's --input bytes). Bytes
// written to an exec whose daemon is gone still "succeed" (the runtime drains them), so the
// exec's own writes prove nothing. Bounded: what was not passed on is at most spoolAhead bytes
// (then the task's writes wait, as they wait natively for a slow srun), and of what was, only the
// last spoolBehind bytes stay; the rest is punched out of the file. Once the daemon said it passed
// on all of it, the spool's output goes; should it not say so, the spool stays for a follower.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// A window of 256 KiB held a task writing fast to ~2/3 of what it wrote without the spool.
	spoolAhead  = 1 << 20
	spoolBehind = 256 << 10
	// A stream's reader looks this often at a follower's progress while the spool is full.
	spoolFullPoll = 20 * time.Millisecond
	// How long an ended task's agent waits for the daemon to say it passed all output on (then
	// the spool stays; the batch agent does not wait for an ended task's agent, tasks_left.go).
	spoolAckWait = 5 * time.Second
)

// acks reads what the daemon says it passed on ("a STDOUT STDERR" lines on the exec's stdin).
type acks struct {
	passed [2]atomic.Int64
	heard  atomic.Bool      // the daemon said something: it acknowledges
	ended  chan struct{}    // closed when the daemon's side of stdin ended (it went away)
	moved  [2]chan struct{} // a token after each acknowledgement: a full spool takes more at once
}

func readAcks(fd int, record func(passed [2]int64)) *acks {
	a := &acks{ended: make(chan struct{}), moved: [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}}
	if fd < 0 {
		close(a.ended)
		return a
	}
	go func() {
		defer close(a.ended)
		reader := bufio.NewReader(os.NewFile(uintptr(fd), "acks"))
		for {
			line, err := reader.ReadString('\n')
			if err != nil {
				return
			}
			var passed [2]int64
			if n, _ := fmt.Sscanf(line, "a %d %d\n", &passed[0], &passed[1]); n != 2 {
				continue
			}
			for i := range passed {
				if passed[i] > a.passed[i].Load() {
					a.passed[i].Store(passed[i])
				}
			}
			a.heard.Store(true)
			for _, moved := range a.moved {
				select {
				case moved <- struct{}{}:
				default:
				}
			}
			if record != nil {
				record(passed)
			}
		}
	}()
	return a
}

// waitFor waits until the daemon said it passed on finals; false when it went away first, or
// spoolAckWait passed.
func (a *acks) waitFor(finals [2]int64) bool {
	deadline := time.Now().Add(spoolAckWait)
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		if a.passed[0].Load() >= finals[0] && a.passed[1].Load() >= finals[1] {
			return true
		}
		select {
		case <-a.ended:
			return a.passed[0].Load() >= finals[0] && a.passed[1].Load() >= finals[1]
		case <-time.After(pause):
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// spoolFiles are the names of a task's spool files.
type spoolFiles struct{ run, out, err, sent string }

func spoolFilesOf(pidfile string) spoolFiles {
	return spoolFiles{pidfile + ".run", pidfile + ".1", pidfile + ".2", pidfile + ".sent"}
}

// spoolStream is one of the task's output streams, spooled.
type spoolStream struct {
	file    *os.File
	mu      sync.Mutex
	grew    *sync.Cond
	total   int64 // bytes spooled
	ended   bool  // the task's end of it was read
	sent    atomic.Int64
	punched int64
}

func newSpoolStream(path string) (*spoolStream, error) {
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	s := &spoolStream{file: file}
	s.grew = sync.NewCond(&s.mu)
	return s, nil
}

// taskSpool is the spool of one task, held by the agent that runs it.
type taskSpool struct {
	files   spoolFiles
	streams [2]*spoolStream
	sent    *os.File
	// The exec's own stdout and stderr: the forwarding and the usage line go there.
	execOut, execErr int
	taking           sync.WaitGroup
	acks             *acks
}

// startSpool makes the task's stdout and stderr (merged: one pipe for both, as one per-task file)
// pipes into the spool, fds 1 and 2 of this process from here on, and starts taking them; the
// daemon's acknowledgements come on ackInput (-1: none).
func startSpool(pidfile string, merged bool, ackInput int) (*taskSpool, error) {
	files := spoolFilesOf(pidfile)
	sp := &taskSpool{files: files, acks: readAcks(ackInput, nil)}
	var err error
	if sp.execOut, err = syscall.Dup(1); err != nil {
		return nil, err
	}
	if sp.execErr, err = syscall.Dup(2); err != nil {
		return nil, err
	}
	syscall.CloseOnExec(sp.execOut)
	syscall.CloseOnExec(sp.execErr)
	if sp.sent, err = os.OpenFile(files.sent, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600); err != nil {
		return nil, err
	}
	for i, path := range []string{files.out, files.err} {
		if sp.streams[i], err = newSpoolStream(path); err != nil {
			return nil, err
		}
	}
	// Made last: a follower that finds it finds the rest.
	if err := os.WriteFile(files.run, []byte(fmt.Sprintf("running %d\n", os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	outRead, outWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_ = syscall.Dup2(int(outWrite.Fd()), 1)
	_ = outWrite.Close()
	sp.take(0, outRead)
	if merged {
		_ = syscall.Dup2(1, 2)
		sp.streams[1].finish()
	} else {
		errRead, errWrite, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		_ = syscall.Dup2(int(errWrite.Fd()), 2)
		_ = errWrite.Close()
		sp.take(1, errRead)
	}
	return sp, nil
}

func (s *spoolStream) finish() {
	s.mu.Lock()
	s.ended = true
	s.grew.Broadcast()
	s.mu.Unlock()
}

// take reads a stream's pipe into its spool until the task's end of it.
func (sp *taskSpool) take(index int, pipe *os.File) {
	s := sp.streams[index]
	sp.taking.Add(1)
	go func() {
		defer sp.taking.Done()
		defer s.finish()
		defer pipe.Close()
		buffer := make([]byte, 64<<10)
		for {
			sp.waitForRoom(index)
			n, err := pipe.Read(buffer)
			if n > 0 {
				s.mu.Lock()
				at := s.total
				s.mu.Unlock()
				if _, werr := s.file.WriteAt(buffer[:n], at); werr != nil {
					// Nowhere to keep it (the volume is full): said where the task's stderr goes.
					msg := fmt.Sprintf("slurm-k8s-bridge: %d bytes of this task's output were lost: %v\n", n, werr)
					_, _ = syscall.Write(sp.execErr, []byte(msg))
					continue
				}
				s.mu.Lock()
				s.total += int64(n)
				s.grew.Broadcast()
				s.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
}

// forwarded is how far the stream was passed on, by this agent's daemon or a follower's (by this
// agent's own writes when its daemon does not acknowledge: nothing may be left behind then).
func (sp *taskSpool) forwarded(index int) int64 {
	done := sp.acks.passed[index].Load()
	if !sp.acks.heard.Load() {
		// Not (yet) a daemon that acknowledges: one that does says so first, at once.
		done = sp.streams[index].sent.Load()
	}
	var raw [16]byte
	if n, _ := sp.sent.ReadAt(raw[:], 0); n == 16 {
		done = max(done, int64(binary.LittleEndian.Uint64(raw[8*index:])))
	}
	return done
}

// waitForRoom holds the stream's reader while spoolAhead bytes wait to be forwarded, and punches
// out what lies more than spoolBehind behind the forwarded end.
func (sp *taskSpool) waitForRoom(index int) {
	s := sp.streams[index]
	for {
		done := sp.forwarded(index)
		if keep := (done - spoolBehind) &^ 4095; keep > s.punched {
			_ = punchHole(s.file, s.punched, keep-s.punched)
			s.punched = keep
		}
		s.mu.Lock()
		waiting := s.total - done
		s.mu.Unlock()
		if waiting < spoolAhead {
			return
		}
		select {
		case <-sp.acks.moved[index]:
		case <-time.After(spoolFullPoll): // a follower's progress comes by its file
		}
	}
}

// punchHole frees [offset, offset+length) of file, keeping its size (reads there give zeros).
func punchHole(file *os.File, offset, length int64) error {
	const punchHoleKeepSize = 0x02 | 0x01 // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
	return syscall.Fallocate(int(file.Fd()), punchHoleKeepSize, offset, length)
}

// forward writes stream index from the spool to fd out as it comes, until the task's end of it;
// false when out failed (the exec's stream is gone: a follower may take over).
func (sp *taskSpool) forward(index, out int) bool {
	s := sp.streams[index]
	buffer := make([]byte, 64<<10)
	for at := int64(0); ; {
		s.mu.Lock()
		for at >= s.total && !s.ended {
			s.grew.Wait()
		}
		total := s.total
		s.mu.Unlock()
		if at >= total {
			return true
		}
		n, err := s.file.ReadAt(buffer[:min(int64(len(buffer)), total-at)], at)
		if n == 0 && err != nil {
			return false
		}
		if writeFully(out, buffer[:n]) != nil {
			return false
		}
		at += int64(n)
		s.sent.Store(at)
	}
}

func writeFully(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := syscall.Write(fd, data)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// startForwarding forwards both streams to the exec's stdout and stderr; the result says whether
// both reached the task's end.
func (sp *taskSpool) startForwarding() <-chan bool {
	result := make(chan bool, 1)
	go func() {
		var wait sync.WaitGroup
		var ok [2]bool
		for index, out := range []int{sp.execOut, sp.execErr} {
			wait.Add(1)
			go func() {
				defer wait.Done()
				ok[index] = sp.forward(index, out)
			}()
		}
		wait.Wait()
		result <- ok[0] && ok[1]
	}()
	return result
}

// end closes this agent's ends of the task's pipes, waits for the task's processes to close
// theirs (as slurmstepd waits for a step's output to end), and records how the task ended.
func (sp *taskSpool) end(code int, usage string) {
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err == nil {
		_ = syscall.Dup2(int(devNull.Fd()), 1)
		_ = syscall.Dup2(int(devNull.Fd()), 2)
		_ = devNull.Close()
	}
	sp.taking.Wait()
	record := fmt.Sprintf("end %d %d %d\n%s", code, sp.streams[0].total, sp.streams[1].total, usage)
	_ = os.WriteFile(sp.files.run+".tmp", []byte(record), 0o600)
	_ = os.Rename(sp.files.run+".tmp", sp.files.run)
}

// close ends the exec as the task ended: once both streams were forwarded, the usage line on
// the exec's stderr; once the daemon said it passed all on, the spool's output goes (the end
// stays, for a proxy that asks again); otherwise the spool stays for a follower.
func (sp *taskSpool) close(forwarded <-chan bool, usage string) {
	if !<-forwarded {
		return
	}
	if usage != "" {
		_ = writeFully(sp.execErr, []byte(usageTrailer+usage))
	}
	// A daemon that acknowledges says so at once ("a 0 0"); with one that does not, nobody
	// could follow the task.
	finals := [2]int64{sp.streams[0].total, sp.streams[1].total}
	if !sp.acks.heard.Load() || sp.acks.waitFor(finals) {
		sp.removeOutput()
	}
}

func (sp *taskSpool) removeOutput() {
	for _, path := range []string{sp.files.out, sp.files.err, sp.files.sent} {
		_ = os.Remove(path)
	}
}
