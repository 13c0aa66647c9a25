package waiter

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// A munge, srun or Slurm binary that another user could have put in place (a directory above it
// writable by others, or not root's) is passed over for the next candidate; when none is left the
// error says which was found and why it did not run, for the admin who reads the job's error file.
func TestProgramsOthersCouldReplaceAreNotRun(t *testing.T) {
	open := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	planted, kept := filepath.Join(open, "munge"), filepath.Join(t.TempDir(), "munge")
	writeExecutable(t, planted, "#!/bin/sh\nprintf 'MUNGE:planted'\n")
	writeExecutable(t, kept, "#!/bin/sh\nprintf 'MUNGE:'\nexec cat\n")
	saved := MungePaths
	t.Cleanup(func() { MungePaths = saved })

	MungePaths = []string{"/nonexistent/munge", planted}
	_, err := MungeCredential("payload")
	why := open + " is writable by others than root (mode 0777)"
	if os.Getuid() != 0 { // the file's owner is the first thing wrong
		why = fmt.Sprintf("%s is owned by uid %d, not root", planted, os.Getuid())
	}
	expectEqual(t, "the error", fmt.Sprint(err), "found "+planted+" but it is not root-controlled: "+why)

	trustFakesIn(t, filepath.Dir(kept)) // as a root-controlled one would be
	MungePaths = []string{planted, kept}
	credential, err := MungeCredential("payload")
	expectEqual(t, "the next one's credential", credential, "MUNGE:payload")
	if err != nil {
		t.Fatal(err)
	}
}

// Where Debian (the sandbox) installs munge, srun and Slurm's commands, root controls.
func TestUsrBinIsRootControlled(t *testing.T) {
	expectEqual(t, "why /usr/bin/env is not", notRootControlled("/usr/bin/env"), "")
}
