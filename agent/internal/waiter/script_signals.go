package waiter

import (
	"fmt"
	"sort"
	"sync"
	"syscall"
	"time"
)

// The signals Slurm sends the batch script, on their way to the
// script in the pods: each is kept until the daemon took it, and then until it reports it
// delivered, so that none is lost to a waiter not attached yet, a 503, or a daemon restart.

// postAction posts one action of the waiter's job (`signal`, `step-done`...) and closes the answer.
type postAction func(action string, body []byte, timeout time.Duration) error

type scriptSignals struct {
	post postAction
	mu   sync.Mutex
	// Not taken by the daemon yet, by sequence number.
	unsent map[int64]syscall.Signal
	// By signal, the newest sequence number taken but not reported delivered: one per kind, as
	// the daemon keeps a signal pending once.
	undelivered map[syscall.Signal]int64
	seq         int64
	sendMu      sync.Mutex
}

func newScriptSignals(post postAction) *scriptSignals {
	return &scriptSignals{post: post, unsent: map[int64]syscall.Signal{}, undelivered: map[syscall.Signal]int64{}}
}

// hasUnsent tells whether some signal waits for the daemon to take it.
func (s *scriptSignals) hasUnsent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unsent) > 0
}

// forward passes a signal on to the script in the pods; pending once, as in the kernel.
func (s *scriptSignals) forward(sig syscall.Signal) {
	s.mu.Lock()
	pending := false
	for _, kept := range s.unsent {
		pending = pending || kept == sig
	}
	if !pending {
		s.seq++
		s.unsent[s.seq] = sig
	}
	s.mu.Unlock()
	s.send()
}

// send sends the kept signals oldest first, stopping at the first the daemon cannot take now
// (not attached yet: 409; an outage): the next attach or event tries again. One send at a time:
// a second waits for the first (in Python the handler ran in the main thread, which read no
// event meanwhile), then sends what is still kept.
func (s *scriptSignals) send() {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.sendKept()
}

func (s *scriptSignals) oldest() (int64, syscall.Signal, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first int64
	for seq := range s.unsent {
		if first == 0 || seq < first {
			first = seq
		}
	}
	return first, s.unsent[first], first != 0
}

func (s *scriptSignals) sendKept() bool {
	for {
		seq, sig, ok := s.oldest()
		if !ok {
			return true
		}
		body := Dumps(Object{{"signal", int(sig)}, {"seq", seq}})
		err := s.post("signal", body, 10*time.Second)
		if status := daemonStatus(err); status >= 400 && status < 500 && status != 409 {
			Say(fmt.Sprintf("the bridge refused signal %d: %s", int(sig), err.(*DaemonError).Text))
			s.mu.Lock()
			delete(s.unsent, seq)
			s.mu.Unlock()
			continue
		}
		if err != nil {
			return false
		}
		s.mu.Lock()
		if kept, ok := s.unsent[seq]; ok {
			delete(s.unsent, seq)
			s.taken(seq, kept)
		}
		s.mu.Unlock()
	}
}

func (s *scriptSignals) taken(seq int64, sig syscall.Signal) {
	s.undelivered[sig] = max(seq, s.undelivered[sig])
}

// forAttach is what an attach carries, as [seq, signal] oldest first: every signal not taken
// yet, and the newest of each kind taken but not reported delivered.
func (s *scriptSignals) forAttach() [][2]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := map[int64]syscall.Signal{}
	for sig, seq := range s.undelivered {
		kept[seq] = sig
	}
	for seq, sig := range s.unsent {
		kept[seq] = sig
	}
	pairs := make([][2]int64, 0, len(kept))
	for seq, sig := range kept {
		pairs = append(pairs, [2]int64{seq, int64(sig)})
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i][0] < pairs[j][0] })
	return pairs
}

// takenWithAttach: the daemon accepted an attach that carried signals.
func (s *scriptSignals) takenWithAttach(signals [][2]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pair := range signals {
		delete(s.unsent, pair[0])
		s.taken(pair[0], syscall.Signal(pair[1]))
	}
}

// delivered: the daemon delivered (or could never deliver) sig taken as seq; that one and the
// older ones of its kind are done.
func (s *scriptSignals) delivered(sigValue, seqValue any) {
	number, ok1 := sigValue.(int64)
	seq, ok2 := seqValue.(int64)
	if !ok1 || !ok2 {
		return
	}
	sig := syscall.Signal(number)
	s.mu.Lock()
	defer s.mu.Unlock()
	if newest, ok := s.undelivered[sig]; ok && newest <= seq {
		delete(s.undelivered, sig)
	}
	for kept, kind := range s.unsent {
		if kind == sig && kept <= seq {
			delete(s.unsent, kept)
		}
	}
}
