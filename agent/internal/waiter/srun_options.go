package waiter

import (
	"strings"

	"slurm-k8s-bridge/agent/internal/srunargs"
)

// srunError is a refusal in srun's words (srunargs.Error).
type srunError = srunargs.Error

// SplitSrunArgs reads srun's options and command as srun does (srunargs.Split).
func SplitSrunArgs(argv []string) ([]string, []string, error) { return srunargs.Split(argv) }

// HostIOOptions checks again the daemon's per-step file options for Slurm's srun: only those
// options, and a file only as an absolute path without '..'.
func HostIOOptions(words any) ([]string, error) {
	list, ok := words.([]any)
	if !ok {
		return nil, srunError("srun: error: the bridge sent no valid file options for this step")
	}
	options := make([]string, 0, len(list))
	for _, word := range list {
		text := pyStr(word)
		name, value, eq := strings.Cut(text, "=")
		good := eq && (name == "--output" || name == "--error" || name == "--input" || name == "--open-mode")
		if good && name == "--open-mode" {
			good = value == "append" || value == "truncate"
		} else if good {
			lower := strings.ToLower(value)
			good = lower == "none" || lower == "all" || asciiDigits([]byte(value)) ||
				strings.HasPrefix(value, "/") && !strings.Contains(value+"/", "/../")
		}
		if !good {
			return nil, srunError("srun: error: the bridge sent an unusable file option for this step: " + text)
		}
		options = append(options, text)
	}
	return options, nil
}
