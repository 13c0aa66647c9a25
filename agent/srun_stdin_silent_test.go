package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"slurm-k8s-bridge/agent/internal/fdtest"
)

func silentPipe(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	reader, writer, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close(); writer.Close() })
	stdinSilence = 100 * time.Millisecond
	t.Cleanup(func() { stdinSilence = time.Second })
	return reader, writer
}

// As Snakemake's executor starts a step: Popen(stdin=PIPE), then wait for srun, the pipe left open.
func TestAPipeOnlyTheWaitingCallerHoldsOpenStartsTheStepWithoutStdin(t *testing.T) {
	reader, _ := silentPipe(t) // the writer is this process's own: the caller's
	fdtest.OnStdin(t, reader, func() {
		started := time.Now()
		sent, options := srunStdin([]string{"true"})
		if sent != nil || options != nil {
			t.Fatalf("sent %q, options %v", sent, options)
		}
		if took := time.Since(started); took > 5*time.Second {
			t.Fatalf("the step waited %v", took)
		}
	})
}

// `slow | srun prog`: the writer is not srun's ancestor, so srun waits for all it writes.
func TestAPipeAnotherProcessWritesLaterIsReadToItsEnd(t *testing.T) {
	reader, writer := silentPipe(t)
	slow := exec.Command("/bin/sh", "-c", "sleep 0.6; echo late")
	slow.Stdout = writer
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	writer.Close() // only the sibling holds it now
	defer func() { _ = slow.Wait() }()
	fdtest.OnStdin(t, reader, func() {
		sent, options := srunStdin([]string{"cat"})
		if string(sent) != "late\n" || options != nil {
			t.Fatalf("sent %q, options %v", sent, options)
		}
	})
}

// A caller that writes at once and closes is read to the end, as before.
func TestAPipeTheCallerWritesAndClosesIsReadToItsEnd(t *testing.T) {
	reader, writer := silentPipe(t)
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = writer.Write([]byte("now\n"))
		writer.Close()
	}()
	fdtest.OnStdin(t, reader, func() {
		sent, _ := srunStdin([]string{"cat"})
		if string(sent) != "now\n" {
			t.Fatalf("sent %q", sent)
		}
	})
}

func TestAccessModeReadsFdinfosOctalFlags(t *testing.T) {
	for text, want := range map[string]int{"pos:\t0\nflags:\t02000001\n": 1, "flags:\t0100000\n": 0,
		"flags:\t02\n": 2, "pos:\t0\n": -1} {
		if got := accessMode(text); got != want {
			t.Errorf("%q: %d, want %d", text, got, want)
		}
	}
}

func TestWaitsForAChildTellsAWaitingShellFromASleepingOne(t *testing.T) {
	waiting := exec.Command("/bin/sh", "-c", "sleep 3; true")      // waitpid: do_wait
	waitBuiltin := exec.Command("/bin/sh", "-c", "sleep 3 & wait") // sigsuspend
	sleeping := exec.Command("/bin/sleep", "3")
	for _, cmd := range []*exec.Cmd{waiting, waitBuiltin, sleeping} {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func(cmd *exec.Cmd) { _ = cmd.Process.Kill(); _ = cmd.Wait() }(cmd)
	}
	deadline := time.Now().Add(2 * time.Second)
	for !(waitsForAChild(waiting.Process.Pid) && waitsForAChild(waitBuiltin.Process.Pid)) &&
		time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !waitsForAChild(waiting.Process.Pid) || !waitsForAChild(waitBuiltin.Process.Pid) ||
		waitsForAChild(sleeping.Process.Pid) {
		t.Fatalf("waiting: %v, wait builtin: %v, sleeping: %v", waitsForAChild(waiting.Process.Pid),
			waitsForAChild(waitBuiltin.Process.Pid), waitsForAChild(sleeping.Process.Pid))
	}
}

// A named FIFO is read to its end whoever holds it: its fd link is its path, not pipe:[N].
func TestANamedFifoIsReadToItsEnd(t *testing.T) {
	stdinSilence = 100 * time.Millisecond
	t.Cleanup(func() { stdinSilence = time.Second })
	path := t.TempDir() + "/fifo"
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	writer := exec.Command("/bin/sh", "-c", "exec >"+path+"; sleep 0.5; echo x")
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Wait() }()
	reader, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	fdtest.OnStdin(t, reader, func() {
		if sent, _ := srunStdin([]string{"cat"}); string(sent) != "x\n" {
			t.Fatalf("sent %q", sent)
		}
	})
}

// A sibling that wrote its last bytes and ended holds the pipe no more: that is no silent caller
// (its bytes may not have been read yet), and the step must not start without them.
func TestAPipeNobodyHoldsAnyMoreIsNoSilentCaller(t *testing.T) {
	reader, writer := silentPipe(t)
	if _, err := writer.Write([]byte("late\n")); err != nil {
		t.Fatal(err)
	}
	writer.Close()
	var stat syscall.Stat_t
	if err := syscall.Fstat(int(reader.Fd()), &stat); err != nil {
		t.Fatal(err)
	}
	if onlyWaitingAncestorsWrite(stat.Ino) {
		t.Fatal("a pipe with no writer left was taken for a silent caller's")
	}
}
