package waiter

// The batch script's signals on the waiter's side, against a fake daemon in this process
// (tests/unit/test_a_batch_signal_*.py drive these with `go test -run`): what the retired
// Python waiter's tests checked of it, now checked of this one.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var exitLine = `{"type": "exit", "code": 0, "signal": null}` + "\n"

// silence, as a stream's line: the headers of a 200, then nothing (a half-open connection).
const silence = "silence"

// signalDaemon answers the waiter as the Python tests' Daemon did: /signal with the next of
// signalAnswers (200 once they run out), each attach with the next of streams (its lines; a
// stream without an exit is a daemon that went away), the last again. Every call is recorded.
type signalDaemon struct {
	t             *testing.T
	mu            sync.Mutex
	signalAnswers []int
	streams       [][]string
	calls         []daemonCall
}

type daemonCall struct {
	action string
	body   map[string]any
}

func (d *signalDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Header.Get("X-Munge-Credential") != "MUNGE:"+RequestDigest("POST", r.URL.Path, testJobID, body) {
		d.t.Errorf("%s: the credential does not carry this request's digest", r.URL.Path)
		http.Error(w, "bad credential", http.StatusForbidden)
		return
	}
	var decoded map[string]any
	if err := json.Unmarshal(body, &decoded); err != nil {
		d.t.Errorf("%s: %v", r.URL.Path, err)
	}
	action := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	d.mu.Lock()
	d.calls = append(d.calls, daemonCall{action, decoded})
	status, lines := http.StatusOK, []string{}
	switch action {
	case "signal":
		if len(d.signalAnswers) > 0 {
			status, d.signalAnswers = d.signalAnswers[0], d.signalAnswers[1:]
		}
	case "attach":
		lines = d.streams[0]
		if len(d.streams) > 1 {
			d.streams = d.streams[1:]
		}
	}
	d.mu.Unlock()
	if status != http.StatusOK {
		http.Error(w, "not now", status)
		return
	}
	for _, line := range lines {
		if line == silence {
			w.(http.Flusher).Flush()
			select { // until the waiter drops the connection (a waiter that never does: 20 s)
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
			return
		}
		_, _ = io.WriteString(w, line)
	}
}

func (d *signalDaemon) actions() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var actions []string
	for _, call := range d.calls {
		actions = append(actions, call.action)
	}
	return actions
}

// bodies are the JSON bodies of the calls of one action, as Python's json.loads gives them.
func (d *signalDaemon) bodies(action string) []map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	var bodies []map[string]any
	for _, call := range d.calls {
		if call.action == action {
			bodies = append(bodies, call.body)
		}
	}
	return bodies
}

// attachSignals are what each attach carried, as [[seq, signal]...].
func (d *signalDaemon) attachSignals() [][][2]int {
	var all [][][2]int
	for _, body := range d.bodies("attach") {
		carried := [][2]int{}
		for _, pair := range body["signals"].([]any) {
			values := pair.([]any)
			carried = append(carried, [2]int{int(values[0].(float64)), int(values[1].(float64))})
		}
		all = append(all, carried)
	}
	return all
}

func waiterFor(t *testing.T, daemon *signalDaemon) *Waiter {
	withFakeMunge(t)
	daemon.t = t
	server := httptest.NewServer(daemon)
	t.Cleanup(server.Close)
	url, err := SplitURL(server.URL)
	if err != nil {
		t.Fatal(err)
	}
	return NewWaiter(&Client{URL: url, JobID: testJobID}, []byte("true\n"), Object{{"SLURM_JOB_ID", "42"}},
		"/tmp", nil, nil)
}

func signalDone(sig syscall.Signal, seq int) string {
	return fmt.Sprintf(`{"type": "signal-done", "signal": %d, "seq": %d}`+"\n", int(sig), seq)
}

var usr1, usr2 = int(syscall.SIGUSR1), int(syscall.SIGUSR2)

// A signal the daemon refused (409 not attached, 503 busy; TEST_REFUSAL names one) is carried by
// the attach.
func TestASignalTheDaemonDidNotTakeGoesWithTheNextAttach(t *testing.T) {
	refusals := []int{409, 503}
	if given, ok := os.LookupEnv("TEST_REFUSAL"); ok {
		var refusal int
		if _, err := fmt.Sscan(given, &refusal); err != nil {
			t.Fatal("TEST_REFUSAL: ", err)
		}
		refusals = []int{refusal}
	}
	for _, refusal := range refusals {
		daemon := &signalDaemon{signalAnswers: []int{refusal}, streams: [][]string{{exitLine}}}
		job := waiterFor(t, daemon)

		job.ForwardSignal(syscall.SIGUSR1)
		code := job.Run()

		expectEqual(t, "code", code, 0)
		expectEqual(t, "calls", daemon.actions(), []string{"signal", "attach"})
		expectEqual(t, "the signal's body", daemon.bodies("signal")[0],
			map[string]any{"signal": float64(usr1), "seq": 1.0})
		expectEqual(t, "the attach's signals", daemon.attachSignals(), [][][2]int{{{1, usr1}}})
	}
}

