package waiter

import (
	"strconv"
	"sync"
)

// Slurm's own commands for the batch script in the pod (bridge/waiter/commands.py). NOT PORTED
// YET: the Go waiter does not run them (bridge/core/slurm_commands.py's checks are not ported).
// Each request is refused on the pod's command's stderr, with exit code 1, so that the pod's
// command ends at once instead of waiting for ever.

const commandsNotPorted = "slurm-k8s-bridge: Slurm commands inside the pod are not available with this waiter yet"

type scriptCommands struct {
	client  *Client
	done    func(string, int)
	mu      sync.Mutex
	started map[string]bool
}

func newScriptCommands(client *Client, done func(string, int)) *scriptCommands {
	return &scriptCommands{client: client, done: done, started: map[string]bool{}}
}

// start refuses the command request (seen again after a reconnect: nothing more).
func (c *scriptCommands) start(event Object) {
	value, _ := event.Get("key")
	number, ok := pyInt(value)
	if !ok {
		return
	}
	key := strconv.FormatInt(number, 10)
	c.mu.Lock()
	seen := c.started[key]
	c.started[key] = true
	c.mu.Unlock()
	if seen {
		return
	}
	refusal := commandsNotPorted
	if text, ok := event.Get("refused"); ok {
		if given, isText := text.(string); isText {
			refusal = given // the daemon's own refusal, as the Python waiter passes it on
		}
	}
	go func() {
		relay := newStepOutputRelay(c.client, key)
		relay.open()
		relay.send(2, []byte(refusal+"\n"))
		relay.finish(1)
		if !relay.delivered {
			c.done(key, 1)
		}
	}()
}
