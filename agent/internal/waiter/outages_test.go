package waiter

// The waiter's timeouts, with shorter stand-ins for the real ones (tests/unit/test_outages_answer_
// 503_and_the_waiter_retries.py drives these with `go test -run` and checks the real values
// through TestTimeoutConstantsDump).

import (
	"path/filepath"
	"testing"
	"time"
)

func TestASilentAttachIsDroppedAndAttachedAgain(t *testing.T) {
	saved := streamTimeout
	streamTimeout = 300 * time.Millisecond
	t.Cleanup(func() { streamTimeout = saved })
	daemon := &signalDaemon{streams: [][]string{{silence}, {exitLine}}}
	job := waiterFor(t, daemon)

	started := time.Now()
	code := 0
	said := stderrOf(t, func() { code = job.Run() })

	expectEqual(t, "code", code, 0)
	expectEqual(t, "calls", daemon.actions(), []string{"attach", "attach"})
	expectEqual(t, "what the job's stderr got", said, "")
	if elapsed := time.Since(started); elapsed < streamTimeout || elapsed > 10*time.Second {
		t.Fatalf("attached again after %v, the timeout being %v", elapsed, streamTimeout)
	}
}

// A munge that hangs on its first call (`first`: how), then answers as withFakeMunge's does.
func withMungeHangingOnce(t *testing.T, first string) string {
	directory := t.TempDir()
	trustFakesIn(t, directory)
	calls := filepath.Join(directory, "calls")
	munge := filepath.Join(directory, "munge")
	writeExecutable(t, munge, "#!/bin/sh\necho call >> "+calls+"\n"+
		"if [ \"$(wc -l < "+calls+")\" = 1 ]; then "+first+"; fi\n"+
		"printf 'MUNGE:'\nexec cat\n")
	saved, savedTimeout := MungePaths, mungeTimeout
	MungePaths, mungeTimeout = []string{munge}, 300*time.Millisecond
	t.Cleanup(func() { MungePaths, mungeTimeout = saved, savedTimeout })
	return calls
}

// munge hangs on the waiter's first call (`first`: how): the waiter takes it for an outage and
// asks again, and its job ends as the daemon says.
func expectMungeAskedAgain(t *testing.T, first string) {
	daemon := &signalDaemon{streams: [][]string{{`{"type": "exit", "code": 4, "signal": null}` + "\n"}}}
	job := waiterFor(t, daemon)
	calls := withMungeHangingOnce(t, first) // after waiterFor's fake munge, in its place

	started := time.Now()
	code := 0
	said := stderrOf(t, func() { code = job.Run() })

	expectEqual(t, "code", code, 4)
	expectEqual(t, "calls", daemon.actions(), []string{"attach"})
	expectEqual(t, "what the job's stderr got", said, "")
	expectEqual(t, "munge's calls", fileText(t, calls), "call\ncall\n")
	// The timeout, then at most the WaitDelay (1 s) given to a child holding munge's output.
	if elapsed := time.Since(started); elapsed < mungeTimeout || elapsed > mungeTimeout+5*time.Second {
		t.Fatalf("asked again after %v, the timeout being %v", elapsed, mungeTimeout)
	}
}

// bench-scale on 1,000 nodes (load 146): munge took over 10 s once, and the waiter's job FAILED
// 1:0 without a word. A munge that does not answer in time is an outage: the waiter asks again.
func TestAMungeThatTimesOutIsAnOutageTheWaiterWaitsOut(t *testing.T) {
	// Hung as one process (exec: as munge itself would, no child left holding its output).
	expectMungeAskedAgain(t, "exec sleep 30")
}

// Killed at the timeout, a munge whose child still holds its output: the waiter does not wait
// for that child (it once waited the child's 30 s), it asks munge again.
func TestAHungMungeIsGivenUpOnEvenIfAChildHoldsItsOutput(t *testing.T) {
	expectMungeAskedAgain(t, "sleep 30; exit 0")
}

// The real timeouts, for the Python test: written as JSON to WAITER_TIMEOUT_CONSTANTS_OUT.
func TestTimeoutConstantsDump(t *testing.T) {
	writeJSON(t, outputOr(t, "WAITER_TIMEOUT_CONSTANTS_OUT", "timeouts.json"), map[string]any{
		"stream_timeout_s": streamTimeout.Seconds(), "munge_timeout_s": mungeTimeout.Seconds()})
}
