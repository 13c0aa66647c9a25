package earlysignals

import (
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const reportTo = "EARLYSIGNALS_TEST_REPORT"

// The test binary has the constructor too: started again with Go settings in its environment, the
// runtime acts on none of them, and Environ still has them all, in their places.
func TestTheRuntimeReadsNoGoSettingsAndEnvironKeepsThem(t *testing.T) {
	report := t.TempDir() + "/report.json"
	given := []string{"A=1", "GODEBUG=inittrace=1", "GOPATH=/x", "B=2", "SSL_CERT_FILE=/home/alice/ca.pem",
		"GOTRACEBACK=crash", "SSL_CERT_DIRS=kept", "GOMAXPROCS=1", "SSL_CERT_DIR=/home/alice", reportTo + "=" + report}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReportEnvironments$", "-test.count=1")
	cmd.Env = given
	output, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, output)
	}
	// inittrace=1 has the runtime write a line per package initialised ("init runtime @0 ms...").
	if strings.Contains(string(output), "init ") {
		t.Fatalf("the runtime read GODEBUG:\n%s", output)
	}
	var seen struct{ Process, Environ []string }
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &seen); err != nil {
		t.Fatal(err)
	}
	want := []string{"A=1", "B=2", "SSL_CERT_DIRS=kept", reportTo + "=" + report}
	if !slices.Equal(seen.Process, want) {
		t.Errorf("the process's environment is %q, want %q", seen.Process, want)
	}
	if !slices.Equal(seen.Environ, given) {
		t.Errorf("Environ() = %q, want %q", seen.Environ, given)
	}
}

// The started-again side of the test above (nothing to do in a test run of its own).
func TestReportEnvironments(t *testing.T) {
	report := os.Getenv(reportTo)
	if report == "" {
		t.Skip("run by TestTheRuntimeReadsNoGoSettingsAndEnvironKeepsThem")
	}
	data, err := json.Marshal(map[string][]string{"Process": os.Environ(), "Environ": Environ()})
	if err == nil {
		err = os.WriteFile(report, data, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
}
