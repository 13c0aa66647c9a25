package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"slurm-k8s-bridge/agent/internal/fdtest"
)

func fileOf(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := bytes.Repeat([]byte("0123456789abcde\n"), size/16+1)[:size]
	path := filepath.Join(t.TempDir(), "input")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func TestSrunStdinSendsAWholeSmallFileOrTheRestOfABigOne(t *testing.T) {
	for _, c := range []struct {
		size   int
		offset int64
	}{{10, 0}, {maxSrunStdin, 0}, {maxSrunStdin + 90_000, 100_000}} {
		path, data := fileOf(t, c.size)
		file, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := file.Seek(c.offset, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		fdtest.OnStdin(t, file, func() {
			sent, options := srunStdin([]string{"cat"})
			if !bytes.Equal(sent, data[c.offset:]) || options != nil {
				t.Fatalf("size %d offset %d: sent %d bytes, options %v", c.size, c.offset, len(sent), options)
			}
		})
		file.Close()
	}
}

func TestSrunStdinNamesAWholeFileTooBigToSendAndLeavesItAtItsEnd(t *testing.T) {
	path, data := fileOf(t, maxSrunStdin+1)
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	fdtest.OnStdin(t, file, func() {
		sent, options := srunStdin([]string{"cat"})
		if sent != nil || !reflect.DeepEqual(options, []string{"--input=" + path}) {
			t.Fatalf("sent %d bytes, options %v", len(sent), options)
		}
	})
	if offset, _ := file.Seek(0, io.SeekCurrent); offset != int64(len(data)) {
		t.Fatalf("stdin left at %d, want its end %d (native srun reads it all)", offset, len(data))
	}
}

func TestSrunStdinSendsAPipesBytesAndNothingOfDevNull(t *testing.T) {
	reader, writer, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = writer.Write([]byte("a\nb\n"))
	writer.Close()
	defer reader.Close()
	fdtest.OnStdin(t, reader, func() {
		if sent, options := srunStdin([]string{"cat"}); string(sent) != "a\nb\n" || options != nil {
			t.Fatalf("sent %q, options %v", sent, options)
		}
	})
	null, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	fdtest.OnStdin(t, null, func() {
		if sent, options := srunStdin([]string{"cat"}); sent != nil || options != nil {
			t.Fatalf("sent %q, options %v from /dev/null", sent, options)
		}
	})
}

// Native srun leaves its stdin alone with --input=none or a file: MPICH's mpiexec starts its srun
// with --input none and forwards its own stdin, the same open file, itself.
func TestSrunStdinLeavesStdinAloneWhenInputIsAFileOrNone(t *testing.T) {
	for _, c := range []struct {
		args []string
		read bool
	}{
		{[]string{"--input", "none", "hydra_pmi_proxy"}, false},
		{[]string{"-inone", "prog"}, false},
		{[]string{"-N1", "--inp=/home/alice/in.txt", "prog"}, false},
		{[]string{"--input=0", "prog"}, true},
		{[]string{"--input=all", "prog"}, true},
		{[]string{"grep", "-i", "none"}, true}, // the command's own -i
	} {
		path, data := fileOf(t, 100)
		file, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		fdtest.OnStdin(t, file, func() {
			sent, options := srunStdin(c.args)
			if options != nil || (c.read && !bytes.Equal(sent, data)) || (!c.read && sent != nil) {
				t.Fatalf("%v: sent %q, options %v", c.args, sent, options)
			}
		})
		offset, _ := file.Seek(0, io.SeekCurrent)
		if want := map[bool]int64{true: int64(len(data)), false: 0}[c.read]; offset != want {
			t.Fatalf("%v: stdin left at %d, want %d", c.args, offset, want)
		}
		file.Close()
	}
}

func TestSrunStdinReadsABigFileWhenAnInputTaskIsGiven(t *testing.T) {
	path, data := fileOf(t, 600_000)
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.Seek(int64(len(data))-1000, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	// --input=1 cannot be said together with a file: the bytes go, within the limit
	fdtest.OnStdin(t, file, func() {
		if sent, options := srunStdin([]string{"--input=1", "cat"}); len(sent) != 1000 || options != nil {
			t.Fatalf("sent %d bytes, options %v", len(sent), options)
		}
	})
}
