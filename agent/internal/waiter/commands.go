package waiter

// placeholder until the Slurm commands are ported
type scriptCommands struct {
	client *Client
	done   func(string, int)
}

func newScriptCommands(client *Client, done func(string, int)) *scriptCommands {
	return &scriptCommands{client, done}
}

func (c *scriptCommands) start(event Object) {}
