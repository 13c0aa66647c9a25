package main

// srun --multi-prog in a bridged job: the config file is in the pod, and so is each task, so the
// task reads it here and runs its own line, as slurmstepd would. The format is srun's: one line
// per set of tasks, "RANKS PROGRAM ARGS...", RANKS "*" or a comma list of numbers and ranges
// (0-3,5); "#" starts a comment; in the program and its arguments "%t" is the task's rank and "%o"
// its offset among the line's ranks; words may be quoted with ' or ".

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// multiProgLine is the command task `procid` runs by config file `path`; it ends the task with
// srun's error when the file has no line for it.
func multiProgLine(path, procid string) []string {
	rank, err := strconv.Atoi(procid)
	if err != nil {
		fail("no SLURM_PROCID for --multi-prog")
	}
	file, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "srun: error: Unable to open configuration file %s: %s\n", path, errnoText(err))
		os.Exit(1)
	}
	defer file.Close()
	scanner := bufio.NewScanner(file)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; scanner.Scan(); line++ {
		words := splitWords(stripComment(scanner.Text()))
		if len(words) == 0 {
			continue
		}
		offset, ok := rankOffset(words[0], rank)
		if !ok {
			continue
		}
		if len(words) < 2 {
			fmt.Fprintf(os.Stderr, "srun: error: Line %d of configuration file %s invalid\n", line, path)
			os.Exit(1)
		}
		argv := make([]string, 0, len(words)-1)
		for _, word := range words[1:] {
			word = strings.ReplaceAll(word, "%t", strconv.Itoa(rank))
			argv = append(argv, strings.ReplaceAll(word, "%o", strconv.Itoa(offset)))
		}
		return argv
	}
	fmt.Fprintf(os.Stderr, "srun: error: No executable program specified for task %d in %s\n", rank, path)
	os.Exit(1)
	return nil
}

func stripComment(line string) string {
	if i := strings.IndexByte(line, '#'); i >= 0 {
		return line[:i]
	}
	return line
}

// rankOffset says whether `ranks` ("*", "0-3,5") holds `rank`, and its offset among them.
func rankOffset(ranks string, rank int) (int, bool) {
	if ranks == "*" {
		return rank, true
	}
	offset := 0
	for _, part := range strings.Split(ranks, ",") {
		low, high, isRange := strings.Cut(part, "-")
		first, err1 := strconv.Atoi(low)
		last := first
		var err2 error
		if isRange {
			last, err2 = strconv.Atoi(high)
		}
		if err1 != nil || err2 != nil || last < first {
			return 0, false
		}
		if rank >= first && rank <= last {
			return offset + rank - first, true
		}
		offset += last - first + 1
	}
	return 0, false
}

// splitWords splits on blanks, keeping what ' or " quote together.
func splitWords(line string) []string {
	var words []string
	var word strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			word.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}
