package volume

// RegisteredAs returns the ID under which the plugin volume externalID of
// plugin is registered here, or "" when it is not. It reads the manager's
// index and never blocks on a volume actor.
func (m *Manager) RegisteredAs(plugin, externalID string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byExt[extKey{plugin, externalID}]
}
