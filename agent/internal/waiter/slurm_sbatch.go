package waiter

import (
	"fmt"
	"slices"
	"strings"
)

// sbatch from the pod (bridge/core/slurm_commands.py _sbatch): it runs in / on the slurmd host,
// so the job starts where the pod's sbatch was called; the script's text comes on its stdin,
// the pod's variables through an export file the waiter writes, never a file of the user's.

func prepareSbatch(options []commandOption, positionals []string, request commandRequest) (preparedCommand, error) {
	wrap := false
	for _, option := range options {
		wrap = wrap || option.name == "wrap"
	}
	var head []string
	// sbatch runs in / on the slurmd host: the job starts where the pod's sbatch was called.
	if strings.HasPrefix(request.cwd, "/") {
		head = append(head, "--chdir="+request.cwd)
	}
	options = slices.Clone(options)
	for i, option := range options {
		if (option.name == "chdir" || option.name == "D") && option.hasValue {
			options[i].value = absoluteIn(option.value, request.cwd)
		}
	}
	if len(positionals) > 0 && positionals[0] == ":" {
		return preparedCommand{}, refusal("sbatch: heterogeneous jobs (':') are not available inside a job " +
			"that runs in Kubernetes")
	}
	prepared := preparedCommand{command: "sbatch", hasExport: true, export: exportedVariables(options, request.env)}
	var tail []string
	switch {
	case wrap:
		if len(positionals) > 0 {
			return preparedCommand{}, refusal("sbatch: error: script arguments not permitted with --wrap option")
		}
	case len(positionals) > 0:
		path := positionals[0]
		script, found := request.files[path]
		if !found {
			return preparedCommand{}, refusal("sbatch: error: Unable to open file " + path)
		}
		head = append(head, "--job-name="+path[strings.LastIndex(path, "/")+1:]) // the user's -J, later, wins
		// The script's text comes on stdin; a path the waiter chose, never the user's, names it.
		if len(positionals) > 1 {
			tail = append([]string{"/dev/stdin"}, positionals[1:]...)
		}
		prepared.stdin, prepared.hasStdin = script, true
	default:
		prepared.stdin, prepared.hasStdin = request.stdin, true
	}
	if prepared.hasStdin && len(prepared.stdin) > maxSbatchScriptBytes {
		return preparedCommand{}, refusal(fmt.Sprintf("sbatch: the script exceeds %d KiB", maxSbatchScriptBytes/1024))
	}
	prepared.argv = append(append(head, canonicalOptions(options)...), tail...)
	return prepared, nil
}

func absoluteIn(path, cwd string) string {
	if strings.HasPrefix(path, "/") || !strings.HasPrefix(cwd, "/") {
		return path
	}
	return strings.TrimRight(cwd, "/") + "/" + path
}

// exportedVariables are the pod's variables sbatch hands the job, as its --export asks (ALL
// when not given; NONE: none; a list: those names; NAME=value items sbatch sets itself).
func exportedVariables(options []commandOption, env Object) Object {
	var last *commandOption
	for i := range options {
		if options[i].name == "export" {
			last = &options[i]
		}
	}
	if last == nil || !last.hasValue {
		return append(Object{}, env...)
	}
	names := map[string]bool{}
	for _, item := range strings.Split(last.value, ",") {
		switch {
		case item == "":
		case strings.ToUpper(item) == "ALL":
			return append(Object{}, env...)
		case !strings.Contains(item, "=") && strings.ToUpper(item) != "NONE":
			names[item] = true
		}
	}
	exported := Object{}
	for _, f := range env {
		if names[f.Key] {
			exported = append(exported, f)
		}
	}
	return exported
}

// exportFileBytes is sbatch --export-file's content: NAME=value items, each ended by a NUL.
func exportFileBytes(export Object) []byte {
	var out []byte
	for _, f := range export {
		value := f.Value.(string)
		if f.Key != "" && !strings.Contains(f.Key, "=") && !strings.Contains(f.Key+value, "\x00") {
			out = append(append(append(out, f.Key+"="...), value...), 0)
		}
	}
	return out
}
