package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
)

// onStdin runs f with fd 0 replaced by file, restoring it after.
func onStdin(t *testing.T, file *os.File, f func()) {
	t.Helper()
	saved, err := syscall.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Dup2(saved, 0); _ = syscall.Close(saved) }()
	if err := syscall.Dup2(int(file.Fd()), 0); err != nil {
		t.Fatal(err)
	}
	f()
}

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
		onStdin(t, file, func() {
			sent, options := srunStdin()
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
	onStdin(t, file, func() {
		sent, options := srunStdin()
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
	onStdin(t, reader, func() {
		if sent, options := srunStdin(); string(sent) != "a\nb\n" || options != nil {
			t.Fatalf("sent %q, options %v", sent, options)
		}
	})
	null, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	onStdin(t, null, func() {
		if sent, options := srunStdin(); sent != nil || options != nil {
			t.Fatalf("sent %q, options %v from /dev/null", sent, options)
		}
	})
}
