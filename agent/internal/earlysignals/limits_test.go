package earlysignals

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
)

const limitsReportTo = "EARLYSIGNALS_LIMITS_REPORT"

// Started again under lowered soft limits (as slurmstepd sets a job's): StartLimits gives the
// limits of the start, though the Go runtime has raised its own RLIMIT_NOFILE since.
func TestTheLimitsOfTheStartArePassedOnNotTheRuntimes(t *testing.T) {
	report := t.TempDir() + "/limits.json"
	shell := `ulimit -S -n 77 && ulimit -S -s 4096 && exec "$0" -test.run='^TestReportLimits$' -test.count=1`
	command := exec.Command("/bin/sh", "-c", shell, os.Args[0])
	command.Env = []string{limitsReportTo + "=" + report}
	if output, err := command.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, output)
	}
	var seen struct {
		Limits        []string
		RuntimeNofile uint64
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &seen); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SLURM_RLIMIT_NOFILE=77", "SLURM_RLIMIT_STACK=4194304"} {
		if !slices.Contains(seen.Limits, want) {
			t.Errorf("%q is not in %q", want, seen.Limits)
		}
	}
	for i, entry := range seen.Limits {
		if i >= len(limitNames) || !strings.HasPrefix(entry, "SLURM_RLIMIT_"+limitNames[i]+"=") {
			t.Errorf("%q: want one entry per limit, in limitNames' order", seen.Limits)
			break
		}
	}
	if len(seen.Limits) != len(limitNames) {
		t.Errorf("%d entries, want %d", len(seen.Limits), len(limitNames))
	}
	if seen.RuntimeNofile == 77 {
		t.Log("the runtime did not raise its RLIMIT_NOFILE here; the test shows less than it could")
	}
}

// The started-again side of the test above (nothing to do in a test run of its own).
func TestReportLimits(t *testing.T) {
	report := os.Getenv(limitsReportTo)
	if report == "" {
		t.Skip("run by TestTheLimitsOfTheStartArePassedOnNotTheRuntimes")
	}
	var nofile syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile)
	data, err := json.Marshal(map[string]any{"Limits": StartLimits(), "RuntimeNofile": nofile.Cur})
	if err == nil {
		err = os.WriteFile(report, data, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
}
