package waiter

import "testing"

// A TERM whose cancel request is still being asked (a daemon restarting: refused, timed out) is
// not carried by an attach meanwhile: the request's answer may have the waiter forward it as a
// numbered signal, and the daemon keeps an attach's TERM itself, so the script would get it twice.
// Once the request gave up, the next attach carries it; once a daemon took it, none does.
func TestAnAttachCarriesOnlyATermNoCancelRequestIsStillAsking(t *testing.T) {
	var cancel cancelState
	if cancel.forAttach() {
		t.Fatal("no TERM came: nothing to carry")
	}
	cancel.asking()
	if cancel.forAttach() {
		t.Fatal("carried while its cancel request is still asking")
	}
	cancel.doneAsking()
	if !cancel.forAttach() {
		t.Fatal("a TERM no request could hand over goes with the next attach")
	}
	cancel.asking()
	cancel.taken()
	cancel.doneAsking()
	if cancel.forAttach() {
		t.Fatal("a daemon took the TERM (the cancel's answer): not carried again")
	}
}
