package config

// Memory tunes the Go collector of an api process (cmd/computed
// processGC, internal/gctarget floor.go).
type Memory struct {
	// HeapFloor, in bytes, is the least heap the collector lets an api
	// process grow to before it collects: the target never puts the next
	// collection below it, however small the live heap. An api process
	// allocates with every call and keeps little, so with a percentage
	// alone it collects every second or so at load, and each collection's
	// mark phase is a stall of tens of milliseconds on a busy core: the
	// tail of an open-loop run (docs/benchmarks-notes.md). 0 turns the
	// floor off. The default is DefaultHeapFloorMiB on a process that
	// serves the api role without the gateway's, 0 elsewhere; set, it
	// applies to any process that serves the api role (like the other
	// api options, a worker or gateway-only process does not use it).
	// GOGC in the environment wins over it; GOMEMLIMIT caps the heap
	// below it.
	HeapFloor int64
}

// DefaultHeapFloorMiB is memory.heapFloorMiB's default on an api
// process: a collection every few seconds at the benchmark's peak,
// about 50 MB allocated a second at half load (docs/benchmarks.md).
const DefaultHeapFloorMiB = 256

// MaxHeapFloorMiB bounds memory.heapFloorMiB (64 GiB).
const MaxHeapFloorMiB = 65536

type fileMemory struct {
	HeapFloorMiB *int `yaml:"heapFloorMiB"`
}

// memory runs after roles: the floor's default depends on them.
func (b *builder) memory(fc *fileConfig, c *Config) error {
	fm := deref(fc.Memory, fileMemory{})
	if fm.HeapFloorMiB == nil {
		if c.HasRole(RoleAPI) && !c.HasRole(RoleGateway) {
			c.Memory.HeapFloor = DefaultHeapFloorMiB << 20
		}
		return nil
	}
	if *fm.HeapFloorMiB < 0 || *fm.HeapFloorMiB > MaxHeapFloorMiB {
		return b.errorf("memory.heapFloorMiB", "must be from 0 to %d", MaxHeapFloorMiB)
	}
	c.Memory.HeapFloor = int64(*fm.HeapFloorMiB) << 20
	return nil
}