func TestASignalTheDaemonTookIsNotPostedAgainAndTheAttachOffersItUntilDelivered(t *testing.T) {
	daemon := &signalDaemon{signalAnswers: []int{200, 503}, streams: [][]string{{exitLine}}}
	job := waiterFor(t, daemon)

	job.ForwardSignal(syscall.SIGUSR1)
	job.ForwardSignal(syscall.SIGUSR2)
	job.Run()

	var seqs []float64
	for _, body := range daemon.bodies("signal") {
		seqs = append(seqs, body["seq"].(float64))
	}
	expectEqual(t, "the seqs posted", seqs, []float64{1, 2})
	// USR1 was taken (seq 1: the daemon drops it if it still has it), USR2 not (the 503).
	expectEqual(t, "the attach's signals", daemon.attachSignals(), [][][2]int{{{1, usr1}, {2, usr2}}})
}

// A signal that comes while another is being sent waits for that send, then goes, in order.
func TestASignalDuringASendIsSentAfterItInOrder(t *testing.T) {
	var posted [][2]int
	var signals *scriptSignals
	var second sync.WaitGroup
	post := func(action string, body []byte, _ time.Duration) error {
		var decoded map[string]int
		if err := json.Unmarshal(body, &decoded); err != nil {
			t.Fatal(err)
		}
		if len(posted) == 0 {
			// The handler's goroutine forwards USR2 in the middle of the first send.
			second.Add(1)
			go func() { defer second.Done(); signals.forward(syscall.SIGUSR2) }()
			for deadline := time.Now().Add(10 * time.Second); ; {
				signals.mu.Lock()
				kept := len(signals.unsent) == 2
				signals.mu.Unlock()
				if kept {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the second signal was never kept")
				}
				time.Sleep(time.Millisecond)
			}
		}
		posted = append(posted, [2]int{decoded["seq"], decoded["signal"]})
		return nil
	}
	signals = newScriptSignals(post)

	signals.forward(syscall.SIGUSR1)
	second.Wait()

	expectEqual(t, "posted", posted, [][2]int{{1, usr1}, {2, usr2}})
}

// The daemon takes every /signal; each attach gets the next stream, as after daemon restarts.
func TestATakenSignalGoesWithEveryAttachUntilTheDaemonReportsItDelivered(t *testing.T) {
	daemon := &signalDaemon{streams: [][]string{
		{},                               // the daemon dies before the pod runs
		{signalDone(syscall.SIGUSR1, 1)}, // the next one delivers it, then goes away too
		{exitLine},
	}}
	job := waiterFor(t, daemon)

	job.ForwardSignal(syscall.SIGUSR1) // taken at once by the first daemon (its /signal)
	code := job.Run()

	expectEqual(t, "code", code, 0)
	expectEqual(t, "signals posted", len(daemon.bodies("signal")), 1)
	expectEqual(t, "the signal's body", daemon.bodies("signal")[0], map[string]any{"signal": float64(usr1), "seq": 1.0})
	expectEqual(t, "the attaches' signals", daemon.attachSignals(), [][][2]int{{{1, usr1}}, {{1, usr1}}, {}})
}

func TestAReportForAnOlderSignalKeepsTheNewerOneOfItsKind(t *testing.T) {
	daemon := &signalDaemon{streams: [][]string{{signalDone(syscall.SIGUSR1, 1)}, {exitLine}}}
	job := waiterFor(t, daemon)

	job.ForwardSignal(syscall.SIGUSR1)
	job.ForwardSignal(syscall.SIGUSR1) // taken too (seq 2): the first may have been delivered meanwhile
	job.ForwardSignal(syscall.SIGUSR2)
	job.Run()

	expectEqual(t, "the attaches' signals", daemon.attachSignals(),
		[][][2]int{{{2, usr1}, {3, usr2}}, {{2, usr1}, {3, usr2}}})
}

func TestWhatAWaiterKeepsStaysOneSignalPerKindUnderAFlood(t *testing.T) {
	daemon := &signalDaemon{streams: [][]string{{exitLine}}}
	job := waiterFor(t, daemon)

	for range 1000 {
		job.ForwardSignal(syscall.SIGUSR1)
	}
	job.Run()

	expectEqual(t, "the attaches' signals", daemon.attachSignals(), [][][2]int{{{1000, usr1}}})
}

// The waiter's constants, for the Python tests to check against the daemon's
// side and the step guard's: written as JSON to WAITER_SIGNAL_CONSTANTS_OUT.
func TestSignalConstantsDump(t *testing.T) {
	out := outputOr(t, "WAITER_SIGNAL_CONSTANTS_OUT", "constants.json")
	numbers := func(signals []syscall.Signal) []int {
		var all []int
		for _, sig := range signals {
			all = append(all, int(sig))
		}
		return all
	}
	writeJSON(t, out, map[string]any{
		"forwarded":             numbers(Forwarded),
		"early_kept":            numbers(EarlyKept),
		"task_signal_timeout_s": taskSignalTimeout.Seconds(),
	})
}
