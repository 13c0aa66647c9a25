package waiter

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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

// A host whose munge may not run opens no connection to the daemon (it would never speak), and
// the job's error file says at once that munge is the trouble, not the daemon.
func TestAHostWithoutAUsableMungeSaysSoAndDoesNotConnect(t *testing.T) {
	saved := MungePaths
	t.Cleanup(func() { MungePaths = saved })
	MungePaths = []string{"/nonexistent/munge"}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			conn.Close()
			accepted <- struct{}{}
		}
	}()
	client := &Client{URL: URL{"http", "127.0.0.1", listener.Addr().(*net.TCPAddr).Port}, JobID: testJobID}

	_, err = client.Post("/v1/jobs/42/attach", []byte("{}"), time.Second)
	var unusable *MungeUnusable
	if !errors.As(err, &unusable) {
		t.Fatalf("the error: %v, want a *MungeUnusable", err)
	}
	relay := &stepOutputRelay{client: client}
	expectEqual(t, "the stream's status", relay.tryOpen(), 0)

	job := NewWaiter(client, []byte("#!/bin/sh\n"), Object{}, "/", nil, []string{"waiter"})
	said := stderrOf(t, func() {
		// Run waits for munge for ever; its next word would come 10 minutes later.
		go job.Run()
		time.Sleep(500 * time.Millisecond)
	})
	expectEqual(t, "what the job's stderr got at once", said, "slurm-k8s-bridge: cannot make a munge credential on this "+
		"host, waiting for it to be fixed: munge is not installed on this host (looked for /nonexistent/munge)\n")
	select {
	case <-accepted:
		t.Fatal("the daemon got a connection from a host without munge")
	default:
	}
}

// Sites link /opt/slurm to the installed version: a link root owns, in a directory only root may
// write, to a place root controls, is root-controlled; a link someone else owns, or one leading to a
// place others may write, is not.
func TestALinkRootControlsToAPlaceRootControlsIsRootControlled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root can make the root-owned directories this is about")
	}
	base, err := os.MkdirTemp("/run", "waiter-links-") // /run: root's, mode 755
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(base, "slurm-26.05", "bin")
	if err := os.MkdirAll(installed, 0o755); err != nil {
		t.Fatal(err)
	}
	writeExecutable(t, filepath.Join(installed, "srun"), "#!/bin/sh\n")
	link := filepath.Join(base, "slurm")
	if err := os.Symlink("slurm-26.05", link); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "why a root link to root's is not", notRootControlled(filepath.Join(link, "bin", "srun")), "")

	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "why another's link is not", notRootControlled(filepath.Join(link, "bin", "srun")),
		link+" is owned by uid 65534, not root")

	if err := os.Lchown(link, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(installed, 0o777); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "why a link to a place others may write is not", notRootControlled(filepath.Join(link, "bin", "srun")),
		filepath.Join(link, "bin")+" is writable by others than root (mode 0777)")
}
