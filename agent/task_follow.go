package main

// `agent task-follow PIDFILE FROM1 FROM2`: a task proxy lost the stream of its task (the daemon
// died or restarted) and asks again from the FROM1 bytes of stdout and FROM2 of stderr it has.
// The task ran on meanwhile, its output kept in its spool (task_spool.go): this forwards the rest
// as the task's exec would have, then the usage line, and ends as the task ended.

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// How long a follower waits for a task's spool to appear: an exec the dead daemon sent may
	// still be starting the task.
	followStartWait = 3 * time.Second
	followPollMin   = 5 * time.Millisecond
	followPollMax   = 100 * time.Millisecond
	// The usage line a follower gives for a task this pod never started: the proxy may ask for it
	// to be run after all.
	unknownTaskFigures = "unknown\n"
)

// taskEnd is a task's end as its agent recorded it in the .run file.
type taskEnd struct {
	code   int
	finals [2]int64
	usage  string
}

// readTaskState reads a task's .run file: nil while the task runs, with the pid of its agent.
func readTaskState(path string) (*taskEnd, int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	head, usage, _ := strings.Cut(string(raw), "\n")
	words := strings.Fields(head)
	if len(words) == 2 && words[0] == "running" {
		pid, _ := strconv.Atoi(words[1])
		return nil, pid, nil
	}
	if len(words) != 4 || words[0] != "end" {
		return nil, 0, nil
	}
	end := &taskEnd{usage: usage}
	end.code, _ = strconv.Atoi(words[1])
	end.finals[0], _ = strconv.ParseInt(words[2], 10, 64)
	end.finals[1], _ = strconv.ParseInt(words[3], 10, 64)
	return end, 0, nil
}

// follower is one `task-follow`: what it wrote of each stream, and of that its own notices.
type follower struct {
	written, notices [2]atomic.Int64
}

func (f *follower) write(fd int, data []byte) error {
	err := writeFully(fd, data)
	if err == nil {
		f.written[fd-1].Add(int64(len(data)))
	}
	return err
}

func taskFollow(pidfile, from1, from2 string) {
	var from [2]int64
	for index, text := range []string{from1, from2} {
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil || n < 0 {
			fail("not a stream offset: " + strconv.Quote(text))
		}
		from[index] = n
	}
	files := spoolFilesOf(pidfile)
	for deadline := time.Now().Add(followStartWait); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(files.run); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = writeFully(2, []byte(usageTrailer+unknownTaskFigures))
			os.Exit(exitFailed)
		}
	}
	f := &follower{}
	sent, _ := os.OpenFile(files.sent, os.O_RDWR, 0)
	ackInput, err := syscall.Dup(0)
	if err != nil {
		ackInput = -1
	}
	nullStdin()
	// What this daemon passed on may be dropped from the task's spool (task_spool.go): counted
	// from where this follower began, without its own notices (skipped bytes make it short: safe).
	acked := readAcks(ackInput, func(passed [2]int64) {
		if sent == nil {
			return
		}
		var raw [16]byte
		for i := range passed {
			binary.LittleEndian.PutUint64(raw[8*i:], uint64(from[i]+max(0, passed[i]-f.notices[i].Load())))
		}
		_, _ = sent.WriteAt(raw[:], 0)
	})
	var wait sync.WaitGroup
	var agentGone [2]bool
	for index, path := range []string{files.out, files.err} {
		wait.Add(1)
		go func() {
			defer wait.Done()
			agentGone[index] = !f.followStream(path, files.run, index, from[index])
		}()
	}
	wait.Wait()
	end, _, _ := readTaskState(files.run)
	if end == nil || agentGone[0] || agentGone[1] {
		fail("the agent that ran this task ended before it did")
	}
	if end.usage != "" {
		_ = writeFully(2, []byte(usageTrailer+end.usage))
	}
	if acked.waitFor([2]int64{f.written[0].Load(), f.written[1].Load()}) {
		for _, path := range []string{files.out, files.err, files.sent} {
			_ = os.Remove(path)
		}
	}
	os.Exit(end.code)
}

// followStream forwards stream index (fd index+1) from byte at to the task's end of it; false
// when the task's agent is gone without recording the end.
func (f *follower) followStream(path, runPath string, index int, at int64) bool {
	out := index + 1
	file, _ := os.Open(path)
	if file != nil {
		defer file.Close()
		at = f.skipPunched(file, at)
	}
	buffer := make([]byte, 64<<10)
	pause, idle := followPollMin, time.Duration(0)
	for {
		n := 0
		if file != nil {
			n, _ = file.ReadAt(buffer, at)
		}
		if n > 0 {
			if f.write(out, buffer[:n]) != nil {
				os.Exit(exitFailed) // this exec's stream is gone too: another follower may come
			}
			at += int64(n)
			pause, idle = followPollMin, 0
			continue
		}
		end, agent, err := readTaskState(runPath)
		if end != nil {
			if at >= end.finals[index] {
				return true
			}
			if file == nil || fileSize(file) <= at {
				f.lostOutput(end.finals[index] - at)
				return true
			}
			continue
		}
		if err != nil || (idle >= time.Second && agent > 0 && syscall.Kill(agent, 0) == syscall.ESRCH) {
			return false
		}
		time.Sleep(pause)
		idle += pause
		pause = min(2*pause, followPollMax)
	}
}

// skipPunched moves past what the spool dropped (it lay further behind than any daemon could
// still have had in flight).
func (f *follower) skipPunched(file *os.File, at int64) int64 {
	const seekData = 3
	next, err := file.Seek(at, seekData)
	if err == nil && next > at {
		f.lostOutput(next - at)
		return next
	}
	return at
}

// lostOutput says on stderr, where slurm-k8s-bridge's other losses are said, what is missing.
func (f *follower) lostOutput(bytes int64) {
	notice := []byte(fmt.Sprintf("slurm-k8s-bridge: %d bytes of this task's output were lost "+
		"while the bridge restarted\n", bytes))
	if f.write(2, notice) == nil {
		f.notices[1].Add(int64(len(notice)))
	}
}

func fileSize(file *os.File) int64 {
	info, err := file.Stat()
	if err != nil {
		return 0
	}
	return info.Size()
}
