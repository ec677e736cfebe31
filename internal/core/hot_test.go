package core

// waitHot waits for the standby waiters and spare refills in flight
// (and the preparations they wait for).
func (m *Manager) waitHot() {
	m.sby.Wait()
	m.spr.Wait()
}
