package waiter

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Slurm's own commands asked for from inside a bridged job's pod (bridge/core/slurm_commands.py):
// what may be run, and the exact argv the waiter gives Slurm's binary. The binary runs on the
// slurmd host as the job's user, so anything that would make it read a file or run a program
// here is refused. Arguments are parsed as the binaries' getopt_long parses them (options
// anywhere, clustered short options, unique prefixes of long options) and given back canonical,
// so the binary sees exactly what was checked. The daemon checked the request with the Python
// code already; this checks it again, alike, before anything runs.

// refusal is a request that is not run; its text is the line for the command's stderr.
type refusal string

func (r refusal) Error() string { return string(r) }

// commandRequest is the agent's request as framed in the pod's log, decoded and typed.
type commandRequest struct {
	key, command, cwd string
	argv              []string
	stdin             []byte
	files             map[string][]byte
	env               Object // text values, in the pod's order
}

// preparedCommand is what the waiter runs: Slurm's binary command with argv (after the binary's
// path), the script text for its stdin (sbatch) and the variables sbatch exports to the job.
type preparedCommand struct {
	command   string
	argv      []string
	stdin     []byte
	hasStdin  bool
	export    Object
	hasExport bool
}

// commandOption is one option as parsed: its long name or short letter, and its value if given.
type commandOption struct {
	name     string
	value    string
	hasValue bool
}

// pyIterStrings is [str(a) for a in v] of a JSON value, false where Python would raise.
func pyIterStrings(v any) ([]string, bool) {
	var out []string
	switch x := v.(type) {
	case []any:
		for _, item := range x {
			out = append(out, pyStr(item))
		}
	case string:
		for _, r := range x {
			out = append(out, string(r))
		}
	case Object:
		for _, f := range x {
			out = append(out, f.Key)
		}
	default:
		return nil, false
	}
	return out, true
}

// parseCommandRequest decodes the base64 of the request's JSON: {key, command, argv, cwd,
// stdin, files, env}; an error when it is not one.
func parseCommandRequest(data string) (commandRequest, error) {
	bad := func(why string) (commandRequest, error) {
		return commandRequest{}, fmt.Errorf("not a command request: %s", why)
	}
	raw, err := pyA2bBase64(data)
	if err != nil {
		return bad("binascii.Error(" + pyRepr(err.Error()) + ")")
	}
	value, err := Loads(raw)
	if err != nil {
		return bad("JSONDecodeError(" + pyRepr(err.Error()) + ")")
	}
	object, ok := value.(Object)
	if !ok {
		return bad("AttributeError(\"object has no attribute 'get'\")")
	}
	field := func(name string) any { v, _ := object.Get(name); return v }
	request := commandRequest{files: map[string][]byte{}}
	keyValue, present := object.Get("key")
	if !present {
		return bad("KeyError('key')")
	}
	key, ok := pyInt(keyValue)
	if !ok {
		return bad("ValueError(\"invalid literal for int() with base 10: " + pyRepr(pyStr(keyValue)) + "\")")
	}
	commandValue, present := object.Get("command")
	if !present {
		return bad("KeyError('command')")
	}
	request.key, request.command = strconv.FormatInt(key, 10), pyStr(commandValue)
	if argv := field("argv"); truthy(argv) {
		if request.argv, ok = pyIterStrings(argv); !ok {
			return bad("TypeError('argv')")
		}
	}
	if cwd := field("cwd"); truthy(cwd) {
		request.cwd = pyStr(cwd)
	}
	stdin := ""
	if given := field("stdin"); truthy(given) {
		stdin = pyStr(given)
	}
	if request.stdin, err = pyA2bBase64(stdin); err != nil {
		return bad("binascii.Error(" + pyRepr(err.Error()) + ")")
	}
	if files := field("files"); truthy(files) {
		table, isObject := files.(Object)
		if !isObject {
			return bad("AttributeError('items')")
		}
		for _, f := range table {
			if request.files[f.Key], err = pyA2bBase64(pyStr(f.Value)); err != nil {
				return bad("binascii.Error(" + pyRepr(err.Error()) + ")")
			}
		}
	}
	if env := field("env"); truthy(env) {
		table, isObject := env.(Object)
		if !isObject {
			return bad("AttributeError('items')")
		}
		for _, f := range table {
			request.env = append(request.env, Field{f.Key, pyStr(f.Value)})
		}
	}
	return request, nil
}

