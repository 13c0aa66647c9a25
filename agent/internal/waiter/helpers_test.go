package waiter

// Helpers the package's tests share: fake programs the waiter runs, and the JSON a test writes
// for the Python test that drives it (tests/unit/waiter_runs.py's go_test and go_constants).

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const testJobID = 42

// writeExecutable writes `script` to `path` as a program (mode 0755).
func writeExecutable(t *testing.T, path, script string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// trustFakesIn has the waiter run the test's fakes in directory, a temporary one that root does
// not control alone (/tmp is everyone's); anything elsewhere is checked as ever.
func trustFakesIn(t *testing.T, directory string) {
	saved := untrusted
	untrusted = func(path string) string {
		if strings.HasPrefix(path, directory+"/") {
			return ""
		}
		return saved(path)
	}
	t.Cleanup(func() { untrusted = saved })
}

// withFakeMunge has the waiter's munge write `MUNGE:` and its payload, as waiter_runs.py's does.
func withFakeMunge(t *testing.T) {
	directory := t.TempDir()
	trustFakesIn(t, directory)
	munge := filepath.Join(directory, "munge")
	writeExecutable(t, munge, "#!/bin/sh\nprintf 'MUNGE:'\nexec cat\n")
	saved := MungePaths
	MungePaths = []string{munge}
	t.Cleanup(func() { MungePaths = saved })
}

// writeJSON writes `value` as JSON to the file `out`.
func writeJSON(t *testing.T, out string, value any) {
	t.Helper()
	data, err := json.Marshal(value)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// outputOr is the file named by the environment `variable`, or one in the test's own temporary
// directory (named `otherwise`) when it is unset.
func outputOr(t *testing.T, variable, otherwise string) string {
	if out := os.Getenv(variable); out != "" {
		return out
	}
	return filepath.Join(t.TempDir(), otherwise)
}

func expectEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}
