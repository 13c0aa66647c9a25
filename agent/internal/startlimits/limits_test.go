package startlimits

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const limitsReportTo = "EARLYSIGNALS_LIMITS_REPORT"

// Started again under lowered soft limits and a umask (as slurmstepd sets a job's): StartLimits
// gives those of the start, though the Go runtime has raised its own RLIMIT_NOFILE since.
func TestTheLimitsOfTheStartArePassedOnNotTheRuntimes(t *testing.T) {
	report := t.TempDir() + "/limits.json"
	shell := `ulimit -S -n 77 && ulimit -S -s 4096 && umask 027 && exec "$0" -test.run='^TestReportLimits$' -test.count=1`
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
	wanted := []string{"SLURM_RLIMIT_STACK=4194304"}
	if exactNofile {
		wanted = append(wanted, "SLURM_RLIMIT_NOFILE=77")
	} else if slices.Contains(seen.Limits, "SLURM_RLIMIT_NOFILE="+strconv.FormatUint(seen.RuntimeNofile, 10)) {
		t.Errorf("%q: without cgo, the runtime's raised RLIMIT_NOFILE passes for the first one", seen.Limits)
	}
	for _, want := range wanted {
		if !slices.Contains(seen.Limits, want) {
			t.Errorf("%q is not in %q", want, seen.Limits)
		}
	}
	names := limitNames
	if !exactNofile {
		names = slices.DeleteFunc(slices.Clone(names), func(name string) bool { return name == "NOFILE" })
	}
	if len(seen.Limits) != len(names)+1 || seen.Limits[len(names)] != "SLURM_UMASK=0027" {
		t.Fatalf("%q: want one entry per limit, then the umask", seen.Limits)
	}
	for i, name := range names {
		if !strings.HasPrefix(seen.Limits[i], "SLURM_RLIMIT_"+name+"=") {
			t.Errorf("%q: want the limits in limitNames' order", seen.Limits)
		}
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