// longOptionName resolves given to the one long option it names, exactly or as a unique prefix.
func longOptionName(command, given string) (string, error) {
	table := longOptions[command]
	if _, ok := table[given]; ok {
		return given, nil
	}
	var matches []string
	for name := range table {
		if strings.HasPrefix(name, given) {
			matches = append(matches, name)
		}
	}
	switch {
	case len(matches) == 1:
		return matches[0], nil
	case len(matches) > 1:
		sort.Strings(matches)
		return "", refusal(fmt.Sprintf("%s: option '--%s' is ambiguous (%s)", command, given, strings.Join(matches, ", ")))
	}
	return "", refusal(fmt.Sprintf("%s: option '--%s' is not allowed inside a job that runs in Kubernetes", command, given))
}

// parseCommandArgs reads argv as getopt_long does: the options, by long name or short letter,
// and the positional arguments; a refusal for an unknown or refused option, or a missing value.
func parseCommandArgs(command string, argv []string) ([]commandOption, []string, error) {
	var options []commandOption
	var positionals []string
	shorts, longs := shortOptions[command], longOptions[command]
	for i := 0; i < len(argv); {
		arg := argv[i]
		i++
		switch {
		case arg == "--":
			positionals = append(positionals, argv[i:]...)
			i = len(argv)
		case strings.HasPrefix(arg, "--"):
			given, value, hasValue := strings.Cut(arg[2:], "=")
			name, err := longOptionName(command, given)
			if err != nil {
				return nil, nil, err
			}
			switch longs[name] {
			case noArg:
				if hasValue {
					return nil, nil, refusal(fmt.Sprintf("%s: option '--%s' doesn't allow an argument", command, name))
				}
			case reqArg:
				if !hasValue {
					if i >= len(argv) {
						return nil, nil, refusal(fmt.Sprintf("%s: option '--%s' requires an argument", command, name))
					}
					value, hasValue = argv[i], true
					i++
				}
			}
			options = append(options, commandOption{name, value, hasValue})
		case strings.HasPrefix(arg, "-") && arg != "-":
			letters := []rune(arg)
			for j := 1; j < len(letters); {
				letter := string(letters[j])
				j++
				takes, known := shorts[letter]
				if !known {
					return nil, nil, refusal(fmt.Sprintf("%s: option '-%s' is not allowed inside a job that runs in Kubernetes", command, letter))
				}
				if takes == noArg {
					options = append(options, commandOption{name: letter})
					continue
				}
				value := string(letters[j:])
				if value == "" {
					if i >= len(argv) {
						return nil, nil, refusal(fmt.Sprintf("%s: option requires an argument -- '%s'", command, letter))
					}
					value = argv[i]
					i++
				}
				options = append(options, commandOption{letter, value, true})
				break
			}
		default:
			positionals = append(positionals, arg)
		}
	}
	for _, option := range options {
		if (option.name == "json" || option.name == "yaml") && option.hasValue &&
			strings.IndexFunc(option.value, notInPluginName) >= 0 {
			// It names a data_parser plugin, which the binary loads: a name, never a path.
			return nil, nil, refusal(fmt.Sprintf("%s: --%s=%s: not a data_parser plugin name", command, option.name, pyRepr(option.value)))
		}
		longName := option.name
		if same, ok := shortIsRefusedLong[command][option.name]; ok {
			longName = same
		}
		if reason, ok := refusedOptions[command][longName]; ok {
			shown := "-" + option.name
			if len(option.name) > 1 {
				shown = "--" + longName
			}
			return nil, nil, refusal(fmt.Sprintf("%s: option %s is not allowed inside a job that runs in Kubernetes: %s", command, shown, reason))
		}
	}
	return options, positionals, nil
}

