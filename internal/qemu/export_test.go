package qemu

// MonitorConn is the VM's held QMP connection (nil when none is held),
// for tests that check that commands share it.
func MonitorConn(v *VM) any {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mon == nil {
		return nil
	}
	return v.mon
}

// BreakMonitor closes the held QMP connection under the VM, as a
// connection that broke would be: the VM still holds it.
func BreakMonitor(v *VM) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mon != nil {
		_ = v.mon.c.Close()
	}
}
