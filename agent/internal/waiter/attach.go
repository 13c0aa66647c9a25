package waiter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The batch waiter: attaches to the daemon, prints the pods' output,
// runs the script's srun steps and Slurm commands, passes signals on, and ends as the pods did.

// Marker is the line after which job_submit.lua, up to 2026-12, embedded the user's script in the
// wrapper it wrote (legacyWrapperHead its first lines); such a job may still be queued after an
// upgrade. Now the step guard (deploy/slurm/spank) gives the waiter slurmd's copy of the user's
// own script.
const Marker = "#SLURM-K8S-BRIDGE ORIGINAL SCRIPT"

const legacyWrapperHead = "#!/bin/sh\n# slurm-k8s-bridge: rewritten batch script: this job runs in Kubernetes " +
	"pods. The waiter\n# streams their output here and exits with their exit code.\nexec "

const outageNotice = 60.0

// How long the attach stream may be silent before the connection is taken for dead: the daemon
// sends a heartbeat every 10 s. A var only so that tests can stand in a shorter one.
var streamTimeout = 45 * time.Second

// UniversalNewlines is what Python's text mode reads of a file: \r\n and \r become \n.
func UniversalNewlines(data []byte) []byte {
	data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	return bytes.ReplaceAll(data, []byte("\r"), []byte("\n"))
}

// UserScript is the script the user submitted: the batch script itself, or what follows the
// wrapper of an older job_submit.lua (its exact lines: header, exec of the waiter, marker). A
// marker anywhere else is the user's own line.
func UserScript(batchScript []byte) []byte {
	if !bytes.HasPrefix(batchScript, []byte(legacyWrapperHead)) {
		return batchScript
	}
	rest := batchScript[len(legacyWrapperHead):]
	execLine, afterExec, found := bytes.Cut(rest, []byte("\n"))
	if !found || !(bytes.HasSuffix(execLine, []byte(` "$0" "$@"`)) || bytes.HasSuffix(execLine, []byte(` "$0"`))) {
		return batchScript
	}
	if tail, ok := bytes.CutPrefix(afterExec, []byte(Marker+"\n")); ok {
		return tail
	}
	return batchScript
}

// Waiter is one job's batch waiter.
type Waiter struct {
	client      *Client
	jobID       int64
	script      string
	environment Object
	workDir     string
	arguments   []string
	lastLog     Object // the last log timestamp printed, by pod index: what survives a reconnect
	cancel      cancelState
	merged      bool
	signals     *scriptSignals
	steps       *scriptSteps
	commands    *scriptCommands
	usage       *UsageFile
}

// NewWaiter prepares the waiter of job jobID; ownCommand is how it was started, less its batch
// script and that script's arguments (the task proxies' command).
func NewWaiter(client *Client, script []byte, environment Object, workDir string, arguments, ownCommand []string) *Waiter {
	w := &Waiter{client: client, jobID: client.JobID, script: string(script), environment: environment,
		workDir: workDir, arguments: arguments, lastLog: Object{}, merged: OutputMerged(), usage: NewUsageFile()}
	w.signals = newScriptSignals(w.post)
	w.steps = newScriptSteps(client, ownCommand, w.post)
	if run, known := w.run(); known {
		w.steps.jobRun = run
	}
	w.commands = newScriptCommands(client, w.steps.done)
	return w
}

func (w *Waiter) path(action string) string {
	return "/v1/jobs/" + strconv.FormatInt(w.jobID, 10) + "/" + action
}

func (w *Waiter) post(action string, body []byte, timeout time.Duration) error {
	return w.client.PostClose(w.path(action), body, timeout)
}

// SlurmSignalled: slurmstepd sent the batch step sig (before it is acted on).
func (w *Waiter) SlurmSignalled(sig syscall.Signal) { w.steps.slurmSignalled(sig) }

// ForwardSignal passes a signal on to the script in the pods.
func (w *Waiter) ForwardSignal(sig syscall.Signal) { w.signals.forward(sig) }

// RequestCancel tells the daemon slurmstepd sent the batch step SIGTERM, and which run this
// waiter serves. The daemon answers at once (it has just read the job): it deletes the pods when
// Slurm shows the run over, and the attach stream reports when they are gone ("stops": true);
// else the TERM is the script's signal ("stops": false), which the waiter forwards as any other
// (cancelAnswered), and no later attach carries the cancel again. Tried again a few times: a TERM
// that is only a signal is lost if no daemon hears of it (one that stops the run is seen in Slurm
// all the same).
func (w *Waiter) RequestCancel() {
	w.cancel.asking()
	defer w.cancel.doneAsking()
	body, forwards := w.cancelBody(true), true
	for attempt := 0; ; attempt++ {
		answer, err := w.postRead("cancel", body, 5*time.Second)
		if err == nil {
			w.cancelAnswered(answer)
			return
		}
		if daemonStatus(err) == 400 && forwards {
			// A daemon older than "forwards" refuses the field (a rollback, or the daemon not
			// upgraded first): asked as it knows, it keeps a TERM that is only a signal itself.
			body, forwards = w.cancelBody(false), false
			attempt--
			continue
		}
		if attempt == 0 {
			Say("could not reach the bridge to cancel: " + describe(err))
		}
		if status := daemonStatus(err); (status >= 400 && status < 500) || attempt >= cancelRetries {
			return // the next attach carries it (refused: not a daemon's to take)
		}
		time.Sleep(reconnectDelay(attempt))
	}
}

