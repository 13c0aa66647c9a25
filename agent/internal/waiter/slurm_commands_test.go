package waiter

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// The daemon's side of these dumps, and the comparison, are in
// tests/unit/test_the_waiters_slurm_commands_follow_the_daemons_tables.py: it runs the two tests below
// with the environment variables set. Without them they are skipped.

// TestSlurmCommandTablesDump writes the tables as JSON to $WAITER_SLURM_TABLES_OUT.
func TestSlurmCommandTablesDump(t *testing.T) {
	out := os.Getenv("WAITER_SLURM_TABLES_OUT")
	if out == "" {
		t.Skip("run by the Python test that compares the tables")
	}
	tables := map[string]any{
		"COMMANDS": slurmCommands, "BINARY_DIRS": slurmBinaryDirs, "MAX_ARGS": maxCommandArgs,
		"MAX_ARGV_BYTES": maxCommandArgvBytes, "MAX_SCRIPT_BYTES": maxSbatchScriptBytes,
		"_SHORT": shortOptions, "_LONG": longOptions, "_SHORT_LONG": shortIsRefusedLong, "REFUSED": refusedOptions,
		"SCONTROL_VERBS":      slices.Sorted(slices.Values(scontrolVerbs)),
		"SCONTROL_HOST_VERBS": slices.Sorted(slices.Values(scontrolHostVerbs)),
		"_INFO_ONLY":          infoOnlyOptions, "_PLUGIN_NAME": pluginNameCharacters,
		"MAX_CONCURRENT_COMMANDS": maxConcurrentCommands, "OUTPUT_LIMIT": commandOutputLimit,
		"TIME_LIMIT_S": commandTimeLimit.Seconds(),
	}
	writeJSON(t, out, tables)
}

// preparedAsJSON is what prepareCommand made of one request, in the Python test's terms.
func preparedAsJSON(data string) map[string]any {
	request, err := parseCommandRequest(data)
	if err != nil {
		return map[string]any{"error": "slurm-k8s-bridge: " + err.Error()}
	}
	prepared, err := prepareCommand(request)
	if err != nil {
		return map[string]any{"refused": err.Error()}
	}
	answer := map[string]any{"command": prepared.command, "argv": prepared.argv, "stdin": nil, "export": nil}
	if prepared.argv == nil {
		answer["argv"] = []string{}
	}
	if prepared.hasStdin {
		answer["stdin"] = base64.StdEncoding.EncodeToString(prepared.stdin)
	}
	if prepared.hasExport {
		answer["export"] = base64.StdEncoding.EncodeToString(exportFileBytes(prepared.export))
	}
	return answer
}

// TestSlurmCommandCasesFromFile prepares each request of $WAITER_SLURM_CASES (a JSON list of
// the base64 request texts the attach stream carries) and writes the answers to
// $WAITER_SLURM_CASES_OUT.
func TestSlurmCommandCasesFromFile(t *testing.T) {
	in, out := os.Getenv("WAITER_SLURM_CASES"), os.Getenv("WAITER_SLURM_CASES_OUT")
	if in == "" || out == "" {
		t.Skip("run by the Python test that compares the answers")
	}
	raw, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	answers := make([]map[string]any, len(cases))
	for i, data := range cases {
		answers[i] = preparedAsJSON(data)
	}
	writeJSON(t, out, answers)
}

func request(command string, argv ...string) string {
	body, _ := json.Marshal(map[string]any{"key": 7, "command": command, "argv": argv, "cwd": "/work",
		"files": map[string]string{"job.sh": base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\n"))},
		"env":   map[string]string{"A": "1", "B": "2"}})
	return base64.StdEncoding.EncodeToString(body)
}

func TestSlurmCommandsAreCheckedAndMadeCanonical(t *testing.T) {
	for _, c := range []struct {
		data string
		want string
	}{
		{request("squeue", "-u", "alice", "--me", "-hostate"), "argv=[-ualice --me -h -ostate]"},
		{request("scontrol", "SHOW", "job", "5"), "argv=[-- show job 5]"},
		{request("scontrol", "listpids"), "refused=scontrol listpids is not available inside a job that runs"},
		{request("sbatch", "--parti=x", "-J", "n", "job.sh", "a"), "argv=[--chdir=/work --job-name=job.sh --partition=x -Jn /dev/stdin a]"},
		{request("sbatch", "--export=A", "--wrap", "true"), "export=QT0xAA=="},
		{request("sbatch", "--ex", "x"), "refused=sbatch: option '--ex' is ambiguous (exclude, exclusive, export, export-file, extra, extra-node-info)"},
		{request("sbatch", "-F", "f"), "refused=sbatch: option -F is not allowed inside a job that runs in Kubernetes: it would read"},
		{request("sinfo", "--json=../x"), "refused=sinfo: --json='../x': not a data_parser plugin name"},
		{request("bash"), "refused='bash' is not one of the Slurm commands"},
	} {
		answer := preparedAsJSON(c.data)
		name, want, _ := strings.Cut(c.want, "=")
		var got string
		switch value := answer[name].(type) {
		case []string:
			got = "[" + strings.Join(value, " ") + "]"
		case string:
			got = value
		}
		if !strings.HasPrefix(got, want) {
			t.Errorf("%s: %s = %q, want %q", c.data, name, got, want)
		}
	}
}
