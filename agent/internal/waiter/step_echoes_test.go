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
