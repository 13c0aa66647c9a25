package main

import (
	"os"
	"path/filepath"
	"testing"
)

func tmpdirAfter(t *testing.T, value *string, firstTask bool) (string, bool) {
	t.Helper()
	if value == nil {
		t.Setenv("TMPDIR", "")
		_ = os.Unsetenv("TMPDIR")
	} else {
		t.Setenv("TMPDIR", *value)
	}
	makeTmpdir(firstTask)
	return os.LookupEnv("TMPDIR")
}

func TestAnUnsetTmpdirIsTmpForTheFirstTaskOnly(t *testing.T) {
	if got, set := tmpdirAfter(t, nil, true); !set || got != "/tmp" {
		t.Fatalf("first task: TMPDIR %q (set %v), want /tmp", got, set)
	}
	if got, set := tmpdirAfter(t, nil, false); set {
		t.Fatalf("another task: TMPDIR %q, want it unset as slurmstepd leaves it", got)
	}
}

func TestAnotherTaskKeepsItsTmpdirAsItIs(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "not-made")
	if got, _ := tmpdirAfter(t, &missing, false); got != missing {
		t.Fatalf("TMPDIR %q, want %q untouched (slurmstepd checks local task 0's only)", got, missing)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("made %s for a task that is not its node's first", missing)
	}
}

func TestAMissingTmpdirIsMadeForTheJobAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job-tmp")
	if got, _ := tmpdirAfter(t, &dir, true); got != dir {
		t.Fatalf("TMPDIR %q, want %q", got, dir)
	}
	info, err := os.Stat(dir)
	if err != nil || !info.IsDir() || info.Mode().Perm() != 0o700 {
		t.Fatalf("made %v (%v), want a 0700 directory", info, err)
	}
}

func TestAnExistingTmpdirIsKept(t *testing.T) {
	dir := t.TempDir()
	if got, _ := tmpdirAfter(t, &dir, true); got != dir {
		t.Fatalf("TMPDIR %q, want %q", got, dir)
	}
}

func TestATmpdirThatCannotBeADirectoryIsTmp(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	unreachable := filepath.Join(file, "below-a-file")
	empty := ""
	for _, value := range []*string{&file, &unreachable, &empty} {
		if got, _ := tmpdirAfter(t, value, true); got != "/tmp" {
			t.Fatalf("TMPDIR=%q became %q, want /tmp", *value, got)
		}
	}
}
