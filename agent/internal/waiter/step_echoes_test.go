package waiter

import (
	"syscall"
	"testing"
)

// A cancel's TERM reaches Slurm's srun of a step from slurmstepd (the batch step's processes
// hold it); the pod's srun, in the script's process group, passes the same TERM back once. That
// echo is not a second signal (natively srun said "forcing job termination" once, here twice).
func TestSlurmstepdsSignalComingBackFromThePodIsNotPassedOnTwice(t *testing.T) {
	steps := newScriptSteps(nil, nil, nil)
	if steps.signalBack("1", syscall.SIGTERM) {
		t.Fatal("no signal came from slurmstepd: the script's own TERM to its srun is passed on")
	}
	steps.slurmSignalled(syscall.SIGTERM)
	if !steps.signalBack("1", syscall.SIGTERM) || !steps.signalBack("2", syscall.SIGTERM) {
		t.Fatal("each step's srun passes slurmstepd's TERM back once: not passed on again")
	}
	if steps.signalBack("1", syscall.SIGTERM) || steps.signalBack("1", syscall.SIGUSR1) {
		t.Fatal("a second TERM, or another signal, is the script's own: passed on")
	}
}

// --signal=B:USR1@T reaches the waiter, and the script alone in the pod: a trap that passes USR1
// on to its srun (kill -USR1 $srun_pid) is the script's own signal, passed on at once.
func TestASignalTheScriptPassesToItsSrunIsNotTakenForAnEcho(t *testing.T) {
	steps := newScriptSteps(nil, nil, nil)
	steps.slurmSignalled(syscall.SIGUSR1)
	if steps.signalBack("1", syscall.SIGUSR1) {
		t.Fatal("the script's own USR1 to its srun was dropped")
	}
}

// The daemon saw the run over (a requeue) and stopped the pods before slurmstepd's TERM reached
// the batch step, or the stop took longer than the echo window under load: the pod's srun passes
// the stop's TERM back all the same. Once told the run stops, the waiter takes each step's first
// TERM from the pod for that echo, whenever it comes (CI: Slurm's srun said "forcing job
// termination" twice after a requeue, natively once).
func TestTheStopsTermFromThePodIsAnEchoWheneverItComes(t *testing.T) {
	steps := newScriptSteps(nil, nil, nil)
	waiter := &Waiter{steps: steps}
	if done, err := waiter.handle(Object{{"type", "stopping"}}); done || err != nil {
		t.Fatalf("the stopping event ends nothing: %v %v", done, err)
	}
	if !steps.recentlyFromSlurm(syscall.SIGTERM) {
		t.Fatal("a step whose srun in the pod is gone must not be sent a TERM of its own: slurmstepd's comes")
	}
	if !steps.signalBack("1", syscall.SIGTERM) || !steps.signalBack("2", syscall.SIGTERM) {
		t.Fatal("each step's srun passes the stop's TERM back once: not passed on")
	}
	if steps.signalBack("1", syscall.SIGTERM) || steps.signalBack("2", syscall.SIGUSR1) {
		t.Fatal("a second TERM, or another signal, is the script's own: passed on")
	}
	steps.slurmSignalled(syscall.SIGTERM)
	if steps.signalBack("1", syscall.SIGTERM) {
		t.Fatal("slurmstepd's TERM after the stop's echo: the step's srun passed that TERM back once only")
	}
}
