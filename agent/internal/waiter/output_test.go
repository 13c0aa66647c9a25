package waiter

// The job's output files as the waiter writes them, checked from tests/unit (test_agent_pods_and_
// frames_reach_the_waiter.py), which runs this test binary with its fds 1 and 2 (and 3) set up as
// slurmstepd would, and WAITER_OUTPUT_CASE naming what to do; the process then ends here, so the
// test framework writes nothing of its own to those fds.

import (
	"bytes"
	"os"
	"testing"
)

func TestOutputAsTheJobSeesIt(t *testing.T) {
	switch os.Getenv("WAITER_OUTPUT_CASE") {
	case "":
		// Run alone (go test ./...): checks only that a write to a fd not the job's is ignored.
		if err := WriteAll(7, []byte("never written")); err != nil {
			t.Fatal(err)
		}
		return
	case "merged":
		if OutputMerged() {
			os.Exit(10)
		}
		os.Exit(20)
	case "in-order":
		for _, write := range []struct {
			fd   int
			data []byte
		}{
			{1, []byte("text first|")},
			{1, bytes.Repeat(allBytes(), 4096)},
			{2, []byte("err\x00\xff")},
			{1, []byte("|no newline")},
			{3, []byte("never written")},
		} {
			if err := WriteAll(write.fd, write.data); err != nil {
				os.Exit(3)
			}
		}
		os.Exit(0)
	case "fill":
		if err := WriteAll(1, bytes.Repeat([]byte("z"), 4_000_000)); err != nil {
			os.Exit(3)
		}
		os.Exit(0)
	default:
		t.Fatalf("WAITER_OUTPUT_CASE %q", os.Getenv("WAITER_OUTPUT_CASE"))
	}
}

func allBytes() []byte {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	return all
}
