// Package builtin lists the plug-ins compiled into this build of computed:
// provider adapters and bare-metal drivers. cmd/computed hands them to the
// host, and tests that assemble a host in the test process take the same
// lists (adding a test double of their own). Adding a plug-in is a line
// here (CONTRIBUTING.md); business packages never register anything
// themselves.
//
// The node daemon's runtimes are listed in cmd/compute-agent, which may not
// import this package: the agent side imports no server package.
package builtin

import (
	"computeplane/internal/drivers"
	"computeplane/internal/drivers/qemudriver"
	"computeplane/internal/drivers/redfish"
	"computeplane/internal/providers"
	"computeplane/internal/providers/ec2"
	"computeplane/internal/providers/localqemu"
)

// Plugins are the plug-ins a host is assembled with.
type Plugins struct {
	// Providers are the provider adapters built in; the providers option
	// chooses among them.
	Providers []*providers.Factory
	// Drivers open bare-metal hosts' management interfaces, by name.
	Drivers drivers.Registry
}

// All returns every plug-in of this build.
func All() Plugins {
	return Plugins{
		Providers: []*providers.Factory{ec2.Factory, localqemu.Factory},
		Drivers:   drivers.Registry{qemudriver.Name: qemudriver.Open, redfish.Name: redfish.Open},
	}
}