// canonicalOptions are the options as the binary is given them: full long names, -xVALUE.
func canonicalOptions(options []commandOption) []string {
	var out []string
	for _, option := range options {
		prefix, separator := "--", "="
		if len([]rune(option.name)) == 1 {
			prefix, separator = "-", ""
		}
		if option.hasValue {
			out = append(out, prefix+option.name+separator+option.value)
		} else {
			out = append(out, prefix+option.name)
		}
	}
	return out
}

func checkCommandSizes(argv []string) error {
	if len(argv) > maxCommandArgs {
		return refusal(fmt.Sprintf("more than %d arguments", maxCommandArgs))
	}
	total := 0
	for _, arg := range argv {
		total += len(arg) + 1
	}
	if total > maxCommandArgvBytes {
		return refusal(fmt.Sprintf("the arguments exceed %d KiB", maxCommandArgvBytes/1024))
	}
	for _, arg := range argv {
		if strings.Contains(arg, "\x00") {
			return refusal("an argument holds a NUL byte")
		}
	}
	return nil
}

// prepareCommand is the run of `command argv` asked for from the pod, or a refusal.
func prepareCommand(request commandRequest) (preparedCommand, error) {
	command := request.command
	if !slices.Contains(slurmCommands, command) {
		return preparedCommand{}, refusal(fmt.Sprintf("%s is not one of the Slurm commands available in the pod (%s)",
			pyRepr(command), strings.Join(slurmCommands, ", ")))
	}
	if err := checkCommandSizes(request.argv); err != nil {
		return preparedCommand{}, err
	}
	options, positionals, err := parseCommandArgs(command, request.argv)
	if err != nil {
		return preparedCommand{}, err
	}
	if command == "srun" && len(options) != 1 {
		return preparedCommand{}, refusal("srun: error: only srun's help, usage, version and --mpi=list are asked this way")
	}
	for _, option := range options {
		if slices.Contains(infoOnlyOptions[command], option.name) {
			return preparedCommand{command: command, argv: canonicalOptions(options)}, nil // no script, nor command
		}
	}
	switch command {
	case "srun":
		if len(options) == 1 && options[0].name == "mpi" && options[0].hasValue && options[0].value == "list" {
			return preparedCommand{command: command, argv: []string{"--mpi=list"}}, nil // the MPI plugins Slurm has
		}
		return preparedCommand{}, refusal("srun: error: only srun's help, usage, version and --mpi=list are asked this way")
	case "scontrol":
		words, err := scontrolWords(positionals)
		return preparedCommand{command: command, argv: append(canonicalOptions(options), words...)}, err
	case "sbatch":
		return prepareSbatch(options, positionals, request)
	case "squeue", "sinfo":
		if len(positionals) > 0 {
			return preparedCommand{}, refusal(fmt.Sprintf("%s: error: Unrecognized option: %s", command, positionals[0]))
		}
	}
	argv := canonicalOptions(options)
	if len(positionals) > 0 {
		argv = append(append(argv, "--"), positionals...)
	}
	return preparedCommand{command: command, argv: argv}, nil
}

func notInPluginName(r rune) bool { return !strings.ContainsRune(pluginNameCharacters, r) }

func scontrolWords(words []string) ([]string, error) {
	if len(words) == 0 {
		return nil, refusal("scontrol: give a command (interactive scontrol is not available inside a job " +
			"that runs in Kubernetes)")
	}
	verb := strings.ToLower(words[0])
	if slices.Contains(scontrolHostVerbs, verb) {
		return nil, refusal(fmt.Sprintf("scontrol %s is not available inside a job that runs in Kubernetes: it "+
			"acts on the host scontrol runs on, the slurmd host, not on the job's pods", verb))
	}
	if !slices.Contains(scontrolVerbs, verb) {
		allowed := slices.Sorted(slices.Values(scontrolVerbs))
		return nil, refusal(fmt.Sprintf("scontrol %s is not available inside a job that runs in Kubernetes "+
			"(allowed: %s)", verb, strings.Join(allowed, ", ")))
	}
	return append([]string{"--", verb}, words[1:]...), nil
}