// cancelState is the batch step's TERM no daemon has taken yet: the next attach carries it, but
// not while a cancel request is still asking (RequestCancel), whose answer may have the waiter
// forward it as a numbered signal: one TERM, one owner, or the script could get it twice.
type cancelState struct {
	mu      sync.Mutex
	pending bool
	asks    int
}

func (c *cancelState) asking() {
	c.mu.Lock()
	c.pending = true
	c.asks++
	c.mu.Unlock()
}

func (c *cancelState) doneAsking() {
	c.mu.Lock()
	c.asks--
	c.mu.Unlock()
}

// taken: a daemon has the TERM (a cancel's answer, or an attach that carried it).
func (c *cancelState) taken() {
	c.mu.Lock()
	c.pending = false
	c.mu.Unlock()
}

func (c *cancelState) forAttach() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending && c.asks == 0
}

// cancelRetries is how often a cancel that found no daemon is tried again (a few seconds in all:
// other signals wait meanwhile).
const cancelRetries = 2

// cancelBody names this waiter's run: a late TERM of a requeued run must not reach the next one.
// forwards: the waiter sends a TERM that is only a signal on itself (cancelAnswered).
func (w *Waiter) cancelBody(forwards bool) []byte {
	run, known := w.run()
	if !known {
		return []byte("{}")
	}
	if !forwards {
		return Dumps(Object{{"run", run}})
	}
	return Dumps(Object{{"run", run}, {"forwards", true}})
}

// run is this waiter's run of the job (SLURM_RESTART_COUNT, 0 before any requeue); not known
// when the variable is not a number.
func (w *Waiter) run() (int64, bool) {
	value, ok := w.environment.Get("SLURM_RESTART_COUNT")
	if !ok {
		return 0, true
	}
	text, _ := value.(string) // the job's environment holds text; anything else names no run
	return pyInt(text)
}

// cancelAnswered acts on the daemon's answer to a cancel: a TERM that stops the run comes back
// from the pod's srun too (its echo, steps.go). One that is the script's signal goes on to the
// script as the forwarded signals do, numbered and kept until the daemon reports it delivered
// ("forward"; a daemon older than that took it with the cancel).
func (w *Waiter) cancelAnswered(answer []byte) {
	decoded, err := Loads(answer)
	stops, forward := true, false // a daemon older than the answer cancels
	if object, ok := decoded.(Object); err == nil && ok {
		if value, present := object.Get("stops"); present {
			stops = value != false
		}
		if value, present := object.Get("forward"); present {
			forward = value == true
		}
	}
	if stops {
		w.SlurmSignalled(syscall.SIGTERM)
		return
	}
	w.cancel.taken()
	if forward {
		w.ForwardSignal(syscall.SIGTERM)
	}
}

// postRead posts one action of the job and returns the answer's body.
func (w *Waiter) postRead(action string, body []byte, timeout time.Duration) ([]byte, error) {
	stream, err := w.client.Post(w.path(action), body, timeout)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	return io.ReadAll(stream.Reader)
}

// describe is str() of what the Python waiter would have raised.
func describe(err error) string {
	var daemon *DaemonError
	if errors.As(err, &daemon) {
		return daemon.Error()
	}
	return pyError(err)
}

// Run attaches until the daemon reports the end; the exit code (or the process dies by the
// pods' signal).
func (w *Waiter) Run() int {
	attempt, outageStarted, toldAt := 0, 0.0, 0.0
	for {
		outcome, err := w.attachOnce()
		if status := daemonStatus(err); status >= 400 && status < 500 {
			// Refused for good (identity mismatch, unknown job...): say why and fail the job.
			return w.finish(Object{{"type", "exit"}, {"code", int64(1)}, {"reason", err.(*DaemonError).Text}})
		}
		if err != nil {
			now := pyMonotonic()
			if outageStarted == 0 {
				outageStarted = now
			}
			var unusable *MungeUnusable
			if errors.As(err, &unusable) {
				// This host's own fault, not the daemon's: said at once, then now and then.
				if toldAt == 0 || now-toldAt >= outageNotice*10 {
					Say("cannot make a munge credential on this host, waiting for it to be fixed: " + unusable.Why)
					toldAt = now
				}
			} else if now-outageStarted >= outageNotice && now-toldAt >= outageNotice*10 {
				// A daemon restart needs no word in the job's output; a long outage does, now and then.
				Say(fmt.Sprintf("waiting for the bridge daemon since %.0fs (%s)", now-outageStarted, describe(err)))
				toldAt = now
			}
			time.Sleep(reconnectDelay(attempt))
			attempt++
			continue
		}
		if outcome != nil {
			return w.finish(outcome)
		}
		// The stream ended without an outcome: the daemon went away; reconnect.
		attempt, outageStarted = 0, 0
	}
}

