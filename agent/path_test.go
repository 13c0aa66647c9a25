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
	jobSearchPaths()
	if got, want := os.Getenv("PATH"), agentBin(t)+":/opt/conda/bin:/usr/bin:/bin"; got != want {
		t.Fatalf("PATH %q, want %q", got, want)
	}
	jobSearchPaths() // a task of the script's step: already first, not twice
	if got, want := os.Getenv("PATH"), agentBin(t)+":/opt/conda/bin:/usr/bin:/bin"; got != want {
		t.Fatalf("PATH %q after a second call, want %q", got, want)
	}
}

func TestAnImageWithoutPathGetsTheRuntimesDefault(t *testing.T) {
	t.Setenv("PATH", "")
	jobSearchPaths()
	if got, want := os.Getenv("PATH"), agentBin(t)+":"+defaultPath; got != want {
		t.Fatalf("PATH %q, want %q", got, want)
	}
}

func TestTheJobsSharedDirectoriesComeBeforeTheImagesPathAndTheVariableGoes(t *testing.T) {
	t.Setenv("PATH", "/usr/bin:/bin")
	t.Setenv(jobPathVariable, "/home/alice/conda/envs/x/bin:/home/alice/bin")
	jobSearchPaths()
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
		"/a:/b":     "/a:/b:IMAGE",
		"/a::/c":    "/a:IMAGE:/c",
		":/c:/d":    "IMAGE:/c:/d",
		"/a:/b::/c": "/a:/b:IMAGE:/c",
		"":          "IMAGE",
	} {
		if got := aroundTheImages(jobPath, "IMAGE"); got != want {
			t.Errorf("aroundTheImages(%q) = %q, want %q", jobPath, got, want)
		}
	}
	if got := aroundTheImages("/a::/c", ""); got != "/a:/c" {
		t.Errorf("without an image list: %q, want no empty entry (the current directory)", got)
	}
}

func TestTheJobsSharedLibraryDirectoriesGoAroundTheImagesAndTheVariableGoes(t *testing.T) {
	t.Setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
	t.Setenv(jobLibraryPathVariable, "/home/alice/lib::/sw/gcc/lib64")
	jobSearchPaths()
	if got, want := os.Getenv("LD_LIBRARY_PATH"), "/home/alice/lib:/usr/local/nvidia/lib64:/sw/gcc/lib64"; got != want {
		t.Fatalf("LD_LIBRARY_PATH %q, want %q", got, want)
	}
	if _, set := os.LookupEnv(jobLibraryPathVariable); set {
		t.Fatalf("%s is still in the script's environment", jobLibraryPathVariable)
	}
}
