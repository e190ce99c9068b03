package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sysCalls reads a process's read and write system calls: three writes
// and two reads of this process's own show.
func TestSysCallsCountsAProcesssReadsAndWrites(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	require.NoError(t, err)
	defer f.Close()
	before := sysCalls(os.Getpid())
	for range 3 {
		_, err = f.Write([]byte("x"))
		require.NoError(t, err)
	}
	for range 2 {
		_, err = f.ReadAt(make([]byte, 1), 0)
		require.NoError(t, err)
	}
	after := sysCalls(os.Getpid())
	assert.GreaterOrEqual(t, after[1]-before[1], int64(3), "writes")
	assert.GreaterOrEqual(t, after[0]-before[0], int64(2), "reads")
}