func (w *Waiter) attachBody(signals [][2]int64, cancel bool) []byte {
	pairs := make([]any, len(signals))
	for i, pair := range signals {
		pairs[i] = []any{pair[0], pair[1]}
	}
	body := Object{
		{"script", w.script},
		// All of it: the daemon drops what describes the slurmd host.
		{"environment", w.environment},
		{"work_dir", w.workDir},
		{"uid", os.Getuid()},
		{"gid", os.Getgid()},
		{"output_merged", w.merged},
	}
	if len(w.arguments) > 0 {
		body = append(body, Field{"arguments", w.arguments})
	}
	return Dumps(append(body, Field{"last_log", w.lastLog}, Field{"cancel", cancel},
		Field{"signals", pairs}))
}

// errGarbled is a line of the stream that is not an event (Python's ValueError): reconnect.
var errGarbled = errors.New("garbled event from the bridge")

func (w *Waiter) attachOnce() (Object, error) {
	signals := w.signals.forAttach()
	carried := w.cancel.forAttach()
	stream, err := w.client.Post(w.path("attach"), w.attachBody(signals, carried), streamTimeout)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	w.signals.takenWithAttach(signals)
	if carried {
		w.cancel.taken() // the daemon took the TERM with the attach
	}
	for {
		raw, err := stream.Reader.ReadBytes('\n')
		if err == io.EOF {
			return nil, nil // cut off, mid-line or not: the daemon went away
		}
		if err != nil {
			return nil, err
		}
		if w.signals.hasUnsent() {
			w.signals.send() // one refused a moment ago (daemon busy or restarting)
		}
		value, err := Loads(raw)
		if err != nil {
			return nil, err
		}
		event, ok := value.(Object)
		if !ok {
			return nil, errGarbled
		}
		done, err := w.handle(event)
		if err != nil || done {
			return event, err
		}
	}
}

// handle acts on one event of the attach stream; true for the job's end.
func (w *Waiter) handle(event Object) (bool, error) {
	kind, _ := event.Get("type")
	pod, _ := event.Get("pod")
	ts, _ := event.Get("ts")
	switch kind {
	case "out":
		fd, _ := event.Get("fd")
		data, _ := event.Get("data")
		text, ok := data.(string)
		if !ok {
			return false, errGarbled
		}
		decoded, err := pyA2bBase64(text)
		if err != nil {
			return false, err
		}
		if number, ok := fd.(int64); ok {
			if err := WriteAll(int(number), decoded); err != nil {
				return false, err
			}
		}
	case "log":
		line, ok := event.Get("line")
		text, isText := line.(string)
		if !ok || !isText {
			return false, errGarbled
		}
		if err := WriteAll(1, []byte(text+"\n")); err != nil {
			return false, err
		}
	case "step":
		data, _ := event.Get("data")
		token, _ := event.Get("token")
		io, _ := event.Get("io")
		if token == nil {
			token = ""
		}
		if io == nil {
			io = []any{}
		}
		w.steps.start(pyStr(data), pyStr(token), io)
	case "command":
		w.commands.start(event)
	case "usage":
		data, ok := event.Get("data")
		if !ok {
			data = ""
		}
		w.usage.RecordFrame(pyStr(data))
	case "step-signal":
		key, _ := event.Get("key")
		sig, _ := event.Get("signal")
		w.steps.signal(pyStr(key), sig)
	case "stopping":
		w.steps.runStopping()
		return false, nil
	case "signal-done":
		sig, _ := event.Get("signal")
		seq, _ := event.Get("seq")
		w.signals.delivered(sig, seq)
		return false, nil
	case "message":
		text, _ := event.Get("text")
		Say(pyStr(text))
		return false, nil
	case "exit":
		return true, nil
	default:
		return false, nil // a heartbeat, or a kind this waiter does not know: the connection lives
	}
	w.lastLog.Set(pyStr(pod), ts)
	return false, nil
}

func (w *Waiter) finish(outcome Object) int {
	if reason, _ := outcome.Get("reason"); truthy(reason) {
		Say(pyStr(reason))
	}
	if sig, _ := outcome.Get("signal"); truthy(sig) {
		if number, ok := pyInt(sig); ok {
			// Die by the same signal so Slurm records it (sacct shows e.g. 0:9).
			dieBySignal(syscall.Signal(number))
		}
	}
	code := int64(0)
	if value, ok := outcome.Get("code"); ok {
		code, _ = pyInt(value)
	}
	return int(code)
}
