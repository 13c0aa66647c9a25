package waiter

import (
	"os"
	"path/filepath"
	"testing"

	"slurm-k8s-bridge/agent/internal/fdtest"
)

// withStdin runs f with fd 0 replaced by path's file, restoring it after.
func withStdin(t *testing.T, path string, f func()) {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	fdtest.OnStdin(t, file, f)
}

func TestTheFileSbatchInputOpenedIsNamed(t *testing.T) {
	input := filepath.Join(t.TempDir(), "input.txt")
	if err := os.WriteFile(input, []byte("data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := Object{{"A", "1"}, {BatchStdinVariable, "/etc/shadow"}}
	withStdin(t, input, func() {
		got := WithBatchStdin(planted)
		if value, _ := got.Get(BatchStdinVariable); value != input {
			t.Fatalf("%s = %v, want %s", BatchStdinVariable, value, input)
		}
		if value, _ := got.Get("A"); value != "1" {
			t.Fatalf("A = %v", value)
		}
	})
}

func TestDevNullAndAPlantedValueNameNothing(t *testing.T) {
	planted := Object{{BatchStdinVariable, "/etc/shadow"}, {"A", "1"}}
	withStdin(t, "/dev/null", func() {
		got := WithBatchStdin(planted)
		if _, ok := got.Get(BatchStdinVariable); ok || len(got) != 1 {
			t.Fatalf("got %v, want only A", got)
		}
	})
}

func TestAPipeNamesNothing(t *testing.T) {
	reader, writer, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	defer writer.Close()
	fdtest.OnStdin(t, reader, func() {
		if _, ok := WithBatchStdin(Object{}).Get(BatchStdinVariable); ok {
			t.Fatal("a pipe on fd 0 was named as the script's input")
		}
	})
}
