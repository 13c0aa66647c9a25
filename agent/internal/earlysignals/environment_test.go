package earlysignals

import (
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

const reportTo = "EARLYSIGNALS_TEST_REPORT"

// The test binary has the constructor too: started again with Go settings in its environment, the
// runtime acts on none of them, and Environ still has them all, in their places. Any number of
// them may be taken (3 once left the runtime without the auxiliary vector: "failed to get system
// page size"), next to duplicates and an entry without '='.
func TestTheRuntimeReadsNoGoSettingsAndEnvironKeepsThem(t *testing.T) {
	cases := map[string][]string{
		"one":   {"A=1", "GOPATH=/x", "B=2"},
		"two":   {"GOPATH=/x", "A=1", "GOGC=off"},
		"three": {"GOPATH=/x", "GOROOT=/usr/lib/go", "A=1", "GOFLAGS=-mod=vendor"},
		"five": {"GODEBUG=inittrace=1", "A=1", "GOPATH=/x", "SSL_CERT_FILE=/home/alice/ca.pem",
			"GOTRACEBACK=crash", "SSL_CERT_DIRS=kept", "SSL_CERT_DIR=/home/alice"},
		"six": {"A=1", "GODEBUG=inittrace=1", "GOPATH=/x", "B=2", "SSL_CERT_FILE=/home/alice/ca.pem",
			"GOTRACEBACK=crash", "SSL_CERT_DIRS=kept", "GOMAXPROCS=1", "SSL_CERT_DIR=/home/alice"},
		"duplicates and no '='": {"A=1", "GOPATH=/x", "A=2", "NOEQUALS", "GOPATH=/y", "GODEBUG=inittrace=1", "Z=1"},
	}
	for name, given := range cases {
		t.Run(name, func(t *testing.T) {
			report := t.TempDir() + "/report.json"
			given := append(slices.Clone(given), reportTo+"="+report)
			output := startAgain(t, given)
			// inittrace=1 has the runtime write a line per package initialised ("init runtime @0 ms...").
			if strings.Contains(output, "init ") || strings.Contains(output, "fatal error") {
				t.Fatalf("the runtime read the Go settings or died:\n%s", output)
			}
			var seen struct{ Process, Environ []string }
			data, err := os.ReadFile(report)
			if err != nil {
				t.Fatalf("%v (output: %s)", err, output)
			}
			if err := json.Unmarshal(data, &seen); err != nil {
				t.Fatal(err)
			}
			kept := slices.DeleteFunc(slices.Clone(given), func(entry string) bool {
				return strings.HasPrefix(entry, "GO") || strings.HasPrefix(entry, "SSL_CERT_FILE=") ||
					strings.HasPrefix(entry, "SSL_CERT_DIR=")
			})
			if want := asTheRuntimeReads(kept); !slices.Equal(seen.Process, want) {
				t.Errorf("the process's environment is %q, want %q", seen.Process, want)
			}
			if want := asTheRuntimeReads(given); !slices.Equal(seen.Environ, want) {
				t.Errorf("Environ() = %q, want %q", seen.Environ, want)
			}
		})
	}
}

// startAgain runs this test binary's TestReportEnvironments with exactly `env` (os/exec would
// drop duplicates); its output.
func startAgain(t *testing.T, env []string) string {
	read, write, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	process, err := os.StartProcess(os.Args[0], []string{os.Args[0], "-test.run=^TestReportEnvironments$",
		"-test.count=1"}, &os.ProcAttr{Env: env, Files: []*os.File{nil, write, write}})
	write.Close()
	if err != nil {
		t.Fatal(err)
	}
	output, _ := io.ReadAll(read)
	read.Close()
	if _, err := process.Wait(); err != nil {
		t.Fatal(err)
	}
	return string(output)
}

// asTheRuntimeReads: what syscall.Environ gives for a process started with `env`: no empty
// entries, and of a name given twice the first.
func asTheRuntimeReads(env []string) []string {
	var read []string
	seen := map[string]bool{}
	for _, entry := range env {
		name, _, found := strings.Cut(entry, "=")
		if entry == "" || (found && seen[name]) {
			continue
		}
		if found {
			seen[name] = true
		}
		read = append(read, entry)
	}
	return read
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
