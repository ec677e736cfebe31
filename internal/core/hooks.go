package core

// hooks are the points where tests step into the manager's operations.
// Only test files set them (m.hooks.failpoint = ...); in production every
// hook is nil and each point costs one comparison.
type hooks struct {
	// failpoint is called at named steps of multi-step operations; a
	// non-nil error makes that step fail.
	failpoint func(step string) error
	// crash is called at named steps where a daemon that dies must leave
	// nothing the next one cannot finish; tests kill the process there.
	crash func(step string)
	// netnsInImages makes full checkpoints as molt made them before
	// external_net: CRIU runs in the daemon's network namespace and the
	// images carry the sandbox's.
	netnsInImages bool
	// lazyRead is called before a lazy resume's page server reads pages
	// for CRIU's lazy-pages daemon.
	lazyRead func()
}

// crashpoint marks a step at which tests kill the daemon (hooks.crash).
func (m *Manager) crashpoint(step string) {
	if m.hooks.crash != nil {
		m.hooks.crash(step)
	}
}

// fail returns the error a test injects at step (hooks.failpoint).
func (m *Manager) fail(step string) error {
	if m.hooks.failpoint != nil {
		return m.hooks.failpoint(step)
	}
	return nil
}
