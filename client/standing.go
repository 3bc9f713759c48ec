package client

import "sync"

// standing is what a Subscription and a Follow share: the connection they
// ride on (nil between connections; after a reconnect they attach again)
// and how they end.
type standing struct {
	mu    sync.Mutex
	cn    *conn
	ended chan struct{} // closed by end, with err
	err   error
	left  chan struct{} // closed when Subscribe or Follow returns
}

func (s *standing) init() {
	s.ended, s.left = make(chan struct{}), make(chan struct{})
}

// detach forgets cn after it ended.
func (s *standing) detach(cn *conn) {
	s.mu.Lock()
	if s.cn == cn {
		s.cn = nil
	}
	s.mu.Unlock()
}

// current reports whether it rides on cn, and cn is alive.
func (s *standing) current(cn *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cn == cn && cn.alive()
}

// end ends it with err; the first call wins.
func (s *standing) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.ended:
	default:
		s.err = err
		close(s.ended)
	}
}

// leaving marks it left and returns the connection it rode on, when that
// is still alive (nil otherwise).
func (s *standing) leaving() *conn {
	close(s.left)
	s.mu.Lock()
	cn := s.cn
	s.cn = nil
	s.mu.Unlock()
	if cn == nil || !cn.alive() {
		return nil
	}
	return cn
}

// tellLeft removes v, a Subscription or a Follow that left, from the
// table of cn, the connection it rode on (theirs gives it), and tells the
// server: {"type": typ, key: the id the server knew it by}. A nil cn (no
// live connection) or no id: nothing.
func tellLeft[T comparable](cn *conn, theirs func(*conn) map[string]T, v T, typ, key string) {
	if cn == nil {
		return
	}
	if id := dropFrom(cn, theirs(cn), v); id != "" {
		_ = cn.send(map[string]any{"type": typ, key: id}, nil)
	}
}

// dropFrom removes v from one of cn's tables and returns the id the
// server knew it by ("" when it had none).
func dropFrom[T comparable](cn *conn, table map[string]T, v T) string {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	var id string
	for k, w := range table {
		if w == v {
			id = k
			delete(table, k)
		}
	}
	return id
}
