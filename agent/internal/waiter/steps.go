package waiter

import "time"

// placeholder until the srun steps are ported
type scriptSteps struct {
	client     *Client
	ownCommand []string
	post       postAction
}

func newScriptSteps(client *Client, ownCommand []string, post postAction) *scriptSteps {
	return &scriptSteps{client, ownCommand, post}
}

func (s *scriptSteps) start(data, token string, io any) {}
func (s *scriptSteps) signal(key string, sig any)       {}

// done tells the daemon the step ended with code (the script's srun exits with it).
func (s *scriptSteps) done(key string, code int) {
	for attempt := range 20 {
		err := s.post("step-done", Dumps(Object{{"key", key}, {"code", code}}), 10*time.Second)
		if err == nil {
			return
		}
		if status := daemonStatus(err); status >= 400 && status < 500 {
			return
		}
		time.Sleep(reconnectDelay(attempt))
	}
}
