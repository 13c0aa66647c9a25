package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const nofileReportTo = "AGENT_NOFILE_REPORT"

// Started under a soft RLIMIT_NOFILE of 77, which the Go runtime raises before any Go code runs:
// the pod's srun still sends 77 (a shell it starts gets the first value back).
func TestThePodsSrunSendsTheNofileItWasStartedWith(t *testing.T) {
	report := t.TempDir() + "/nofile"
	shell := `ulimit -S -n 77 && exec "$0" -test.run='^TestReportCallersNofile$' -test.count=1`
	command := exec.Command("/bin/sh", "-c", shell, os.Args[0])
	command.Env = append(os.Environ(), nofileReportTo+"="+report)
	if output, err := command.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, output)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(data); got != "77" {
		t.Fatalf("the pod's srun sends RLIMIT_NOFILE %q, want 77", got)
	}
	if callersNofile([]string{"SLURM_RLIMIT_NOFILE=5"}) != "" {
		t.Fatal("a NOFILE StartLimits has is not asked for again")
	}
}

// The started-again side of the test above.
func TestReportCallersNofile(t *testing.T) {
	report := os.Getenv(nofileReportTo)
	if report == "" {
		t.Skip("run by TestThePodsSrunSendsTheNofileItWasStartedWith")
	}
	// What the pod's srun sends: without cgo (the agent's build) StartLimits lacks it, and the
	// shell says it.
	nofile := withOwnLimits(map[string]string{})["SLURM_RLIMIT_NOFILE"]
	if err := os.WriteFile(report, []byte(strings.TrimSpace(nofile)), 0o600); err != nil {
		t.Fatal(err)
	}
}
