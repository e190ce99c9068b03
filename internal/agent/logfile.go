package agent

import (
	"os"
	"path/filepath"
	"sync"
)

// LogFileBytes is the size at which the daemon's log file is rotated: it
// keeps agent.log and agent.log.1, at most twice this on disk.
const LogFileBytes = 8 << 20

// LogFile is the daemon's own log in <dir>/logs/agent.log, besides its
// stderr (the journal under systemd): support bundles read it.
type LogFile struct {
	mu   sync.Mutex
	path string
	f    *os.File
	size int64
}

// OpenLog opens (appends to) the log file of dir.
func OpenLog(dir Dir) (*LogFile, error) {
	if err := os.MkdirAll(dir.path(DirLogs), 0o700); err != nil {
		return nil, err
	}
	l := &LogFile{path: filepath.Join(dir.path(DirLogs), "agent.log")}
	return l, l.open()
}

func (l *LogFile) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Write appends p, rotating first when the file is full. A failed write
// is dropped: the log on stderr goes on.
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return len(p), nil
	}
	if l.size+int64(len(p)) > LogFileBytes {
		_ = l.f.Close()
		_ = os.Rename(l.path, l.path+".1")
		if err := l.open(); err != nil {
			l.f = nil
			return len(p), nil
		}
	}
	n, _ := l.f.Write(p)
	l.size += int64(n)
	return len(p), nil
}

// Close closes the file.
func (l *LogFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
