package waiter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// The waiter's munge credentials: munge runs by absolute path with a
// fixed environment, never from the job's PATH, which is the user's to shape.

// MungePaths are where munge is looked for, in order.
var MungePaths = []string{"/usr/bin/munge", "/usr/local/bin/munge", "/opt/munge/bin/munge"}

// A var only so that tests can stand in a munge that hangs without waiting for it.
var mungeTimeout = 10 * time.Second

// untrusted is why the program at path must not run here ("": it may). A var only so that the Go
// tests can run fakes from their temporary directories (trustFakesIn).
var untrusted = notRootControlled

// executable is the first of paths this process may execute that root controls: one that another
// user could replace (a directory above it writable by others, or not root's) would run as the
// job's user whatever they put there. Else the error says why each one found was passed over,
// for the job's error file, where the admin reads it; notInstalled if none was found.
func executable(paths []string, notInstalled string) (string, error) {
	var refused []string
	for _, path := range paths {
		if syscall.Access(path, 1) != nil { // X_OK
			continue
		}
		if why := untrusted(path); why != "" {
			refused = append(refused, "found "+path+" but it is not root-controlled: "+why)
			continue
		}
		return path, nil
	}
	if len(refused) > 0 {
		return "", errors.New(strings.Join(refused, "; "))
	}
	return "", errors.New(notInstalled)
}

// MungeUnusable: no munge this process may run on this host (none installed, or none that only
// root controls). The admin's to fix; the waiter waits for it as for an outage.
type MungeUnusable struct{ Why string }

func (e *MungeUnusable) Error() string { return e.Why }

// mungeProgram is the munge to run, or a *MungeUnusable.
func mungeProgram() (string, error) {
	binary, err := executable(MungePaths, "munge is not installed on this host (looked for "+joinComma(MungePaths)+")")
	if err != nil {
		return "", &MungeUnusable{err.Error()}
	}
	return binary, nil
}

// MungeCredential is a credential for this process's uid and gid carrying payload. Every
// failure is an error the callers take as an outage and retry.
func MungeCredential(payload string) (string, error) {
	binary, err := mungeProgram()
	if err != nil {
		return "", err
	}
	return mungeCredentialWith(binary, payload)
}

// mungeCredentialWith is MungeCredential with the munge mungeProgram found.
func mungeCredentialWith(binary, payload string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), mungeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary)
	cmd.Env = SafeEnvironment()
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(payload)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Killed at the timeout, munge may leave a child holding its output open: Wait must not wait
	// for that child (Python's subprocess.run(timeout=) does not either).
	cmd.WaitDelay = time.Second
	err := runUnblocked(cmd)
	if ctx.Err() != nil {
		// A host so loaded that munge takes over 10 s: an outage like any other, retried.
		return "", errors.New("munge did not answer within 10 s")
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return "", fmt.Errorf("munge failed: %s", strings.TrimSpace(decodeReplace(stderr.Bytes())))
	}
	if err != nil {
		return "", errors.New(pyError(err))
	}
	return strings.TrimSpace(stdout.String()), nil
}
