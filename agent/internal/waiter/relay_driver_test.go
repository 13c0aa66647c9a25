package waiter

// The step-output relay run as a script's srun step is, for tests/unit/test_srun_output_comes_
// back_to_the_scripts_srun.py, which serves the real daemon's API and runs this test with:
//
//	WAITER_RELAY_API     the daemon's URL (unset: a port nobody listens on)
//	WAITER_RELAY_KEY     the step's key (default 7)
//	WAITER_RELAY_SCRIPT  what /bin/sh -c runs as Slurm's srun would (default: exit 6)
//	WAITER_RELAY_MUNGE   the munge to run (default: one that writes its payload back, which the
//	                     test's unmunge takes as the credential's payload)
//	WAITER_RELAY_MODE    "run" (default), or "open-then-check": open the stream, and after a
//	                     moment look for an early answer
//	WAITER_RELAY_QUICK   "1": try to open the stream twice, without pausing (as with no daemon)
//	WAITER_RELAY_OUT     where the outcome goes, as JSON: code, delivered, gone, seconds
//
// What srun writes while the relay is not open goes to this process's stdout and stderr, as it
// would to the job's files.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func envOr(name, otherwise string) string {
	if value, ok := os.LookupEnv(name); ok {
		return value
	}
	return otherwise
}

func TestRelayedRunAgainstTheDaemon(t *testing.T) {
	munge := os.Getenv("WAITER_RELAY_MUNGE")
	if munge == "" {
		munge = filepath.Join(t.TempDir(), "munge")
		writeExecutable(t, munge, "#!/bin/sh\nexec cat\n")
	}
	savedMunge, savedAttempts, savedDelay, savedTimeout := MungePaths, streamOpenAttempts, streamOpenDelay, mungeTimeout
	t.Cleanup(func() {
		MungePaths, streamOpenAttempts, streamOpenDelay, mungeTimeout = savedMunge, savedAttempts, savedDelay, savedTimeout
	})
	MungePaths = []string{munge}
	trustFakesIn(t, filepath.Dir(munge))
	if _, daemon := os.LookupEnv("WAITER_RELAY_API"); !daemon || os.Getenv("WAITER_RELAY_QUICK") == "1" {
		streamOpenAttempts, mungeTimeout = 2, time.Second
		streamOpenDelay = func(int) time.Duration { return 0 }
	}
	url, err := SplitURL(envOr("WAITER_RELAY_API", "http://127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	relay := newStepOutputRelay(&Client{URL: url, JobID: testJobID}, envOr("WAITER_RELAY_KEY", "7"))
	started := time.Now()
	code := 0
	switch mode := envOr("WAITER_RELAY_MODE", "run"); mode {
	case "run":
		cmd := exec.Command("/bin/sh", "-c", envOr("WAITER_RELAY_SCRIPT", "exit 6"))
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		if code, err = runRelayed(cmd, relay, nil, bounds{}); err != nil {
			t.Fatal(err)
		}
	case "open-then-check":
		relay.open()
		time.Sleep(200 * time.Millisecond)
		relay.answered()
	default:
		t.Fatalf("WAITER_RELAY_MODE %q", mode)
	}
	outcome, err := json.Marshal(map[string]any{"code": code, "delivered": relay.delivered, "gone": relay.gone,
		"seconds": time.Since(started).Seconds()})
	if err != nil {
		t.Fatal(err)
	}
	if out := os.Getenv("WAITER_RELAY_OUT"); out != "" {
		if err := os.WriteFile(out, outcome, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if code != 6 || relay.delivered {
		t.Fatalf("with no daemon: %s", outcome)
	}
}
