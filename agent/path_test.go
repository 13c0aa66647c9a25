package main

import (
	"os"
	"path/filepath"
	"testing"
)

func agentBin(t *testing.T) string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(self), "bin")
}

func TestTheImagesPathFollowsTheAgentsBin(t *testing.T) {
	t.Setenv("PATH", "/opt/conda/bin:/usr/bin:/bin")
	agentFirstOnPath()
	if got, want := os.Getenv("PATH"), agentBin(t)+":/opt/conda/bin:/usr/bin:/bin"; got != want {
		t.Fatalf("PATH %q, want %q", got, want)
	}
	agentFirstOnPath() // a task of the script's step: already first, not twice
	if got, want := os.Getenv("PATH"), agentBin(t)+":/opt/conda/bin:/usr/bin:/bin"; got != want {
		t.Fatalf("PATH %q after a second call, want %q", got, want)
	}
}

func TestAnImageWithoutPathGetsTheRuntimesDefault(t *testing.T) {
	t.Setenv("PATH", "")
	agentFirstOnPath()
	if got, want := os.Getenv("PATH"), agentBin(t)+":"+defaultPath; got != want {
		t.Fatalf("PATH %q, want %q", got, want)
	}
}

func TestTheJobsSharedDirectoriesComeBeforeTheImagesPathAndTheVariableGoes(t *testing.T) {
	t.Setenv("PATH", "/usr/bin:/bin")
	t.Setenv(jobPathVariable, "/home/alice/conda/envs/x/bin:/home/alice/bin")
	agentFirstOnPath()
	want := agentBin(t) + ":/home/alice/conda/envs/x/bin:/home/alice/bin:/usr/bin:/bin"
	if got := os.Getenv("PATH"); got != want {
		t.Fatalf("PATH %q, want %q", got, want)
	}
	if _, set := os.LookupEnv(jobPathVariable); set {
		t.Fatalf("%s is still in the script's environment", jobPathVariable)
	}
}

func TestTheJobsDirectoriesAfterTheHostsOwnComeAfterTheImagesPath(t *testing.T) {
	for jobPath, want := range map[string]string{
		"/a:/b":     "BIN:/a:/b:IMAGE",
		"/a::/c":    "BIN:/a:IMAGE:/c",
		":/c:/d":    "BIN:IMAGE:/c:/d",
		"/a:/b::/c": "BIN:/a:/b:IMAGE:/c",
		"":          "BIN:IMAGE",
	} {
		if got := withJobPath("BIN", jobPath, "IMAGE"); got != want {
			t.Errorf("withJobPath(%q) = %q, want %q", jobPath, got, want)
		}
	}
}
