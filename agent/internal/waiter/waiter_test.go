package waiter

import (
	"bufio"
	"encoding/hex"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Expected values below were printed by the Python waiter's own functions.

func TestRequestDigestIsPythons(t *testing.T) {
	got := RequestDigest("POST", "/v1/jobs/7/cancel", 7, []byte("{}"))
	want := "slurm-k8s-bridge-v1:2ffb152257895f7d073c80cedf2ef2d990bd3e031c1564349f50cc726309adc1"
	if got != want {
		t.Fatalf("digest %s, want %s", got, want)
	}
	if RequestDigest("POST", "/v1/jobs/7/cancel", 8, []byte("{}")) == want {
		t.Fatal("the digest does not bind the job")
	}
}

func TestSignedOutputFrameIsPythons(t *testing.T) {
	got := hex.EncodeToString(SignOutputFrame([]byte(strings.Repeat("k", 32)), 3, 1, []byte("hello")))
	want := "010000000568656c6c6f5ba65fbaf6eda4755b614bb51d9341f48b87fc6710e8e33838d45a697ad6d343"
	if got != want {
		t.Fatalf("frame %s, want %s", got, want)
	}
}

func TestDumpsWritesAsJSONDumps(t *testing.T) {
	value := Object{
		{"s", "caf\u00e9 \xff \U0001F600 \"q\" \\ \n\t\x01"},
		{"n", []any{int64(1), 2.5, true, nil, 10.0}},
		{"o", Object{}},
	}
	want := `{"s": "caf\u00e9 \udcff \ud83d\ude00 \"q\" \\ \n\t\u0001", "n": [1, 2.5, true, null, 10.0], "o": {}}`
	if got := string(Dumps(value)); got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

func TestLoadsReadsBackWhatDumpsWrote(t *testing.T) {
	text := "caf\u00e9 \xff \U0001F600 \"q\" \\ \n\t\x01"
	value, err := Loads(Dumps(Object{{"s", text}, {"n", int64(-3)}, {"l", []any{}}}))
	if err != nil {
		t.Fatal(err)
	}
	obj := value.(Object)
	if s, _ := obj.Get("s"); s != text {
		t.Fatalf("string %q, want %q", s, text)
	}
	if n, _ := obj.Get("n"); n != int64(-3) {
		t.Fatalf("number %v", n)
	}
	for _, bad := range []string{"", "{", `{"a" 1}`, "[1,]", "01", `"\x"`, "{} x", "\xff"} {
		if _, err := Loads([]byte(bad)); err == nil {
			t.Errorf("%q was taken", bad)
		}
	}
	duplicate, _ := Loads([]byte(`{"a": 1, "b": 2, "a": 3}`))
	if got := string(Dumps(duplicate)); got != `{"a": 3, "b": 2}` {
		t.Errorf("a duplicate key keeps the first place and the last value, as a dict: %s", got)
	}
}

func TestSplitURL(t *testing.T) {
	cases := map[string]URL{
		"http://127.0.0.1:8470":        {"http", "127.0.0.1", 8470},
		"http://bridge.example:9000/":  {"http", "bridge.example", 9000},
		"http://[::1]:8470":            {"http", "::1", 8470},
		"http://host":                  {"http", "host", 80},
		"https://bridge.example":       {"https", "bridge.example", 443},
		"HTTPS://bridge.example:8443/": {"https", "bridge.example", 8443},
		"https://[fd00::1]":            {"https", "fd00::1", 443},
		"http://[fd00::1]/":            {"http", "fd00::1", 80},
		"https://[fd00::1]:8443":       {"https", "fd00::1", 8443},
		"bridge:1":                     {"http", "bridge", 1},
	}
	for raw, want := range cases {
		if got, err := SplitURL(raw); err != nil || got != want {
			t.Errorf("SplitURL(%q) = %v, %v; want %v", raw, got, err, want)
		}
	}
	if HostHeader("fd00::1", 8470) != "[fd00::1]:8470" || HostHeader("b.example", 443) != "b.example:443" {
		t.Error("the Host header writes an IPv6 address in brackets")
	}
}

func TestTheScriptIsTheUsersOwnAndAMarkerInItIsInert(t *testing.T) {
	planted := "#!/bin/sh\necho user\n" + Marker + "\necho planted\n"
	if got := string(UserScript([]byte(planted))); got != planted {
		t.Fatalf("a user's script with a marker line: %q", got)
	}
	legacy := "#!/bin/sh\n# slurm-k8s-bridge: rewritten batch script: this job runs in Kubernetes pods. " +
		"The waiter\n# streams their output here and exits with their exit code.\n" +
		"exec /usr/libexec/waiter --api http://b:8470 \"$0\" \"$@\"\n" + Marker + "\n"
	if got := string(UserScript([]byte(legacy + planted))); got != planted {
		t.Fatalf("a script an older job_submit.lua rewrote: %q", got)
	}
	// Only the exact wrapper: a user's script that merely starts like it is the user's, whole.
	lookalike := strings.Replace(legacy, "\"$0\" \"$@\"\n", "\"$0\" \"$@\"\necho first\n", 1) + planted
	if got := string(UserScript([]byte(lookalike))); got != lookalike {
		t.Fatalf("a look-alike: %q", got)
	}
	if got := string(UserScript([]byte(legacy + legacy + planted))); got != legacy+planted {
		t.Fatalf("one wrapper is taken off, no more: %q", got)
	}
	if got := string(UniversalNewlines([]byte("a\r\nb\rc\n"))); got != "a\nb\nc\n" {
		t.Fatalf("universal newlines: %q", got)
	}
}

func TestHeldVariablesGetTheirNamesBack(t *testing.T) {
	environ := Object{{"SLURM_K8S_BRIDGE_HELD_LD_PRELOAD", "/x.so"}, {"HOME", "/home/alice"},
		{"SLURM_K8S_BRIDGE_HELD_", "nameless"}, {"SLURM_K8S_BRIDGE_HELD_HOME", "/held"}}
	want := `{"HOME": "/held", "LD_PRELOAD": "/x.so"}`
	if got := string(Dumps(JobEnvironment(environ))); got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	guarded := Object{{HeldMarker, "1"}, {"LC_CTYPE", "C.UTF-8"}, {"SLURM_JOB_ID", "7"},
		{"SLURM_K8S_BRIDGE_HELD_OPENSSL_CONF", "/x"}}
	want = `{"SLURM_JOB_ID": "7", "OPENSSL_CONF": "/x"}`
	if got := string(Dumps(JobEnvironment(guarded))); got != want {
		t.Fatalf("guarded: %s, want %s", got, want)
	}
}

func TestUsageRecordsAreThePythonWaiters(t *testing.T) {
	want := "k8s-bridge-usage-v1 1 2 3 4 5 6 7 8 - 10 20 66"
	got := string(UsageRecord("1 2 3 4 5 6 7 8 -", [2]int64{10, 20}))
	if len(got) != recordSize || strings.TrimRight(got, " \n") != want {
		t.Fatalf("%q", got)
	}
	for _, bad := range []string{"1 2 3", "1 2 3 4 5 6 7 8 x", "1 2 3 4 5 6 7 8 18446744073709551616"} {
		if UsageRecord(bad, [2]int64{}) != nil {
			t.Errorf("%q made a record", bad)
		}
	}
}

func TestBase64IsReadAsBinasciiReadsIt(t *testing.T) {
	for text, want := range map[string]string{"aGVsbG8K": "hello\n", "aGVsbG8=\n": "hello", "aGVs\nbG8=": "hello", "": ""} {
		got, err := pyA2bBase64(text)
		if err != nil || string(got) != want {
			t.Errorf("%q: %q, %v", text, got, err)
		}
	}
}

func TestAnEndingSignalsCodeIsADeath(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGSEGV, syscall.SIGUSR1} {
		if endingSignals&setOf(sig) == 0 {
			t.Errorf("%v does not end a process", sig)
		}
	}
	for _, sig := range []syscall.Signal{syscall.SIGCHLD, syscall.SIGCONT, syscall.SIGWINCH} {
		if endingSignals&setOf(sig) != 0 {
			t.Errorf("%v ends a process", sig)
		}
	}
	if endAsTheTask(3) != 3 || endAsTheTask(128+int64(syscall.SIGCHLD)) != 128+int(syscall.SIGCHLD) {
		t.Error("a plain exit code is the proxy's")
	}
}

func TestBackoffIsJitteredAndCapped(t *testing.T) {
	for attempt := range 20 {
		delay := reconnectDelay(attempt)
		base := min(reconnectCap, reconnectBase<<min(attempt, 10))
		if delay < base/2 || delay >= base*3/2 {
			t.Errorf("attempt %d: %v outside [%v, %v)", attempt, delay, base/2, base*3/2)
		}
	}
	if reconnectDelay(30) > 15*time.Second/2 {
		t.Error("the backoff is capped at 5 s (jittered)")
	}
}

func TestAGarbledStatusLineIsToldAsPythonTellsIt(t *testing.T) {
	_, err := readStatus(bufio.NewReader(strings.NewReader("HTTP/1.1 OK\r\n")))
	if err == nil || err.Error() != "bad HTTP answer from the bridge: [b'HTTP/1.1', b'OK']" {
		t.Fatalf("%v", err)
	}
	status, err := readStatus(bufio.NewReader(strings.NewReader("HTTP/1.1 503 Service Unavailable\r\n")))
	if err != nil || status != 503 {
		t.Fatalf("%d, %v", status, err)
	}
}

func TestErrorsReadAsPythonsOSError(t *testing.T) {
	if got := pyError(syscall.ECONNREFUSED); got != "[Errno 111] Connection refused" {
		t.Fatal(got)
	}
	if got := fileErrorLine(syscall.ENOENT, "/x"); got != "FileNotFoundError: [Errno 2] No such file or directory: '/x'" {
		t.Fatal(got)
	}
}
