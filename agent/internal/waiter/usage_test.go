package waiter

// The usage file the waiter writes for Slurm's accounting (jobacct_gather/linux_k8s_bridge reads
// it), checked from tests/unit/test_pods_usage_reaches_slurms_accounting.py with `go test -run`:
// what that test checked of the retired Python waiter, now of this one.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const usageFigures = "1500000 20000 67108864 70000000 100000000 120000000 4096 8192 3"

func figuresSum(t *testing.T, figures string) int64 {
	var sum int64
	for _, part := range strings.Fields(figures) {
		if part == "-" {
			continue
		}
		value, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += value
	}
	return sum
}

func TestARecordCarriesTheFiguresAndTheirSum(t *testing.T) {
	record := UsageRecord(usageFigures, [2]int64{41_000, 7_000})

	if record == nil || len(record) != recordSize || record[len(record)-1] != '\n' {
		t.Fatalf("record %q", record)
	}
	fields := strings.Fields(string(record))
	expectEqual(t, "magic", fields[0], usageMagic)
	expectEqual(t, "figures", fields[1:10], strings.Fields(usageFigures))
	// The waiter's own CPU, which slurmstepd's rusage brings.
	expectEqual(t, "own CPU", fields[10:12], []string{"41000", "7000"})
	expectEqual(t, "sum", fields[12], fmt.Sprint(figuresSum(t, usageFigures)+48_000))
}

func TestAFigureThePodCouldNotReadStaysUnknown(t *testing.T) {
	record := UsageRecord(strings.Replace(usageFigures, "4096 8192", "- -", 1), [2]int64{0, 0})

	if record == nil {
		t.Fatal("no record")
	}
	fields := strings.Fields(string(record))
	expectEqual(t, "unknown figures", fields[7:9], []string{"-", "-"})
	expectEqual(t, "sum", fields[12], fmt.Sprint(figuresSum(t, usageFigures)-4096-8192))
}

// WAITER_USAGE_FIGURES: what a frame said, which is not nine counts.
func TestAFrameThatIsNotNineCountsMakesNoRecord(t *testing.T) {
	figures, ok := os.LookupEnv("WAITER_USAGE_FIGURES")
	if !ok {
		figures = "1 2 3"
	}
	if record := UsageRecord(figures, [2]int64{0, 0}); record != nil {
		t.Fatalf("%q made the record %q", figures, record)
	}
}

// usageFileIn is the usage file of task 4242 of slurmstepd 77 under directory.
func usageFileIn(directory string) *UsageFile {
	return &UsageFile{path: filepath.Join(directory, "77", "4242"), fd: -1}
}

func guardsFile(t *testing.T, made bool) (string, string) {
	directory := t.TempDir()
	if err := os.Mkdir(filepath.Join(directory, "77"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(directory, "77", "4242")
	if made {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return directory, path
}

func TestTheWaiterWritesIntoTheGuardsFileAndReplacesTheLastRecord(t *testing.T) {
	directory, path := guardsFile(t, true)
	usage := usageFileIn(directory)
	// Some CPU of its own first, as a waiter has by then: the kernel counts it in ticks, and a
	// test process may not have used one yet.
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
	}

	usage.Record(usageFigures)
	usage.Record(strings.Replace(usageFigures, "1500000", "2500000", 1))

	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "size (one record, written over the last)", len(content), recordSize)
	fields := strings.Fields(string(content))
	expectEqual(t, "first figure", fields[1], "2500000")
	if own, _ := strconv.ParseInt(fields[10], 10, 64); own <= 0 {
		t.Fatalf("this process's own CPU so far is %s", fields[10])
	}
}

func TestTheWaiterNeverMakesAUsageFile(t *testing.T) {
	directory, path := guardsFile(t, false)

	usageFileIn(directory).Record(usageFigures)

	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("%s: %v; only the guard (root) makes them", path, err)
	}
}

func TestTheWaiterDoesNotWriteThroughALink(t *testing.T) {
	directory, path := guardsFile(t, false)
	target := filepath.Join(directory, "elsewhere")
	if err := os.WriteFile(target, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}

	usageFileIn(directory).Record(usageFigures)

	content, _ := os.ReadFile(target)
	expectEqual(t, "the link's target", string(content), "untouched")
}

// WAITER_USAGE_FRAME: a "u" frame's data that is not base64 of ASCII.
func TestAFrameThatIsNotBase64OfASCIIIsDropped(t *testing.T) {
	data, ok := os.LookupEnv("WAITER_USAGE_FRAME")
	if !ok {
		data = "not base64 !!"
	}
	directory, path := guardsFile(t, true)

	usageFileIn(directory).RecordFrame(data)

	content, _ := os.ReadFile(path)
	expectEqual(t, "the usage file", string(content), "")
}

// A frame that is base64 of nine ASCII counts is written: the dropped ones above are dropped for
// what they are.
func TestAFrameThatIsBase64OfNineCountsIsWritten(t *testing.T) {
	directory, path := guardsFile(t, true)

	usageFileIn(directory).RecordFrame("MTUwMDAwMCAyMDAwMCA2NzEwODg2NCA3MDAwMDAwMCAxMDAwMDAwMDAgMTIwMDAwMDAwIDQwOTYgODE5MiAz")

	content, _ := os.ReadFile(path)
	expectEqual(t, "the figures written", strings.Fields(string(content))[1:10], strings.Fields(usageFigures))
}

func TestTheWaiterFindsItsFileUnderItsSlurmstepd(t *testing.T) {
	expectEqual(t, "path", NewUsageFile().path, fmt.Sprintf("%s/%d/%d", usageDir, os.Getppid(), os.Getpid()))
}

// The usage file's constants, for tests/unit to check against the accounting plugin's: written
// as JSON to WAITER_USAGE_CONSTANTS_OUT.
func TestUsageConstantsDump(t *testing.T) {
	writeJSON(t, outputOr(t, "WAITER_USAGE_CONSTANTS_OUT", "usage.json"), map[string]any{
		"usage_dir": usageDir, "usage_magic": usageMagic, "record_size": recordSize})
}
