// Command compute-guest is the agent inside every virtual machine: init of
// the minimal guest image, or a service beside another init. See
// internal/guest.
package main

import (
	"os"

	"computeplane/internal/guest"
)

func main() { os.Exit(guest.Main()) }
